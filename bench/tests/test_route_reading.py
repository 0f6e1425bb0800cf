"""One home per reading: the sidecar's gauges (its collectors), `specdec advise` reading them and
the bench's reading of the same counters off the sidecar's pages (`bench.gpu.rejudge`) are the
same figures, since all go through `exporter.core.reading.read_route`."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from bench.gpu import product, rejudge
from exporter.accounting.ledger import Accounting, RequestOutcome
from exporter.cli import advise
from exporter.config import ModelConfig, StepTimePoint, Target
from exporter.core.counts import Counts
from exporter.core.slices import slices
from exporter.core.windows import Window
from exporter.engines import engine
from exporter.export.model_collector import ModelCollector
from exporter.export.request_collector import RequestCollector
from exporter.export.route_collector import RouteCollector
from exporter.export.target_collector import TargetCollector
from exporter.scrape.target import TargetState

MODEL = "m"
WINDOW = Window("20s", 20.0)
CURVE = (
    StepTimePoint(1.0, 0.0047, 0.0087, context_tokens=300, plain_seconds_per_context_token=1e-7,
                  verify_seconds_per_context_token=2e-7),
    StepTimePoint(8.0, 0.0081, 0.0180, context_tokens=300, plain_seconds_per_context_token=4e-7,
                  verify_seconds_per_context_token=9e-7),
)  # fmt: skip


def vllm_page(drafts: int, running: int) -> str:
    return (
        f'vllm:spec_decode_num_drafts_total{{engine="0",model_name="{MODEL}"}} {drafts}\n'
        f'vllm:spec_decode_num_draft_tokens_total{{engine="0",model_name="{MODEL}"}} {3 * drafts}\n'
        f'vllm:spec_decode_num_accepted_tokens_total{{engine="0",model_name="{MODEL}"}} {drafts}\n'
        f'vllm:num_requests_running{{engine="0",model_name="{MODEL}"}} {running}\n'
    )


def text(registry: CollectorRegistry) -> str:
    return generate_latest(registry).decode()


def test_the_collectors_advise_and_the_bench_read_the_same_counters_alike() -> None:
    model = ModelConfig(MODEL, 3, 1.85, step_time=CURVE)
    acc = Accounting(("voice", "agent"), (WINDOW,), {MODEL: model})
    state = TargetState(Target("vllm", "http://x/metrics"), (WINDOW,), "")
    now = [0.0]
    registry = CollectorRegistry()
    for collector in (
        RouteCollector(acc, {MODEL: model}, state, engine("vllm"), lambda: now[0]),
        RequestCollector(acc, lambda: now[0]),
        TargetCollector((state,), lambda: now[0], {MODEL: model}),
        ModelCollector({MODEL: model}),
    ):
        registry.register(collector)
    state.ingest(vllm_page(0, 5), 0.0)
    acc.tick(0.0)
    before = product.parse(text(registry))
    for i in range(24):  # both routes, unequal requests: a spread to build an interval on
        route, accepted = ("voice", 20 + i % 7) if i % 2 else ("agent", 45 + i % 5)
        tokens = 1 + 30 + accepted  # the prefill's, then 30 verify steps' (every step drafts)
        acc.record(
            RequestOutcome(
                route, MODEL, "200", tokens, prompt_tokens=250 + 10 * i, decode_seconds=1.5,
                exact=Counts(30, 90, accepted, (min(accepted, 30), accepted // 3, accepted // 5)),
                increments=(1,) * tokens, slices=slices(("greedy", "text"), 250),
            )
        )  # fmt: skip
    for t in (5.0, 10.0, 15.0, 20.0):
        state.ingest(vllm_page(int(t * 40), 5), t)
    now[0] = 20.0
    acc.tick(20.0)
    shown = text(registry)
    after = product.parse(shown)
    advice, problem = advise.advise(advise.parse(shown), WINDOW.label)
    assert problem is None, problem
    advised = {r["route"]: r for r in advice["routes"]}
    curve = model.curve
    assert curve is not None
    names: list[int | None] = []
    for route in ("voice", "agent"):
        key = {"route": route, "model_name": MODEL, "window": WINDOW.label}
        payoff, by_length, said = rejudge.reading(after, before, route, curve, own_positions=True)
        gauges = {
            int(lb["draft_length"]): v
            for lb, v in after["specdec_route_speedup_at_draft_length_ratio"]
            if all(lb.get(k) == v for k, v in key.items())
        }
        estimated = product.one(after, "specdec_route_estimated_speedup_ratio", **key)
        measured = product.one(after, "specdec_route_speedup_ratio", **key)
        best = product.one(after, "specdec_route_best_draft_length", **key)
        assert estimated is not None and payoff.estimated == pytest.approx(estimated, rel=1e-9)
        assert measured is not None and payoff.measured == pytest.approx(measured, rel=1e-9)
        assert by_length == pytest.approx(gauges, rel=1e-9) and len(gauges) == 4
        named = said if isinstance(said, int) else None  # a pair: within its error, none shown
        assert (None if best is None else int(best)) == named, (route, said, best)
        names.append(named)
        told = advised[route]  # advise formats the gauges it reads, nothing recomputed
        assert told["speedup_estimated"] == pytest.approx(payoff.estimated, rel=1e-9)
        assert told["speedup_measured"] == pytest.approx(payoff.measured, rel=1e-9)
        assert {k: v for k, (v, _) in told["by_draft_length"].items()} == pytest.approx(by_length)
        assert told["best_draft_length"] == named
    assert None in names and any(n is not None for n in names), names  # both cases compared
