"""A short soak (bench/soak.py) through `specdec serve`: mixed streams, non-streams, hang-ups
and junk route headers at a fixed rate, with a real engine restart half-way. No client error,
no internal error, one restart seen, and no series of a new name, route or model after the
first report (docs/BENCHMARKS.md has the 2-hour run)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_a_short_soak_has_no_errors_and_flat_series(tmp_path: Path) -> None:
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
    reports = json.loads(out.read_text())
    end = reports[-1]
    assert end["errors"] == 0 and end["internal_errors"] == 0 and end["engine_restarts"] == 1
    assert end["ok"] > 0.8 * end["sent"] and end["hung_up"] > 0
    assert "Traceback" not in run.stdout + run.stderr
