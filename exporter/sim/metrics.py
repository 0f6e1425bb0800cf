"""The simulator's /metrics: vLLM's own family names, HELP texts, types, labels and buckets,
rendered by prometheus_client exactly as vLLM renders them (it uses the same library)."""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

# fmt: off
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
               10.0, 20.0, 40.0, 80.0)
# fmt: on
FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")
LABELS = ("model_name", "engine")


class EngineMetrics:
    """One engine life's metrics: a restart builds a new one (counters at 0, new `_created`)."""

    def __init__(self, model: str, ranks: int, draft_length: int, spec: bool) -> None:
        self.registry = CollectorRegistry()
        self.started = time.time()
        self.model = model
        # what other engines count and vLLM does not (pages.py renders them)
        self.drafted_per_position: dict[int, int] = {}  # TensorRT-LLM's drafted tokens
        self.last_step: tuple[int, int] = (0, 0)  # SGLang's gauges: (accepted, drafted)

        def counter(name: str, doc: str, *extra: str) -> Counter:
            return Counter(f"vllm:{name}", doc, [*LABELS, *extra], registry=self.registry)

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(f"vllm:{name}", doc, LABELS, buckets=buckets, registry=self.registry)

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(f"vllm:{name}", doc, LABELS, registry=self.registry)

        self.spec_counters: tuple[Counter, Counter, Counter, Counter] | None = None
        if spec:  # vLLM registers these only with --speculative-config
            self.spec_counters = (
                counter("spec_decode_num_drafts", "Number of spec decoding drafts."),
                counter("spec_decode_num_draft_tokens", "Number of draft tokens."),
                counter("spec_decode_num_accepted_tokens", "Number of accepted tokens."),
                counter(
                    "spec_decode_num_accepted_tokens_per_pos",
                    "Accepted tokens per draft position.",
                    "position",
                ),
            )
        self.prompt_tokens = counter("prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = counter(
            "generation_tokens", "Number of generation tokens processed."
        )
        self.success = counter(
            "request_success", "Count of successfully processed requests.", "finished_reason"
        )
        self.ttft = histogram(
            "time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            TTFT_BUCKETS,
        )
        self.itl = histogram(
            "inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            ITL_BUCKETS,
        )
        self.running = gauge(
            "num_requests_running", "Number of requests in model execution batches."
        )
        self.waiting = gauge("num_requests_waiting", "Number of requests waiting to be processed.")
        for rank in map(str, range(ranks)):  # vLLM creates every child up front
            for metric in (
                self.prompt_tokens,
                self.generation_tokens,
                self.ttft,
                self.itl,
                self.running,
                self.waiting,
                *(self.spec_counters or ())[:3],
            ):
                metric.labels(model, rank)
            if self.spec_counters is not None:
                for pos in range(draft_length):
                    self.spec_counters[3].labels(model, rank, str(pos))
            for reason in FINISH_REASONS:
                self.success.labels(model, rank, reason)
