"""The step-time curve counts only the steady part of a level: requests that ended while work
was still queued. The tail, as the batch drains, ran on a GPU llama-server at 16-30 ms a token
against 11-16 ms steady (docs/BENCHMARKS.md §11), and read the plain step 25-30 % high."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from exporter.measure import curve, runner
from exporter.measure.curve import Phase
from exporter.measure.runner import Plan, Request, ScenarioResult
from exporter.measure.scenarios import Scenario
from exporter.measure.stream_client import Result


def _result(tokens: int, seconds: float) -> Result:
    return Result(
        ttft=0.01, decode_seconds=seconds, completion_tokens=tokens, finish_reason="length"
    )


def test_requests_ending_after_the_queue_ran_dry_are_not_full(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two workers, four requests, ended in the order 0, 1, 2, 3: the worker that finishes
    request 2 finds nothing left, so request 3 ran while the batch drained."""
    order: list[int] = []

    async def main() -> dict[str, ScenarioResult]:
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
        results = {"s": ScenarioResult("s")}
        drained = asyncio.Event()
        task = asyncio.create_task(
            runner.replay(
                None,  # type: ignore[arg-type]
                "http://x",
                "http://x/metrics",
                "m",
                runner.interleaved([scenario], [1]),
                Plan(concurrency=2, progress=lambda *_: None),
                results,
                drained,
            )
        )
        for i in range(4):
            gates[i].set()
            while len(order) <= i:  # the request has ended: its worker moved on
                await asyncio.sleep(0)
        await task
        assert drained.is_set()
        return results

    results = asyncio.run(main())
    assert order == [0, 1, 2, 3]
    full = {r.result.completion_tokens - 10: r.full for r in results["s"].requests}
    assert full == {0: True, 1: True, 2: True, 3: False}


def test_the_curve_reads_the_steady_requests_only() -> None:
    steady = [Request(_result(101, 1.0), None) for _ in range(3)]  # 10 ms a token
    tail = Request(_result(101, 3.0), None, full=False)  # 30 ms a token
    phase = Phase([ScenarioResult("s", [*steady, tail])])
    tokens, seconds, _ = phase.decode()
    assert seconds / tokens == pytest.approx(0.010)
    only_tail = Phase([ScenarioResult("s", [tail])])  # nothing steady: all of it, not nothing
    tokens, seconds, _ = only_tail.decode()
    assert seconds / tokens == pytest.approx(0.030)


def test_the_batch_is_sampled_until_the_drain(monkeypatch: pytest.MonkeyPatch) -> None:
    reads = 0

    async def page(*_: Any) -> str:
        nonlocal reads
        reads += 1
        return f"running {reads}\n"

    monkeypatch.setattr(curve, "engine_page", page)
    monkeypatch.setattr(curve, "SAMPLE_EVERY", 0.0)

    async def main() -> list[float]:
        into: list[float] = []
        until = asyncio.Event()
        task = asyncio.create_task(curve._sample(None, "u", "running", into, until))  # type: ignore[arg-type]
        while len(into) < 3:
            await asyncio.sleep(0)
        until.set()
        await asyncio.wait_for(task, 5)
        return into

    into = asyncio.run(main())
    assert into[:3] == [1.0, 2.0, 3.0]
    assert len(into) <= 4  # at most the read in flight when the drain came
