"""The payoff path for any engine the engines layer knows: which engine a /metrics page is, a
stream's own counts as each engine sends them, decode steps from accepted drafts (llama.cpp
states no steps), the geometric per-position profile of a route whose engine mixes every
route's positions, and a llama.cpp route's load-aware speedups and per-k options."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from exporter.accounting.ledger import Accounting, RequestOutcome
from exporter.config import ModelConfig, StepTimePoint, Target
from exporter.core.counts import Counts
from exporter.core.payoff import decode_steps, geometric_positions
from exporter.core.windows import Window
from exporter.engines import engine, recognise
from exporter.export.route_collector import RouteCollector
from exporter.measure.level import Level, Phase
from exporter.measure.runner import Request, ScenarioResult
from exporter.measure.scenarios import Scenario
from exporter.measure.stream_client import Result
from exporter.scrape.target import TargetState

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def events(name: str) -> list[dict[str, object]]:
    """The events of a recorded stream that carry no content (what measure keeps)."""
    found = []
    for line in (FIXTURES / name).read_text(encoding="utf-8").splitlines():
        if not line.startswith("data: {"):
            continue
        event = json.loads(line[6:])
        if not any((c.get("delta") or {}).get("content") for c in event.get("choices") or ()):
            found.append(event)
    return found


@pytest.mark.parametrize(
    ("fixture", "kind"),
    [
        ("real-vllm-0.32-cpu.prom", "vllm"),
        ("real-llamacpp.prom", "llamacpp"),
        ("vllm-0.33-4engine-k5.prom", "vllm"),
    ],
)
def test_an_engine_is_recognised_from_its_page(fixture: str, kind: str) -> None:
    found = recognise((FIXTURES / fixture).read_text(encoding="utf-8"))
    assert found is not None and found.kind == kind


def test_a_plain_servers_page_is_recognised_by_its_prefix_and_garbage_is_not() -> None:
    plain = "# TYPE llamacpp:requests_processing gauge\nllamacpp:requests_processing 0\n"
    assert recognise(plain) is engine("llamacpp")
    assert recognise("up 1\n# vllm: a comment\n") is None
    assert recognise("vllm:x 1\nllamacpp:y 1\n") is None  # two engines: not told


def test_llamacpps_stream_counts_are_its_timings_without_steps() -> None:
    found = engine("llamacpp").stream_counts(events("real-llamacpp-sse-chat-usage.txt"))
    stream = events("real-llamacpp-sse-chat-usage.txt")
    timings = next(e["timings"] for e in stream if "timings" in e)
    assert found == Counts(None, float(timings["draft_n"]), float(timings["draft_n_accepted"]))
    assert engine("llamacpp").stream_counts([]) is None


def test_vllms_stream_counts_are_its_object_on_the_usage_event() -> None:
    found = engine("vllm").stream_counts(events("real-vllm-sse-chat.txt"))
    assert found is not None and found.drafts and found.per_position
    assert engine("vllm").stream_counts(events("real-llamacpp-sse-chat-usage.txt")) is None


def test_decode_steps_are_tokens_less_accepted_drafts() -> None:
    # measured on a real CPU llama-server, c = 1: sum(predicted_n - 1 - draft_n_accepted) was
    # its n_decode_total delta less one prefill call per request; its verify steps 2 fewer
    assert decode_steps(39, 26) == 13
    assert decode_steps(10, 4, verify_steps=7) == 7  # a stop string cut the last step short
    assert decode_steps(5, 0) == 5  # no drafts: every step plain


def test_the_geometric_profile_matches_the_routes_acceptance() -> None:
    for acceptance, k in ((0.36, 3), (0.71, 3), (0.5, 5)):
        p = geometric_positions(acceptance, k)
        assert sum(p) / k == pytest.approx(acceptance, abs=1e-9)
        assert all(a > b for a, b in itertools.pairwise(p))
    # the bench's synthetic routes (0.60/0.30/0.18 and 0.85/0.70/0.58): E(k') within 2 %
    for rates in ((0.60, 0.30, 0.18), (0.85, 0.70, 0.58)):
        p = geometric_positions(sum(rates) / 3, 3)
        for j in range(1, 4):
            assert 1 + sum(p[:j]) == pytest.approx(1 + sum(rates[:j]), rel=0.02)
    assert geometric_positions(0.0, 2) == pytest.approx((0.0, 0.0), abs=1e-9)
    assert geometric_positions(1.0, 2) == pytest.approx((1.0, 1.0), abs=1e-9)


MODEL = "bench"
WINDOW = Window("20s", 20.0)
CURVE = (StepTimePoint(1.0, 0.0047, 0.0087), StepTimePoint(16.0, 0.0081, 0.031))


def llamacpp_page(drafts: int, positions: tuple[int, int, int]) -> str:
    """A llama-server page (its names, no model_name), one request running."""
    lines = [
        f"llamacpp:spec_decode_num_drafts_total {drafts}",
        f"llamacpp:spec_decode_num_draft_tokens_total {3 * drafts}",
        f"llamacpp:spec_decode_num_accepted_tokens_total {sum(positions)}",
        "llamacpp:requests_processing 1",
    ]
    lines += [
        f'llamacpp:spec_decode_num_accepted_tokens_per_pos_total{{position="{i}"}} {n}'
        for i, n in enumerate(positions)
    ]
    return "\n".join(lines) + "\n"


def llamacpp_route(
    acc: Accounting, route: str, n: int, accepted: int, drafted: int, seconds: float
) -> None:
    """n streamed llama.cpp requests of 100 tokens: their timings' accepted and drafted."""
    for _ in range(n):
        acc.record(
            RequestOutcome(
                route,
                MODEL,
                "200",
                100,
                decode_seconds=seconds,
                drafted=(drafted, accepted),
                increments=(1,) * 100,
            )
        )


