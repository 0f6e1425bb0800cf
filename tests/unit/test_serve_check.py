"""`specdec serve --check`: the starter configs the README links load as shipped, the values
the starter tags `!placeholder` are named (exit 0; 1 with --strict), and a bad config is told
exactly as `serve` tells it (exit 2, every error in the file's order), without starting
anything."""

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


STARTER = REPO / "deploy" / "specdec.yaml"
# what the starter leaves to the user: its example routes and the model's figures
STARTER_PLACEHOLDERS = [
    "proxy.routes",
    "models[0].name",
    "models[0].num_speculative_tokens",
    "models[0].step_cost_ratio",
    "models[0].plain_decode_tokens_per_second",
]


def _warned(stderr: str) -> list[tuple[int, str]]:
    """(line, key) of each placeholder warning, in the order printed."""
    found = []
    for line in stderr.splitlines():
        if line.startswith("specdec serve: warning: ") and "is a placeholder" in line:
            where, key = line.removeprefix("specdec serve: warning: ").split(": ")[:2]
            found.append((int(where.rsplit(":", 1)[1]), key))
    return found


def test_check_names_each_placeholder_of_the_starter_by_line_and_key() -> None:
    done = check("--config", str(STARTER))
    assert done.returncode == 0, done.stderr
    warned = _warned(done.stderr)
    assert [key for _, key in warned] == STARTER_PLACEHOLDERS, done.stderr
    text = STARTER.read_text(encoding="utf-8").splitlines()
    assert all("!placeholder" in text[line - 1] for line, _ in warned)
    assert done.stdout.startswith("specdec serve: config OK: ")


def test_strict_fails_on_the_placeholders() -> None:
    done = check("--config", str(STARTER), "--strict")
    assert done.returncode == 1 and done.stdout == "", done.stdout
    assert len(_warned(done.stderr)) == len(STARTER_PLACEHOLDERS)
    assert done.stderr.splitlines()[-1] == "specdec serve: 5 placeholder(s) left (--strict)"


def test_a_filled_in_config_warns_of_nothing(tmp_path: Path) -> None:
    filled = tmp_path / "specdec.yaml"
    text = STARTER.read_text(encoding="utf-8").replace(
        "!placeholder your-served-model-name", "qwen3-8b"
    )
    filled.write_text(text.replace(": !placeholder", ":"), encoding="utf-8")
    done = check("--config", str(filled), "--strict")
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert "models: qwen3-8b " in done.stdout


def test_strict_without_check_is_a_usage_error() -> None:
    done = subprocess.run(specdec("serve", "--config", str(STARTER), "--strict"),
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 2 and done.stderr == "specdec serve: --strict goes with --check\n"


def test_three_errors_in_three_places_come_in_one_run_in_the_files_order() -> None:
    bad = BAD / "three_places_with_interval.yaml"
    done = check("--config", str(bad))
    assert done.returncode == 2 and done.stdout == ""
    expected = (BAD / "three_places_with_interval.expected").read_text().splitlines()
    told = done.stderr.splitlines()
    assert len(told) == 3 and "interval" in told[1], done.stderr
    for line, want in zip(told, expected, strict=True):
        assert line.startswith("specdec serve: config error: ") and line.endswith(want)
