"""`specdec measure` against the simulator speaking llama.cpp (`--engine llamacpp`: its `llamacpp:`
page, its timings, no per-request object): the engine is recognised from the page, the step-time
curve is measured on its batch gauge with decode steps from each request's accepted drafts, the
acceptance equals the simulator's truth, and the printed `models:` block loads as printed. The
same path against a real llama-server: tests/integration/test_real_llamacpp.py."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from exporter.config import load
from harness.helpers import child, free_port, http_get, scenario_pack, specdec, wait_for


@pytest.fixture(scope="module")
def sims(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """simulators speaking llama.cpp: a speculative one and a plain one."""
    logs = tmp_path_factory.mktemp("llamacpp-sims")
    spec, plain = free_port(), free_port()
    common = ("--engine", "llamacpp", "--speed", "4")
    with (
        child(specdec("sim", "--listen", f"127.0.0.1:{spec}", *common), logs / "spec.log"),
        child(
            specdec(
                "sim", "--listen", f"127.0.0.1:{plain}", "--num-speculative-tokens", "0", *common
            ),
            logs / "plain.log",
        ),  # fmt: skip
    ):
        urls = f"http://127.0.0.1:{spec}", f"http://127.0.0.1:{plain}"
        for url in urls:
            wait_for(lambda u=url: http_get(u + "/v1/models"), what=f"{url} up")
        yield urls


def truth(url: str) -> dict[str, dict[str, float]]:
    return json.loads(http_get(url + "/admin/truth"))


def test_measure_reads_llamacpps_counters_and_timings(
    sims: tuple[str, str], tmp_path: Path
) -> None:
    spec, plain = sims
    before = truth(spec)
    out = subprocess.run(
        specdec("measure", "--base-url", spec, "--baseline-url", plain, "--scenario-file",
                str(scenario_pack(tmp_path, 4)), "--json"),
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "failed" not in out.stderr
    after = truth(spec)
    for row in json.loads(out.stdout)["scenarios"]:
        name = row["name"]
        accepted = after[name]["accepted"] - before.get(name, {}).get("accepted", 0)
        proposed = after[name]["draft_tokens"] - before.get(name, {}).get("draft_tokens", 0)
        assert row["accepted_tokens"] == accepted and row["draft_tokens"] == proposed
        assert row["per_request_acceptance_rate"] == pytest.approx(accepted / proposed)
        assert row["draft_length"] == 3


def test_the_curve_of_a_llamacpp_engine_loads_as_printed(
    sims: tuple[str, str], tmp_path: Path
) -> None:
    spec, plain = sims
    out = subprocess.run(
        specdec("measure", "--base-url", spec, "--baseline-url", plain, "--scenario-file",
                str(scenario_pack(tmp_path, 3)), "--concurrency", "1,2"),
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    block = "\n".join(lines[next(i for i, x in enumerate(lines) if x.startswith("models:")) :])
    assert "num_speculative_tokens: 3" in block
    config = tmp_path / "specdec.yaml"
    config.write_text(
        f'targets:\n  - {{url: "{spec}/metrics", engine: llamacpp}}\n{block}\n', encoding="utf-8"
    )
    model = load(config).models[0]
    assert len(model.step_time) == 2
    assert all(p.verify_seconds and p.verify_seconds > p.plain_seconds for p in model.step_time)
    # llama.cpp takes a draft length per request (`speculative.n_max`): phases at 1 and k - 1
    for p in model.step_time:
        drafting = dict(p.draft_seconds)
        assert sorted(drafting) == [1, 2] and p.verify_seconds is not None
        assert p.plain_seconds < drafting[1] < drafting[2] < p.verify_seconds
    assert [round(p.running) for p in model.step_time] == [1, 2]  # its requests_processing


def test_the_wrong_engine_is_said_not_guessed(sims: tuple[str, str], tmp_path: Path) -> None:
    spec, _ = sims
    out = subprocess.run(
        specdec("measure", "--base-url", spec, "--scenario-file", str(scenario_pack(tmp_path, 1)),
                "--engine", "vllm"),
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "no speculative-decoding counters on /metrics" in out.stdout
    assert "is --engine right?" in out.stdout
