"""The simulator's metrics page as each engine renders it, from the one decoder's counters.

vLLM's page is its own prometheus_client registry (metrics.py). The others are rebuilt from
the same values on every scrape under the engine's names, labels and format, as recorded in
tests/fixtures/real-llamacpp.prom (a real llama-server), SGLang's collector.py and
TensorRT-LLM's collector.py (tensorrt_llm/metrics/collector.py; docs/metrics.md maps them):

- llama.cpp: `llamacpp:*`, no labels but `position`, one server (the engines are summed),
  `# HELP`/`# TYPE` written by hand as llama-server writes them;
- SGLang: `sglang:spec_verify_calls_total` and `sglang:generation_tokens_total` (counters),
  `sglang:spec_accept_length` / `sglang:spec_accept_rate` (gauges of the last step);
- TensorRT-LLM: `trtllm_spec_decode_*` token counters, the per-position drafted and accepted
  counters (`token_position`; a position's series once it was drafted, as its collector.py
  counts per request), `trtllm_request_success_total{finished_reason}`,
  `trtllm_num_requests_completed_total`, the acceptance-length gauge; labels `model_name`,
  `engine_type`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import generate_latest

from exporter.sim.metrics import EngineMetrics

Values = dict[str, dict[tuple[tuple[str, str], ...], float]]  # sample name -> labels -> value


def render(kind: str, metrics: EngineMetrics) -> bytes:
    """The page engine `kind` would serve for these counters."""
    if kind == "vllm":
        return generate_latest(metrics.registry)
    values = _values(metrics.registry)
    if kind == "llamacpp":
        return _llamacpp(values, metrics).encode()
    registry = CollectorRegistry(auto_describe=False)
    build = _sglang if kind == "sglang" else _trtllm
    registry.register(_Families(list(build(values, metrics))))
    return generate_latest(registry)


class _Families:
    """A collector of ready-made families (prometheus_client's custom-collector protocol)."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        yield from self.families


def _values(registry: CollectorRegistry) -> Values:
    out: Values = defaultdict(dict)
    for family in registry.collect():
        for sample in family.samples:
            out[sample.name][tuple(sorted(sample.labels.items()))] = sample.value
    return out


def _by(values: Values, name: str, *keep: str) -> dict[tuple[str, ...], float]:
    """vLLM's sample `name` summed over every label but `keep`."""
    out: dict[tuple[str, ...], float] = defaultdict(float)
    for labels, value in values.get(name, {}).items():
        got = dict(labels)
        out[tuple(got.get(k, "") for k in keep)] += value
    return out


def _spec(name: str) -> str:
    return f"vllm:spec_decode_num_{name}_total"


# ---------------------------------------------------------------- llama.cpp

_LLAMACPP_HELP = {  # as llama-server words them (tests/fixtures/real-llamacpp.prom)
    "prompt_tokens_total": "Number of prompt tokens processed, excluding cached tokens",
    "tokens_predicted_total": "Number of generation tokens processed",
    "spec_decode_num_draft_tokens_total": "Speculative: Total draft tokens generated",
    "spec_decode_num_accepted_tokens_total": "Speculative: Total draft tokens accepted by the "
    "target model",
    "spec_decode_num_drafts_total": "Speculative: Total speculative decoding verification steps",
    "requests_processing": "Number of requests processing",
    "spec_decode_num_accepted_tokens_per_pos_total": "Accepted tokens per draft position",
}


def _llamacpp(values: Values, metrics: EngineMetrics) -> str:
    lines: list[str] = []

    def family(name: str, kind: str, samples: Iterable[tuple[str, float]]) -> None:
        lines.append(f"# HELP llamacpp:{name} {_LLAMACPP_HELP[name]}")
        lines.append(f"# TYPE llamacpp:{name} {kind}")
        lines.extend(f"llamacpp:{name}{labels} {_number(v)}" for labels, v in samples)

    def one(vllm_name: str) -> list[tuple[str, float]]:
        return [("", sum(_by(values, vllm_name).values()))]

    family("prompt_tokens_total", "counter", one("vllm:prompt_tokens_total"))
    family("tokens_predicted_total", "counter", one("vllm:generation_tokens_total"))
    if metrics.spec_counters is not None:
        family("spec_decode_num_draft_tokens_total", "counter", one(_spec("draft_tokens")))
        family("spec_decode_num_accepted_tokens_total", "counter", one(_spec("accepted_tokens")))
        family("spec_decode_num_drafts_total", "counter", one(_spec("drafts")))
    family("requests_processing", "gauge", one("vllm:num_requests_running"))
    if metrics.spec_counters is not None:
        per_pos = _by(values, _spec("accepted_tokens_per_pos"), "position")
        family(
            "spec_decode_num_accepted_tokens_per_pos_total",
            "counter",
            ((f'{{position="{p}"}}', v) for (p,), v in sorted(per_pos.items(), key=_position)),
        )
    return "\n".join(lines) + "\n"


def _position(item: tuple[tuple[str, ...], float]) -> int:
    return int(item[0][0])


def _number(value: float) -> str:
    return str(int(value)) if value == int(value) else f"{value:g}"


# ---------------------------------------------------------------- SGLang


def _sglang(values: Values, metrics: EngineMetrics) -> Iterator[Metric]:
    """SGLang 0.5.18+: generation tokens split by `is_streaming` (the sidecar sums them), the
    verify calls under the tokenizer's labels, the gauges under the scheduler's."""
    tokens = CounterMetricFamily(
        "sglang:generation_tokens",
        "Number of generation tokens processed.",
        labels=["model_name", "is_streaming"],
    )
    for (model,), v in _by(values, "vllm:generation_tokens_total", "model_name").items():
        half = float(int(v) // 2)  # a split, each side monotonic: only the sum means anything
        tokens.add_metric([model, "true"], v - half, created=metrics.started)
        tokens.add_metric([model, "false"], half, created=metrics.started)
    yield tokens
    if metrics.spec_counters is None:
        return
    verify = CounterMetricFamily(
        "sglang:spec_verify_calls",
        "The number of speculative decoding verification calls.",
        labels=["model_name"],
    )
    for (model,), v in _by(values, _spec("drafts"), "model_name").items():
        verify.add_metric([model], v, created=metrics.started)
    yield verify
    scheduler = ["model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank"]
    accepted, drafted = metrics.last_step
    for name, doc, value in (
        (
            "spec_accept_length",
            "The average acceptance length of speculative decoding.",
            accepted + 1.0 if drafted else 0.0,
        ),
        (
            "spec_accept_rate",
            "The average acceptance rate of speculative decoding.",
            accepted / drafted if drafted else 0.0,
        ),
    ):
        gauge = GaugeMetricFamily(f"sglang:{name}", doc, labels=scheduler)
        gauge.add_metric([metrics.model, "unified", "0", "0", "0"], value)
        yield gauge


# ---------------------------------------------------------------- TensorRT-LLM


def _trtllm(values: Values, metrics: EngineMetrics) -> Iterator[Metric]:
    labels = ["model_name", "engine_type"]
    key = [metrics.model, "pytorch"]
    success = CounterMetricFamily(
        "trtllm_request_success",
        "Count of successfully processed requests.",
        labels=[*labels, "finished_reason"],
    )
    for (reason,), v in _by(values, "vllm:request_success_total", "finished_reason").items():
        success.add_metric([*key, reason], v)
    yield success
    done = CounterMetricFamily(
        "trtllm_num_requests_completed", "Total completed requests", labels=labels
    )
    done.add_metric(key, sum(_by(values, "vllm:request_success_total").values()))
    yield done
    if metrics.spec_counters is None:
        return
    for name, vllm_name, doc in (
        ("num_draft_tokens", "draft_tokens", "Total draft tokens proposed"),
        ("num_accepted_tokens", "accepted_tokens", "Total draft tokens accepted"),
    ):
        family = CounterMetricFamily(f"trtllm_spec_decode_{name}", doc, labels=labels)
        family.add_metric(key, sum(_by(values, _spec(vllm_name)).values()))
        yield family
    drafted = CounterMetricFamily(
        "trtllm_spec_decode_drafted_tokens",
        "Total drafted tokens per speculative decoding position.",
        labels=[*labels, "token_position"],
    )
    for place, count in sorted(metrics.drafted_per_position.items()):
        drafted.add_metric([*key, str(place)], count)
    yield drafted
    accepted = CounterMetricFamily(
        "trtllm_spec_decode_accepted_tokens",
        "Total accepted tokens per speculative decoding position.",
        labels=[*labels, "token_position"],
    )
    per_pos = _by(values, _spec("accepted_tokens_per_pos"), "position")
    for (position,), v in sorted(per_pos.items(), key=_position):
        if v > 0:  # a position's series appears once a token there was accepted
            accepted.add_metric([*key, position], v)
    yield accepted
    steps = sum(_by(values, _spec("drafts")).values())
    taken = sum(_by(values, _spec("accepted_tokens")).values())
    length = GaugeMetricFamily(
        "trtllm_spec_decode_acceptance_length", "Avg acceptance length", labels=labels
    )
    length.add_metric(key, 1.0 + taken / steps if steps else 0.0)
    yield length
