"""The mixin config file (docs/mixin.md): the documented file is the defaults, a file with
some keys changes those keys only, and each bad file in tests/fixtures/bad_mixins/ gives the
file:line: key: message lines of its .expected file (the sidecar config's messages)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from dashboards.boards import engine, health, payoff, requests
from dashboards.config import DEFAULT, NAMES, load
from exporter.config import ConfigError

from .pages import FIXTURES

ROOT = Path(__file__).resolve().parents[2]
BAD_MIXINS = FIXTURES / "bad_mixins"
BAD = sorted(BAD_MIXINS.glob("*.yaml"))


def test_the_documented_file_is_the_defaults(tmp_path: Path) -> None:
    text = (ROOT / "docs" / "mixin.md").read_text(encoding="utf-8")
    block = re.search(r"```yaml\n(.*?)```", text, re.S)
    assert block is not None
    path = tmp_path / "mixin.yaml"
    path.write_text(block.group(1), encoding="utf-8")
    assert load(path) == DEFAULT
    # every key is shown: changing each documented value changes the result
    assert len(block.group(1).splitlines()) >= 30


def test_an_empty_file_and_a_partial_file(tmp_path: Path) -> None:
    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing\n", encoding="utf-8")
    assert load(empty) == DEFAULT
    partial = tmp_path / "partial.yaml"
    partial.write_text(
        "sidecar_job: vllm-sidecar\nacceptance_drop: {fraction: 0.35}\nfor: {target_down: 5m}\n",
        encoding="utf-8",
    )
    mix = load(partial)
    assert mix.sidecar_selector == 'job="vllm-sidecar"'
    assert mix.acceptance_drop.fraction == 0.35
    assert mix.acceptance_drop.windows == DEFAULT.acceptance_drop.windows
    assert mix.for_.target_down == "5m" and mix.for_.exporter_down == "2m"
    assert mix.runbook("SpecDecodeAcceptanceDrop").endswith("runbooks.md#specdecodeacceptancedrop")


def test_the_uid_names_are_the_dashboards() -> None:
    assert {m.NAME for m in (payoff, requests, engine, health)} == set(NAMES)


def test_the_bad_mixin_folder_is_complete() -> None:
    assert len(BAD) >= 8
    for path in BAD:
        assert path.with_suffix(".expected").is_file(), f"{path.name} has no .expected"


@pytest.mark.parametrize("path", BAD, ids=[p.stem for p in BAD])
def test_bad_mixin(path: Path) -> None:
    expected = path.with_suffix(".expected").read_text(encoding="utf-8").strip().splitlines()
    with pytest.raises(ConfigError) as info:
        load(path)
    lines = str(info.value).splitlines()
    assert len(lines) == len(expected), lines
    for got, want in zip(lines, expected, strict=True):
        assert got == f"{path.parent}/{want}"


@pytest.mark.parametrize("verb", ["rules", "dashboards"])
def test_the_verbs_exit_2_with_the_lines_on_stderr(verb: str, tmp_path: Path) -> None:
    path = BAD_MIXINS / "dashboards_two_errors.yaml"
    done = subprocess.run(
        [sys.executable, "-m", "exporter", verb, "--config", str(path), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stdout == "" and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 2
    assert f"{path}:2: dashboards.uid_prefix:" in done.stderr
