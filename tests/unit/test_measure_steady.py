"""The step-time curve counts only the steady span of a level (`Phase.steady_span`): from the time
the first cohort has turned over to the time a worker first finds nothing left, each request
with the part of its decode inside. The tail, as the batch drains, ran on a GPU llama-server at
16-30 ms a token against 11-16 ms steady; and counting only the requests that ended before the
drain chose the fast ones (H200, c = 16: 81.3 tok/s against 72-76 for all decode in the same
window and 73.9 in the A/B; docs/BENCHMARKS.md §11, run 22)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from exporter.core.counts import Counts
from exporter.measure import curve, runner
from exporter.measure.level import Phase
from exporter.measure.runner import Plan, Request, ScenarioResult
from exporter.measure.scenarios import Scenario
from exporter.measure.stream_client import Result


def _result(tokens: int, seconds: float, sent: float = 0.0) -> Result:
    """`tokens` generated, the first at `sent`, the last `seconds` later."""
    return Result(0.0, seconds, tokens, "length", sent=sent)


def _phase(spans: list[tuple[float, float, int]], workers: int, dry_at: float | None) -> Phase:
    """A phase of requests (first token's time, last's, tokens after the first)."""
    requests = [Request(_result(n + 1, end - start, start), None) for start, end, n in spans]
    return Phase([ScenarioResult("s", requests)], workers=workers, dry_at=dry_at)


def test_the_first_worker_to_find_nothing_left_says_so_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two workers, four requests, ended in the order 0, 1, 2, 3: the worker that finishes
    request 2 finds nothing left, so the drain starts then, while request 3 still runs."""
    order: list[int] = []
    drains: list[list[int]] = []  # the requests ended when each drain call came

    async def main() -> None:
        gates = [asyncio.Event() for _ in range(4)]

        async def fake_stream(_s: Any, _url: str, body: dict[str, Any], *_: Any) -> Result:
            i = int(body["messages"][-1]["content"])
            await gates[i].wait()
            order.append(i)
            return _result(10 + i, 1.0)

        async def page(*_: Any) -> str:
            return ""

        monkeypatch.setattr(runner, "stream_chat", fake_stream)
        monkeypatch.setattr(runner, "engine_page", page)
        scenario = Scenario("s", 16, None, ("0", "1", "2", "3"))
        task = asyncio.create_task(
            runner.replay(
                None,  # type: ignore[arg-type]
                "http://x",
                "http://x/metrics",
                "m",
                runner.interleaved([scenario], [1]),
                Plan(concurrency=2, progress=lambda *_: None),
                {"s": ScenarioResult("s")},
                lambda: drains.append(list(order)),
            )
        )
        for i in range(3):
            gates[i].set()
            for _ in range(1000):  # the request has ended and its worker moved on
                if len(order) > i and (i < 2 or drains):
                    break
                await asyncio.sleep(0)
        assert drains == [[0, 1, 2]]  # before request 3 ended
        gates[3].set()
        await task

    asyncio.run(main())
    assert order == [0, 1, 2, 3]
    assert drains == [[0, 1, 2]]  # once: the second worker to run dry says nothing


def test_the_curve_counts_the_decode_inside_the_steady_window() -> None:
    """Two workers. The first cohort (0-1 s, 0-1.2 s) is left out: the window opens at the
    second request's end (1.2 s) and closes at the drain (2.2 s). Inside it a fast request
    (200 tok/s, 1-2 s) and a slow one (50 tok/s, 1.2-3.2 s) run together: each counts with
    its part inside, where counting only the requests that ended inside would read 200."""
    phase = _phase([(0, 1, 100), (0, 1.2, 100), (1, 2, 200), (1.2, 3.2, 100)], 2, dry_at=2.2)
    assert phase.steady_span() == (1.2, 2.2)
    tokens, seconds, steps = phase.decode()
    assert tokens == pytest.approx(160 + 50)  # 0.8 s of the fast one, 1 s of the slow one
    assert seconds == pytest.approx(1.8)
    assert steps is None  # no per-request counts


def test_without_a_steady_window_the_whole_phase_counts() -> None:
    """No drain seen, or fewer requests ended than workers, or the drain came first: the whole
    of every request, not nothing."""
    spans = [(0, 1, 100), (0, 2, 100)]
    for workers, dry_at in ((2, None), (3, 5.0), (2, 1.5)):
        phase = _phase(spans, workers, dry_at)
        assert phase.steady_span() is None
        tokens, seconds, _ = phase.decode()
        assert (tokens, seconds) == (pytest.approx(200), pytest.approx(3.0))


def test_a_requests_steps_count_with_its_share_inside() -> None:
    """Steps are shared out like tokens: a request half inside brings half its steps."""
    counts = Counts(10, 30, 15)  # 10 drafts, 30 drafted, 15 accepted
    half = Request(_result(101, 2.0, 1.0), counts)  # 1-3 s, half of it inside 2-4 s
    ended = Request(_result(101, 2.0, 0.0), counts)  # 0-2 s: the cohort, out
    phase = Phase([ScenarioResult("s", [ended, half])], workers=1, dry_at=4.0)
    tokens, seconds, steps = phase.decode()
    assert (tokens, seconds) == (pytest.approx(50), pytest.approx(1.0))
    assert steps == pytest.approx((100 - 15) / 2)  # decode steps: tokens - accepted drafts


