"""bench_collect times this tree's route and request collectors against another checkout's and
refuses a reference that is not one."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_it_compares_this_tree_with_a_reference() -> None:
    out = subprocess.run(
        [
            sys.executable,
            "bench/bench_collect.py",
            "--reference",
            str(REPO),
            "--rounds",
            "1",
            "--scrapes",
            "2",
            "--requests",
            "200",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("this      ms per scrape: ")
    assert float(lines[0].rsplit(" ", 1)[1]) > 0
    assert lines[-1].startswith("this / reference (medians): x")


def test_a_reference_without_the_project_is_refused(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "bench/bench_collect.py", "--reference", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert out.returncode == 2
    assert out.stderr == f"bench_collect: --reference {tmp_path}: no exporter/ there\n"