def test_a_llamacpp_route_gets_load_aware_speedups_and_options_per_k() -> None:
    model = ModelConfig(MODEL, 3, 1.85, step_time=CURVE)
    acc = Accounting(("voice", "agent"), (WINDOW,), {MODEL: model})
    # the page names no model: the config's one model is the target's (sidecar wiring)
    state = TargetState(Target("llama", "http://x/metrics", kind="llamacpp"), (WINDOW,), MODEL)
    state.ingest(llamacpp_page(0, (0, 0, 0)), 0.0)
    acc.tick(0.0)
    # every decode step a verify step of 3 drafts, 0.5 / 48 s each (one batch): voice 48
    # steps, 51 accepted (0.354); agent 32 steps, 67 accepted (0.698): 99 decode tokens each
    step = 0.5 / 48
    llamacpp_route(acc, "voice", 4, 51, 144, 48 * step)
    llamacpp_route(acc, "agent", 4, 67, 96, 32 * step)
    # the server's counters: both routes' steps (4 x 48 + 4 x 32) and tokens, its positions
    state.ingest(llamacpp_page(320, (220, 150, 100)), 20.0)
    acc.apportion(state.work_by_model())
    acc.tick(20.0)
    assert acc.decode[("voice", MODEL, "exact")].steps == 4 * 48
    registry = CollectorRegistry()
    registry.register(RouteCollector(acc, {MODEL: model}, state, engine("llamacpp"), lambda: 20.0))
    found = {
        (s.name, s.labels.get("route"), s.labels.get("draft_length")): s.value
        for f in text_string_to_metric_families(generate_latest(registry).decode())
        for s in f.samples
    }
    for route, steps in (("voice", 48), ("agent", 32)):
        # tokens per decode step / the cost of a step of 3 drafts (every route's steps drafted
        # 960 tokens in 320 steps) at batch 1
        estimated = found[("specdec_route_estimated_speedup_ratio", route, None)]
        assert estimated == pytest.approx((99 / steps) / (0.0087 / 0.0047))
        assert found[("specdec_route_speedup_ratio", route, None)] == pytest.approx(estimated)
        options = [
            found.get(("specdec_route_speedup_at_draft_length_ratio", route, str(k)))
            for k in range(4)
        ]
        assert None not in options and options[0] == 1.0
        # k = 3 is the observed step and every step drafted 3: its option is the speedup
        assert options[3] == pytest.approx(estimated)
    # the profiles differ by route (the engine's positions would give both the same)
    voice, agent = (
        found[("specdec_route_speedup_at_draft_length_ratio", r, "1")] for r in ("voice", "agent")
    )
    assert agent > voice