def test_the_batch_is_read_inside_the_window() -> None:
    phase = _phase([(0, 1, 100), (1, 3, 100)], 1, dry_at=2.5)
    phase.running = [(0.5, 9.0), (1.5, 4.0), (2.0, 4.0), (2.9, 1.0)]
    assert phase.batch() == [4.0, 4.0]
    phase.dry_at = None  # no window: every read
    assert phase.batch() == [9.0, 4.0, 4.0, 1.0]


def test_the_batch_is_sampled_until_the_drain(monkeypatch: pytest.MonkeyPatch) -> None:
    reads = 0

    async def page(*_: Any) -> str:
        nonlocal reads
        reads += 1
        return f"running {reads}\n"

    monkeypatch.setattr(curve, "engine_page", page)
    monkeypatch.setattr(curve, "SAMPLE_EVERY", 0.0)

    async def main() -> list[tuple[float, float]]:
        into: list[tuple[float, float]] = []
        until = asyncio.Event()
        task = asyncio.create_task(curve._sample(None, "u", "running", into, until))  # type: ignore[arg-type]
        while len(into) < 3:
            await asyncio.sleep(0)
        until.set()
        await asyncio.wait_for(task, 5)
        return into

    into = asyncio.run(main())
    assert [v for _, v in into[:3]] == [1.0, 2.0, 3.0]
    assert [t for t, _ in into] == sorted(t for t, _ in into)  # when each was read
    assert len(into) <= 4  # at most the read in flight when the drain came


def _requests(spans: list[tuple[float, float, int, int]], drafted: int = 0) -> list[Request]:
    """Requests (first token's time, last's, tokens after the first, prompt tokens), each of
    its tokens in one step that drafted `drafted` tokens and accepted none."""
    return [
        Request(_result(n + 1, end - start, start), Counts(n, drafted * n, 0), prompt)
        for start, end, n, prompt in spans
    ]


def test_a_phase_states_the_context_its_requests_held_and_the_drafts_per_step() -> None:
    """A request's context while it decodes is its prompt + half its decode; the phase's is
    time-weighted by the part of each request inside the window."""
    requests = _requests([(0.0, 10.0, 100, 300), (0.0, 10.0, 100, 700)], drafted=2)
    steady = Phase([ScenarioResult("s", requests)], workers=1, dry_at=None).steady()
    assert steady.context == pytest.approx(((300 + 51) + (700 + 51)) / 2)
    assert steady.draft_tokens is not None and steady.steps
    assert steady.draft_tokens / steady.steps == pytest.approx(2.0)


def test_a_phase_gives_its_steps_error_from_the_spread_of_its_window() -> None:
    """Seconds per step in four spans of the window: steady steps give no error, steps that
    slow down halfway give the spread's standard error."""
    # the window: from the first end (5 s) to the drain (40 s), 0.1 s a step throughout
    even = _requests([(0.0, 5.0, 50, 100)] + [(i, i + 40.0, 400, 100) for i in (0.0, 1.0)])
    phase = Phase([ScenarioResult("s", even)], workers=1, dry_at=40.0)
    assert phase.relative_error(plain=False) == pytest.approx(0.0, abs=1e-9)
    uneven = _requests([(0.0, 1.0, 10, 100), (1.0, 11.0, 100, 100), (11.0, 31.0, 100, 100)])
    phase = Phase([ScenarioResult("s", uneven)], workers=1, dry_at=31.0)
    error = phase.relative_error(plain=True)
    assert error is not None and error > 0.1  # 0.1 s a token in one half, 0.2 in the other
    assert Phase([ScenarioResult("s", uneven)], workers=9, dry_at=31.0).relative_error(True) is None


def test_a_level_says_what_a_step_gains_per_token_of_context() -> None:
    """The same requests lengthened by 400 tokens of prompt: a plain step 2 ms slower, a verify
    step 4 ms: seconds per token of context."""
    from exporter.measure.level import Level

    def phase(prompt: int, seconds_per_token: float) -> Phase:
        spans = [(0.0, 100 * seconds_per_token, 100, prompt)]
        return Phase([ScenarioResult("s", _requests(spans, drafted=3))], workers=1, dry_at=None)

    level = Level(8, phase(100, 0.030), phase(100, 0.010))
    level.longer = (phase(500, 0.034), phase(500, 0.012))
    row = level.row()
    assert row["context"] == pytest.approx(151)
    assert row["plain_per_context_token"] == pytest.approx(0.002 / 400)
    assert row["verify_per_context_token"] == pytest.approx(0.004 / 400)
    assert row["verify_drafts"] == pytest.approx(3.0)
    level.longer = (phase(500, 0.029), phase(500, 0.009))  # faster: noise, never below 0
    assert level.row()["plain_per_context_token"] == 0.0
