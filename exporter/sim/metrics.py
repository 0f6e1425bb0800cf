"""The simulator's /metrics: vLLM's own family names, HELP texts, types, labels and buckets,
rendered by prometheus_client exactly as vLLM renders them (it uses the same library)."""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
ITL_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)
FINISH_REASONS = ("stop", "length", "abort", "error", "repetition")
LABELS = ["model_name", "engine"]


class EngineMetrics:
    """One engine life's metrics: a restart builds a new one (counters at 0, new `_created`)."""

    def __init__(self, model: str, engines: int, k: int, spec: bool) -> None:
        self.registry = CollectorRegistry()
        self.started = time.time()
        r = self.registry
        self.drafts = self.draft_tokens = self.accepted = self.per_pos = None
        if spec:  # vLLM registers these only with --speculative-config
            self.drafts = Counter(
                "vllm:spec_decode_num_drafts", "Number of spec decoding drafts.", LABELS, registry=r
            )
            self.draft_tokens = Counter(
                "vllm:spec_decode_num_draft_tokens", "Number of draft tokens.", LABELS, registry=r
            )
            self.accepted = Counter(
                "vllm:spec_decode_num_accepted_tokens",
                "Number of accepted tokens.",
                LABELS,
                registry=r,
            )
            self.per_pos = Counter(
                "vllm:spec_decode_num_accepted_tokens_per_pos",
                "Accepted tokens per draft position.",
                [*LABELS, "position"],
                registry=r,
            )
        self.prompt_tokens = Counter(
            "vllm:prompt_tokens", "Number of prefill tokens processed.", LABELS, registry=r
        )
        self.generation_tokens = Counter(
            "vllm:generation_tokens", "Number of generation tokens processed.", LABELS, registry=r
        )
        self.success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            [*LABELS, "finished_reason"],
            registry=r,
        )
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            LABELS,
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            LABELS,
            buckets=ITL_BUCKETS,
            registry=r,
        )
        self.running = Gauge(
            "vllm:num_requests_running",
            "Number of requests in model execution batches.",
            LABELS,
            registry=r,
        )
        self.waiting = Gauge(
            "vllm:num_requests_waiting",
            "Number of requests waiting to be processed.",
            LABELS,
            registry=r,
        )
        for engine in map(str, range(engines)):  # vLLM creates every child up front
            for metric in (
                self.drafts,
                self.draft_tokens,
                self.accepted,
                self.prompt_tokens,
                self.generation_tokens,
                self.ttft,
                self.itl,
                self.running,
                self.waiting,
            ):
                if metric is not None:
                    metric.labels(model, engine)
            for pos in range(k if self.per_pos is not None else 0):
                assert self.per_pos is not None
                self.per_pos.labels(model, engine, str(pos))
            for reason in FINISH_REASONS:
                self.success.labels(model, engine, reason)
