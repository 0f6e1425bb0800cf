"""`specdec demo` as the README runs it: acceptance shows up within 30 s, Ctrl-C stops it all."""

from __future__ import annotations

import re
import signal
import subprocess
from pathlib import Path

from tests.helpers import free_port, http_get, samples, specdec, value, wait_for

LINE = re.compile(r"^(voice_chat|coding_agent)\s+acceptance\s+([\d.]+)%")


def test_demo_shows_both_workloads_and_stops_cleanly(tmp_path: Path) -> None:
    sim_port, side_port = free_port(), free_port()
    out = tmp_path / "demo.out"
    args = [
        "demo",
        "--sim-port",
        str(sim_port),
        "--sidecar-port",
        str(side_port),
        "--report-every",
        "2",
    ]
    with out.open("wb") as sink:
        proc = subprocess.Popen(
            specdec(*args), stdout=sink, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            url = f"http://127.0.0.1:{side_port}/metrics"
            ratio = wait_for(
                lambda: value(
                    samples(http_get(url)), "specdec_acceptance_ratio", engine="all", window="1m"
                ),
                timeout=30,
                what="specdec_acceptance_ratio within 30 s",
            )
            assert 0.36 < ratio < 0.71  # the engine mixes both workloads

            def latest() -> dict[str, float] | None:
                found: dict[str, float] = {}
                for line in out.read_text().splitlines():
                    if match := LINE.match(line):
                        found[match.group(1)] = float(match.group(2)) / 100
                return found if len(found) == 2 else None

            per_workload = wait_for(latest, timeout=30, what="a line per workload")
            assert 0.26 < per_workload["voice_chat"] < 0.46, per_workload
            assert 0.61 < per_workload["coding_agent"] < 0.81, per_workload
        finally:
            proc.send_signal(signal.SIGINT)  # Ctrl-C
            code = proc.wait(15)
    assert code == 0, out.read_text()[-2000:]
    assert "Traceback" not in out.read_text()
    for port in (sim_port, side_port):  # nothing left listening
        try:
            http_get(f"http://127.0.0.1:{port}/", timeout=1)
        except OSError:
            continue
        raise AssertionError(f"port {port} still answers after Ctrl-C")
