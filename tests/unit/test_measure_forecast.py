"""`measure --concurrency` says its plan before the first request, a first estimate early in
the first phase, and the time left after each phase (issue 60: with its defaults it ran past
13 minutes on a simulated engine without a word of how long); each progress line names the
endpoint it is about (the speculative one or the baseline)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from exporter.cli.measure import HOW_LONG
from exporter.core.counts import Counts
from exporter.engines import engine
from exporter.measure import curve, runner
from exporter.measure.forecast import (
    FEWER,
    LONGER,
    PLAIN,
    SPEC,
    Forecast,
    Planned,
    _at,
    _estimate,
    curve_plan,
    duration,
)
from exporter.measure.level import Level
from exporter.measure.runner import Plan, Request, ScenarioResult
from exporter.measure.scenarios import Scenario
from exporter.measure.stream_client import Result

SPEC_URL, PLAIN_URL = "http://127.0.0.1:8000", "http://127.0.0.1:8002"
# two packs of 20 prompts, as the built-in ja_chat and code_agent: 40 requests a phase at c=1
# and c=8 (every prompt once), 120 at c=32 (3 x the concurrency)
SCENARIOS = [Scenario(name, 64, None, tuple(f"{name} {i}" for i in range(20))) for name in "ab"]


def _curve(monkeypatch: pytest.MonkeyPatch, levels: list[int]) -> list[tuple[str, str]]:
    """measure_curve with its defaults (2 replicates, 512 tokens more context) against phases
    that only record themselves: the notes and phases, in the order they came."""
    events: list[tuple[str, str]] = []

    async def phase(session, base_url, model, scenarios, runs, plan, phase, label):  # type: ignore[no-untyped-def]
        events.append(("phase", f"{label} on {base_url}"))
        counts = None if base_url == PLAIN_URL else Counts(50, 150, 50)
        phase.results.append(
            ScenarioResult("a", [Request(Result(0.0, 1.0, 101, "length"), counts)])
        )

    async def name(session: Any, base_url: str) -> str:
        return "m"

    monkeypatch.setattr(curve, "_phase", phase)
    monkeypatch.setattr(curve, "model_name", name)
    plan = Plan(engine=engine("vllm"), note=lambda line: events.append(("note", line)))
    into: list[Level] = []
    asyncio.run(curve.measure_curve(SPEC_URL, PLAIN_URL, SCENARIOS, None, levels, plan, into, 512))
    return events


def test_the_plan_comes_first_then_the_time_left_after_each_phase(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    events = _curve(monkeypatch, [1, 8, 32])
    kind, plan = events[0]
    assert kind == "note" and plan.startswith("plan: 3 level(s) (c=1, 8, 32) x 2 sides ")
    assert f"speculative on {SPEC_URL}, plain on {PLAIN_URL}" in plan
    assert "x 3 phase(s) (2 replicate(s), 1 with 512 tokens more context): 18 phases" in plan
    assert "1200 requests (a phase: 40 at c=1, 40 at c=8, 120 at c=32)" in plan
    assert "up to 6 more where a level's replicates disagree" in plan
    assert "--replicates 1, --context-tokens 0 or fewer levels shorten it" in plan
    phases = [i for i, (kind, _) in enumerate(events) if kind == "phase"]
    assert len(phases) == 18
    for n, i in enumerate(phases, 1):  # each phase is followed by its line
        kind, line = events[i + 1]
        assert kind == "note" and line.startswith(f"phase {n}/18 done ({events[i][1]}, "), line
    assert (
        "about " in events[phases[0] + 1][1] and "left for 17 phase(s)" in events[phases[0] + 1][1]
    )
    assert events[-1][1].endswith("the replicates are checked: up to 6 more where they disagree")


def test_the_first_estimate_comes_an_eighth_into_the_first_phase() -> None:
    """At c=1 the first phase sends its 40 requests one after another: minutes on a GPU."""
    said: list[str] = []
    forecast = Forecast(curve_plan({1: 40, 8: 40, 32: 120}, 2, True, False), said.append)
    first = forecast.pending[0]
    forecast.during(first, 4, 8.0)
    assert said == []
    forecast.during(first, 5, 10.0)  # 2 s a request: 80 s a phase at c=1, 2 s a round
    # c=1: 6 phases x 40 rounds, c=8: 6 x 5, c=32: 6 x 4; 2 s each; 10 s of it spent
    left = 2.0 * (6 * 40 + 6 * 5 + 6 * 4) - 10.0
    assert said == [
        f"5 of the first phase's 40 requests in 10s: about {duration(left)} left for 18 "
        f"phase(s) (~{duration(left + 10)} in all); c=8, 32 not run yet: read from c=1, likely more"
    ]
    forecast.during(first, 6, 12.0)
    assert len(said) == 1  # once


def test_a_phase_still_to_run_takes_what_its_kind_took_a_round_at_its_level() -> None:
    said: list[str] = []
    forecast = Forecast(curve_plan({1: 40, 8: 40}, 1, True, False), said.append)
    forecast.done(Planned(1, SPEC, 40), 80.0, "c=1 speculative")  # 2 s a round
    plain = next(p for p in forecast.pending if p.kind == PLAIN and p.concurrency == 1)
    assert forecast.pending[0] == plain
    assert _estimate(forecast.took, plain) == 80.0  # no plain phase yet: the speculative one's
    forecast.done(plain, 120.0, "c=1 plain")
    assert _estimate(forecast.took, Planned(8, PLAIN, 40)) == 5 * 3.0  # 5 rounds at c=1's 3 s
    assert _estimate(forecast.took, Planned(8, SPEC + LONGER, 40)) == 5 * 2.0  # its side's
    assert said[-1].startswith("phase 2/8 done (c=1 plain, 40 requests) in 2m00s; about 4m10s ")


def test_a_level_not_run_yet_is_read_between_or_beyond_those_run() -> None:
    assert _at({1: 2.0, 8: 4.0}, 8) == 4.0
    assert _at({1: 2.0, 8: 4.0}, 4) == pytest.approx(2.0 + 2.0 / 7 * 3)
    assert _at({1: 2.0, 8: 4.0}, 32) == pytest.approx(4.0 + 2.0 / 7 * 24)
    assert _at({1: 2.0, 8: 1.0}, 32) == 1.0  # never below the highest level run
    assert _at({8: 4.0}, 32) == 4.0 and _at({8: 4.0}, 1) == 4.0  # one level: flat


def test_phases_at_fewer_drafts_leave_the_plan_where_they_will_not_run() -> None:
    forecast = Forecast(curve_plan({1: 40, 8: 40}, 2, False, True), lambda _: None)
    assert sum(p.kind == FEWER for p in forecast.pending) == 4
    forecast.drop_fewer_drafts(1, every=False)  # k = 2 asked for one at c=1, then...
    assert [p.concurrency for p in forecast.pending if p.kind == FEWER] == [8, 8]
    forecast.drop_fewer_drafts(8, every=True)  # ...the engine drafted more than asked
    assert not any(p.kind == FEWER for p in forecast.pending)


def test_a_progress_line_names_the_endpoint(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """ "c=8 plain, replicate 2: voice_chat_2: 6 request(s) done" said nothing of which server."""
    names: list[str] = []

    async def stream(*_: Any) -> Result:
        return Result(0.0, 1.0, 11, "length")

    async def page(*_: Any) -> str:
        return ""

    monkeypatch.setattr(runner, "stream_chat", stream)
    monkeypatch.setattr(runner, "engine_page", page)
    plan = Plan(label="c=8 plain, replicate 2", progress=lambda name, *_: names.append(name))
    scenario = Scenario("voice_chat", 16, None, ("0", "1"))
    asyncio.run(
        runner.replay(
            None,  # type: ignore[arg-type]
            "http://user:secret@127.0.0.1:8002",
            "http://127.0.0.1:8002/metrics",
            "m",
            runner.interleaved([scenario], [1]),
            plan,
            {"voice_chat": ScenarioResult("voice_chat")},
        )
    )
    assert names == ["c=8 plain, replicate 2: voice_chat on http://127.0.0.1:8002"] * 2
    runner.stderr_progress(names[0], 2, 2)  # not a terminal: one line per finished run
    assert capsys.readouterr().err == (
        "specdec measure: c=8 plain, replicate 2: voice_chat on http://127.0.0.1:8002: "
        "2 request(s) done\n"
    )


def test_the_help_says_what_shortens_the_curve_and_what_it_costs() -> None:
    for flag in ("--replicates 1", "--context-tokens 0", "fewer levels", "--runs"):
        assert flag in HOW_LONG
    assert "no error over the run" in HOW_LONG and "own context" in HOW_LONG