def test_a_llamacpp_load_generator_keeps_each_worker_in_its_own_slot() -> None:
    # a KV stream per slot cuts a batch at each gap between busy slots: workers pinned to
    # slots 0..c-1 make one run of them (docs/BENCHMARKS.md §11, runs 5-10)
    assert engine("llamacpp").worker_fields(3) == {"id_slot": 3}
    assert engine("vllm").worker_fields(3) == {}


def test_a_shorter_draft_phase_that_drafted_more_gives_no_point() -> None:
    """A build that ignores the per-request draft length drafts k: its phase gives no step at
    the shorter length, and measure keeps no point rather than a wrong one."""
    steady = Request(Result(0.01, 1.0, 101, "length"), Counts(100, 300, 150))
    ran = Phase([ScenarioResult("s", [steady])], counted=Counts(100, 300, 150))
    level = Level(1, drafting={1: ran})
    assert level.draft_seconds() == {}
    ran.counted = Counts(100, 100, 50)
    ran.results[0].requests[0] = Request(Result(0.01, 1.0, 151, "length"), Counts(100, 100, 50))
    assert level.draft_seconds() == {1: pytest.approx(1.0 / 100)}  # 150 tokens in 100 steps
    two = Request(Result(0.01, 1.0, 181, "length"), Counts(100, 200, 80))
    level.drafting[2] = Phase([ScenarioResult("s", [two])], counted=Counts(100, 200, 80))
    assert level.draft_seconds() == {1: pytest.approx(0.01), 2: pytest.approx(0.01)}


HONOURED = [("spec", 3), ("spec", 1), ("spec", 2), ("plain", 3)] * 2  # 1 and k - 1, each level
IGNORED = [("spec", 3), ("spec", 1), ("plain", 3), ("spec", 3), ("plain", 3)]  # asked once


@pytest.mark.parametrize(("honours", "asked"), [(True, HONOURED), (False, IGNORED)])
def test_measure_asks_shorter_drafts_only_of_an_engine_that_honours_them(
    monkeypatch: pytest.MonkeyPatch, honours: bool, asked: list[tuple[str, int]]
) -> None:
    """The phases at 1 and k - 1 drafts cost measure time: a build that drafts k whatever a
    request says (CI's unpatched llama-server, tests/integration/test_real_llamacpp.py) is
    asked at the first level, then no more."""
    import asyncio

    from exporter.measure import curve
    from exporter.measure.runner import Plan

    seen: list[tuple[str, int]] = []
    labels: list[str] = []  # each phase's progress lines name its level and side, once

    async def phase(session, base_url, model, scenarios, runs, plan, phase, label):  # type: ignore[no-untyped-def]
        length = dict(scenarios[0].extra_body).get("speculative.n_max", 3)
        seen.append((base_url, length))
        labels.append(label)
        made = length if honours else 3
        phase.counted = Counts(100, 100 * made, 50, (30.0, 15.0, 5.0))
        phase.results.append(
            ScenarioResult("s", [Request(Result(0.01, 1.0, 151, "length"), phase.counted)])
        )

    async def name(session, base_url):  # type: ignore[no-untyped-def]
        return "m"

    monkeypatch.setattr(curve, "_phase", phase)
    monkeypatch.setattr(curve, "model_name", name)
    scenarios = [Scenario("s", 8, None, ("hi",))]
    levels: list[Level] = []
    plan = Plan(engine=engine("llamacpp"))
    asyncio.run(curve.measure_curve("spec", "plain", scenarios, None, [1, 2], plan, levels, 0, 1))
    assert seen == asked
    assert len(set(labels)) == len(labels) and {"c=1 plain", "c=2 speculative"} <= set(labels)
    assert [sorted(x.draft_seconds()) for x in levels] == ([[1, 2]] * 2 if honours else [[], []])
