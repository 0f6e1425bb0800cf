"""`specdec serve --check`: the starter configs the README links load as shipped, and a bad
config is told exactly as `serve` tells it (exit 2), without starting anything."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path

import pytest

from harness.helpers import specdec

REPO = Path(__file__).resolve().parents[2]
BAD = REPO / "tests" / "fixtures" / "bad_configs"


def check(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(specdec("serve", *args, "--check"), capture_output=True, text=True,
                          timeout=60)  # fmt: skip


@pytest.mark.parametrize("config", ["deploy/specdec.yaml", "deploy/compose/specdec.yaml"])
def test_the_starter_configs_check(config: str) -> None:
    done = check("--config", str(REPO / config))
    assert done.returncode == 0, done.stderr
    (line,) = done.stdout.splitlines()
    assert (
        line.startswith("specdec serve: config OK: ") and "routes: voice_chat, coding_agent" in line
    )


def test_the_local_starter_fronts_a_vllm_on_this_host() -> None:
    done = check("--config", str(REPO / "deploy/specdec.yaml"))
    assert (
        "to http://127.0.0.1:8000 " in done.stdout and "metrics on 127.0.0.1:10419" in done.stdout
    )


def test_a_bad_config_is_told_as_serve_tells_it() -> None:
    bad = BAD / "bad_engine.yaml"
    done = check("--config", str(bad))
    assert done.returncode == 2 and done.stdout == ""
    expected = (BAD / "bad_engine.expected").read_text().strip()
    assert expected in done.stderr, done.stderr


def test_check_starts_nothing_so_it_runs_beside_the_live_sidecar() -> None:
    """The addresses it names may be held (by the sidecar it is about to replace)."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        done = check("--target", "http://127.0.0.1:8000", "--listen", f"127.0.0.1:{port}")
    assert done.returncode == 0 and f"metrics on 127.0.0.1:{port}" in done.stdout, done.stderr
