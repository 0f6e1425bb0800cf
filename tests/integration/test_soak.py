"""A short soak (bench/soak.py) through `specdec serve` at its connection limit: pooled
streams, non-streams, hang-ups and junk route headers, bursts of 1.5 x max_connections new
connections, connections that send nothing, slow readers and a real engine restart half-way.
No request lost: each one answered whole, refused with a status or failed by the upstream, and
every outcome's count equal to the proxy's own counter for it; no internal error, one restart
seen, descriptors back where they started, no series of a new name, route or model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_a_short_soak_at_the_connection_limit_loses_no_request(tmp_path: Path) -> None:
    out = tmp_path / "soak.json"
    args = ["--minutes", "1", "--rate", "20", "--report-every", "10", "--windows", "10s,30s"]
    run = subprocess.run(
        [sys.executable, "bench/soak.py", *args, "--json", str(out), "--check"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    figures = json.loads(out.read_text())["figures"]
    seen = figures["outcomes"]
    assert figures["problems"] == [] and figures["mismatches"] == [] and "lost" not in seen
    # every path was taken: served, hung up, refused at the limit, failed by the restart, and
    # the silent connections made to give their slots
    assert seen["whole"] > 0.7 * figures["requests"] and seen["hung_up"] > 0
    assert seen["refused_connections"] > 0 and seen["upstream_502"] > 0
    assert figures["silent_connections"]["closed_silent"] > 0
    assert figures["engine_restarts"] == 1 and figures["internal_errors"] == 0
    assert "Traceback" not in run.stdout + run.stderr
