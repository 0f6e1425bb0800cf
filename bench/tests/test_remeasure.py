"""bench.gpu.remeasure: a recorded run's measure read again from the servers' own logs. On a
synthetic run (two levels, a plain side with one replicate in a slow mode): the phases are cut
out of the server's requests in measure's order after the warm-up, the old rule pools the two
slow replicates that agree, the new estimator takes the fast one, and the spread reaches the
slow ones."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.gpu import remeasure


def _stamp(at: float) -> str:
    minutes, rest = divmod(at, 60.0)
    seconds = int(rest)
    ms = int((rest - seconds) * 1000)
    return f"{int(minutes)}.{seconds:02d}.{ms:03d}.000"


def _log(phases: list[tuple[float, int, int, float, int]]) -> str:
    """(start, workers, requests, ms a token, accepted a request): requests in closed loops,
    each 100 tokens after a 10 ms prompt, phases a few seconds apart."""
    lines, task = [], 0
    for start, workers, n, ms, accepted in phases:
        ends = [start] * workers
        for i in range(n):
            w = i % workers
            begin = ends[w]
            decode = 100 * ms / 1000
            end = begin + 0.010 + decode
            ends[w] = end
            head = f"{_stamp(end)} I slot print_timing: id {w:2d} | task {task} |"
            lines.append(f"{head} prompt eval time =  10.00 ms /   300 tokens (x)")
            lines.append(f"{head}        eval time = {decode * 1000:9.2f} ms /   100 tokens (x)")
            if accepted:
                lines.append(f"{head} draft acceptance = 0.5 (   {accepted} accepted /    80 x)")
            task += 1
    return "\n".join(lines) + "\n"


@pytest.fixture
def run(tmp_path: Path) -> Path:
    out = tmp_path / "run-x"
    (out / "logs").mkdir(parents=True)
    plain_ms = {2: [10.0, 10.0], 4: [20.0, 21.4, 21.5]}  # c=4: two in a slow mode agree
    labels: list[str] = []
    plain_phases = [(0.0, 2, 4, 30.0, 0)]  # the warm-up
    spec_phases = [(0.0, 2, 4, 30.0, 40)]
    at = 20.0
    for level, figures in plain_ms.items():
        for i, ms in enumerate(figures):
            tail = "" if i == 0 else f", replicate {i + 1}"
            for side in ("speculative", "plain"):
                labels.append(f"specdec measure: c={level} {side}{tail}: s: {4 * level} request")
            spec_phases.append((at, level, 4 * level, 2 * ms, 40))
            plain_phases.append((at, level, 4 * level, ms, 0))
            at += 20.0
    (out / "measure.log").write_text("\n".join(labels) + "\n")
    (out / "logs" / "plain.log").write_text(_log(plain_phases))
    (out / "logs" / "spec.log").write_text(_log(spec_phases))
    curve = [{"running": float(c), "plain_seconds": 0.01, "verify_seconds": 0.02} for c in (2, 4)]
    levels = [
        {
            "concurrency": c,
            "routes": {"voice_chat": {"rounds": [1.0], "truth": 0.8, "estimated": 0.88}},
        }
        for c in (2, 4)
    ]
    (out / "results.json").write_text(json.dumps({"measure": {"curve": curve}, "levels": levels}))
    return out  # fmt: skip


def test_the_phases_are_measures_in_order_and_the_fastest_is_kept(run: Path) -> None:
    plain = remeasure.phases(run, "plain")
    assert sorted(plain) == [2, 4] and [len(v) for v in plain.values()] == [2, 3]
    row = remeasure.recompute(run)["levels"]["4"]
    assert row["plain"]["replicates_ms"] == pytest.approx([20.0, 21.4, 21.5], rel=1e-3)
    assert row["plain"]["old_ms"] == pytest.approx(21.45, rel=1e-3)  # the two that agree
    assert row["plain"]["new_ms"] == pytest.approx(20.0, rel=1e-3)  # the fastest
    assert row["plain"]["new_spread"] == pytest.approx(0.075, abs=1e-3)  # reaches 21.5
    # verify: 100 tokens in 60 steps a request, 2 x the plain ms a token
    assert row["verify"]["new_ms"] == pytest.approx(2 * 20.0 * 100 / 60, rel=1e-3)
    # the sidecar's estimate scales by the old cost ratio over the new one
    old_cost = row["verify"]["old_ms"] / row["plain"]["old_ms"]
    new_cost = row["verify"]["new_ms"] / row["plain"]["new_ms"]
    assert row["sidecar"]["voice_chat"]["new_error"] == pytest.approx(
        0.88 * old_cost / new_cost / 0.8 - 1, abs=1e-3
    )


def test_a_phase_line_reads_with_or_without_its_endpoint() -> None:
    """measure's progress lines name the endpoint since issue 60; the recorded runs' do not."""
    log = [
        "specdec measure: c=4 plain, replicate 2: s: 16 request(s) done",
        "specdec measure: c=8 plain: s on http://127.0.0.1:8002: 24 request(s) done",
        "specdec measure: phase 2/18 done (c=8 plain on http://127.0.0.1:8002, 24 requests) in 9s",
    ]
    assert remeasure.labelled(log) == [("c=4 plain, replicate 2", 4, 16), ("c=8 plain", 8, 24)]
