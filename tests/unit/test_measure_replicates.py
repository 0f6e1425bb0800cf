"""A level's speculative and plain phases are replicated, round-robin over the levels, and once
more where no two agree: one phase in a start of a real engine can run far off the others at the
same batch and context, which the spread inside its own window does not show (a GPU
llama-server's plain step at c = 32 read 24.3 then 30.0 ms in one start; docs/BENCHMARKS.md
§11). A disturbance only ever adds time, so a side's figure is its fastest replicates (those
within TIE of the fastest), a slower one named and never averaged in, and its error over the
run (`*_spread`) reaches the farthest replicate."""

from __future__ import annotations

import asyncio
import itertools
import random
import statistics
from typing import Any

import pytest

from exporter.core.counts import Counts
from exporter.engines import engine
from exporter.measure import curve
from exporter.measure.level import Level
from exporter.measure.runner import Plan, Request, ScenarioResult
from exporter.measure.scenarios import Scenario
from exporter.measure.steps import AGREE, TIE, agree, fastest, spread
from exporter.measure.stream_client import Result


@pytest.mark.parametrize(
    ("figures", "kept"),
    [
        ([1.0], [0]),
        ([1.0, 1.3], [0]),  # the slower one left out (a third is run: they do not agree)
        ([1.0, 1.3, 1.02], [0, 2]),  # wherever it ran
        ([1.3, 1.0, 1.02], [1, 2]),
        ([1.0, 1.02, 1.04], [0, 1]),  # within TIE of the fastest, not of each other
        ([1.0, None, 1.01], [0, 2]),  # a replicate without a figure has nothing to pool
        ([1.08, 1.07, 1.0], [2]),  # two in a slow mode agree: still left out (run b, c = 16)
    ],
)
def test_the_fastest_and_those_near_it_are_kept(
    figures: list[float | None], kept: list[int]
) -> None:
    assert fastest(figures) == kept


def test_the_spread_reaches_every_replicate_kept_or_not() -> None:
    assert spread(1.0, [1.0, 1.01, 1.08], 0.005) == pytest.approx(0.08)
    assert spread(1.0, [1.0, 1.001], 0.01) == pytest.approx(0.02)  # at least 2 standard errors
    assert spread(1.0, [1.0], None) is None


def _replicates(rng: random.Random, n: int, noise: float, hit: float) -> list[float]:
    """n replicates of a step of 1.0 as measure runs them: Gaussian noise within a phase, and
    with probability `hit` a disturbance that adds time, heavy-tailed (Pareto, alpha 1.5:
    mostly a few %, at times 30 %+; replicates a round apart meet them independently), and
    one replicate more where no two agree within AGREE."""

    def one() -> float:
        slow = min(0.02 * rng.paretovariate(1.5), 1.0) if rng.random() < hit else 0.0
        return (1.0 + rng.gauss(0.0, noise)) * (1.0 + slow)

    out = [one() for _ in range(n)]
    if n > 1 and not agree(list(out)):
        out.append(one())
    return out


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize(("n", "noise"), [(2, 0.005), (3, 0.01), (3, 0.02), (4, 0.01)])
def test_the_fastest_cluster_is_right_when_disturbances_only_add_time(
    seed: int, n: int, noise: float
) -> None:
    """Over many simulated levels, with a phase's noise as the GPU's (0.5-2 %) and one phase in
    three disturbed: the fastest cluster's 95th-percentile error stays within TIE and 2.5
    noise widths (both of two replicates disturbed alike is what is left: 1 in 9), and is
    smaller than the mean's and the closest-two rule's, which a slow mode
    holding two replicates carries into the figure."""
    rng = random.Random(1000 * seed + 10 * n + int(noise * 1000))

    def closest_two(figures: list[float]) -> float:
        pairs = sorted(figures)
        if len(pairs) < 3:
            return statistics.fmean(pairs)
        a, b = min(itertools.pairwise(pairs), key=lambda ab: ab[1] - ab[0])
        return (a + b) / 2

    new, mean, pair = [], [], []
    for _ in range(400):
        figures = _replicates(rng, n, noise, hit=1 / 3)
        kept = [figures[i] for i in fastest(list(figures))]
        new.append(abs(statistics.fmean(kept) - 1.0))
        mean.append(abs(statistics.fmean(figures) - 1.0))
        pair.append(abs(closest_two(figures) - 1.0))

    def p95(errors: list[float]) -> float:
        return sorted(errors)[int(0.95 * len(errors))]

    assert p95(new) <= TIE + 2.5 * noise, (p95(new), p95(mean), p95(pair))
    assert p95(new) < p95(mean) and p95(new) < p95(pair), (p95(new), p95(mean), p95(pair))


def test_two_agree_within_the_tolerance_only() -> None:
    assert agree([1.0, 1.0 + AGREE * 0.9])
    assert not agree([1.0, 1.0 + AGREE * 1.1])
    assert agree([1.0, 1.5, 1.52])  # any two
    assert not agree([1.0])


