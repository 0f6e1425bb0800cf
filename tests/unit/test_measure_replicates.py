"""A level's speculative and plain phases are replicated, and once more where no two agree: one
phase in a start of a real engine can run far off the others at the same batch and context,
which the spread inside its own window does not show (a GPU llama-server's plain step at c = 32
read 24.3 then 30.0 ms in one start; docs/BENCHMARKS.md §11). The rule is the A/B truth's:
the closest two agree, an outlier is named and never averaged in."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from exporter.core.counts import Counts
from exporter.engines import engine
from exporter.measure import curve
from exporter.measure.level import Level
from exporter.measure.runner import Plan, Request, ScenarioResult
from exporter.measure.scenarios import Scenario
from exporter.measure.steps import AGREE, agree, agreeing
from exporter.measure.stream_client import Result


@pytest.mark.parametrize(
    ("figures", "kept"),
    [
        ([1.0], [0]),
        ([1.0, 1.3], [0, 1]),  # two: both, agreeing or not (then a third is run)
        ([1.0, 1.3, 1.02], [0, 2]),  # the outlier left out, wherever it ran
        ([1.3, 1.0, 1.02], [1, 2]),
        ([1.0, 1.03, 1.04], [0, 1, 2]),  # all within AGREE of the closest two's mean
        ([1.0, None, 1.01], [0, 2]),  # a replicate without a figure has nothing to pool
    ],
)
def test_the_closest_two_and_those_near_them_are_kept(
    figures: list[float | None], kept: list[int]
) -> None:
    assert agreeing(figures) == kept


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


def test_an_outlier_gets_a_third_replicate_and_is_left_out_by_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    level = _run(monkeypatch, [10.0, 13.0, 10.2], replicates=2)
    row = level.row()
    assert row["replicates"] == 3
    assert row["plain_seconds"] == pytest.approx(0.0101)  # the 13 ms phase never averaged in
    assert row["speedup"] == pytest.approx(10.1 / 10.0)  # 2 tokens a 20 ms step
    assert row["left_out"] == [
        "c=8 plain: replicate 2 ran at x1.29 of the others' seconds a step (left out)"
    ]


def test_no_more_than_one_replicate_past_those_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    """Three that never agree: the figure pools them all rather than measuring forever."""
    level = _run(monkeypatch, [10.0, 13.0, 16.0, 10.0], replicates=2)
    assert level.row()["replicates"] == 3


def test_one_replicate_measures_as_before(monkeypatch: pytest.MonkeyPatch) -> None:
    level = _run(monkeypatch, [10.0], replicates=1)
    row = level.row()
    assert row["replicates"] == 1 and row["plain_seconds"] == pytest.approx(0.010)
