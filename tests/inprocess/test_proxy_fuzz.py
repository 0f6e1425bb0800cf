"""The fuzzers of tests/fuzz.py at bounded counts (the long run: docs/BENCHMARKS.md): client
request bytes and upstream response bytes thrown at a running proxy; no problem, no exception
in the event loop, every upstream case accounted once, no internal error either way."""

from __future__ import annotations

from tests.fuzz import fuzz_client, fuzz_upstream

CASES = 300


async def test_client_bytes_get_the_upstream_answer_or_a_clean_error() -> None:
    tally = await fuzz_client(CASES, seed=11)
    assert tally.cases == CASES and tally.answered >= CASES // 2
    assert not tally.problems, "\n".join(tally.problems)
    assert not tally.loop_errors, tally.loop_errors


async def test_upstream_bytes_reach_the_client_exactly_or_as_a_clean_error() -> None:
    tally, figures = await fuzz_upstream(CASES, seed=12)
    assert tally.cases == CASES and tally.clean_errors > 0 and tally.cut > 0  # both kinds drawn
    assert not tally.problems, "\n".join(tally.problems)
    assert not tally.loop_errors, tally.loop_errors
    assert figures["accounted"] == CASES
    assert figures["faults"] == 0, "upstream bytes moved an internal-error counter"