def _run(monkeypatch: pytest.MonkeyPatch, plain_ms: list[float], replicates: int) -> Level:
    """One level whose n-th plain phase runs at plain_ms[n] a token (speculative phases: 20 ms a
    step, every one alike); the engine takes no draft length per request (vLLM)."""
    plains = iter(plain_ms)

    async def phase(session, base_url, model, scenarios, runs, plan, phase, label):  # type: ignore[no-untyped-def]
        if base_url == "plain":
            ms, counts = next(plains), None
        else:
            ms, counts = 20.0 * 50 / 100, Counts(50, 150, 50)  # 100 tokens in 50 steps
        result = Result(0.0, 100 * ms / 1000, 101, "length")
        phase.results.append(ScenarioResult("s", [Request(result, counts)]))

    async def name(session: Any, base_url: str) -> str:
        return "m"

    monkeypatch.setattr(curve, "_phase", phase)
    monkeypatch.setattr(curve, "model_name", name)
    levels: list[Level] = []
    plan = Plan(engine=engine("vllm"))
    scenarios = [Scenario("s", 8, None, ("hi",))]
    asyncio.run(
        curve.measure_curve("spec", "plain", scenarios, None, [8], plan, levels, 0, replicates)
    )
    return levels[0]


def test_replicates_that_agree_are_pooled_and_their_spread_is_the_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    level = _run(monkeypatch, [10.0, 10.2], replicates=2)
    row = level.row()
    assert row["replicates"] == 2 and row["left_out"] == []
    assert row["plain_seconds"] == pytest.approx(0.0101)
    assert row["plain_error"] == pytest.approx(0.1 / 10.1, rel=1e-6)
    assert row["verify_error"] == pytest.approx(0.0)
    assert row["plain_spread"] == pytest.approx(2 * 0.1 / 10.1, rel=1e-6)


def test_an_outlier_gets_a_third_replicate_and_is_left_out_by_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    level = _run(monkeypatch, [10.0, 13.0, 10.2], replicates=2)
    row = level.row()
    assert row["replicates"] == 3
    assert row["plain_seconds"] == pytest.approx(0.0101)  # the 13 ms phase never averaged in
    assert row["speedup"] == pytest.approx(10.1 / 10.0)  # 2 tokens a 20 ms step
    assert row["left_out"] == [
        "c=8 plain: replicate 2 ran at x1.29 of the fastest's seconds a step (left out)"
    ]
    assert row["plain_spread"] == pytest.approx(13.0 / 10.1 - 1)  # the run's whole spread


def test_two_in_a_slow_mode_do_not_outvote_the_fastest(monkeypatch: pytest.MonkeyPatch) -> None:
    """Run b's c = 16 plain step: two replicates at x1.08 of the third agreed and were pooled;
    the fastest, the one nearest the A/B's plain step, was left out."""
    level = _run(monkeypatch, [10.8, 10.0, 10.75], replicates=3)
    row = level.row()
    assert row["plain_seconds"] == pytest.approx(0.0100)
    assert row["plain_spread"] == pytest.approx(0.08)


def test_no_more_than_one_replicate_past_those_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    """Three that never agree: the figure pools them all rather than measuring forever."""
    level = _run(monkeypatch, [10.0, 13.0, 16.0, 10.0], replicates=2)
    assert level.row()["replicates"] == 3


def test_replicates_go_round_robin_over_the_levels(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every level once (spec, plain), then every level again: a level's replicates are a
    round apart, so a slow mode that lasts a while does not hold all of them."""
    labels: list[str] = []

    async def phase(session, base_url, model, scenarios, runs, plan, phase, label):  # type: ignore[no-untyped-def]
        labels.append(label)
        counts = None if base_url == "plain" else Counts(50, 150, 50)
        result = Result(0.0, 1.0, 101, "length")
        phase.results.append(ScenarioResult("s", [Request(result, counts)]))

    async def name(session: Any, base_url: str) -> str:
        return "m"

    monkeypatch.setattr(curve, "_phase", phase)
    monkeypatch.setattr(curve, "model_name", name)
    plan = Plan(engine=engine("vllm"))
    scenarios = [Scenario("s", 8, None, ("hi",))]
    levels: list[Level] = []
    asyncio.run(curve.measure_curve("spec", "plain", scenarios, None, [1, 8], plan, levels, 0, 2))
    assert labels == [
        "c=1 speculative",
        "c=1 plain",
        "c=8 speculative",
        "c=8 plain",
        "c=1 speculative, replicate 2",
        "c=1 plain, replicate 2",
        "c=8 speculative, replicate 2",
        "c=8 plain, replicate 2",
    ]


def test_one_replicate_measures_as_before(monkeypatch: pytest.MonkeyPatch) -> None:
    level = _run(monkeypatch, [10.0], replicates=1)
    row = level.row()
    assert row["replicates"] == 1 and row["plain_seconds"] == pytest.approx(0.010)
