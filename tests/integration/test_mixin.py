"""A mixin config that is not the default (docs/mixin.md): the sidecar under job
`vllm-sidecar`, another drop threshold, another runbook URL. promtool accepts the rules it
generates and passes the drop alert's promtool unit tests rewritten for it, and
every panel of the dashboards it generates returns data from a live Prometheus scraping the
sidecar under that job."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from dashboards.boards.build import dashboards
from dashboards.config import DEFAULT, Mixin, load
from harness.helpers import need_tool
from tests.integration.live import MODEL, REPO, Live, live_stack, panels_without_data

pytestmark = pytest.mark.promtool

JOB = "vllm-sidecar"
RUNBOOK = "https://wiki.example.com/ops/specdec-runbooks.md"
CONFIG = f"""\
sidecar_job: {JOB}
acceptance_drop:
  fraction: 0.35
runbook_url: {RUNBOOK}
dashboards:
  uid_prefix: llm-spec
"""
DEFAULT_RUNBOOK = DEFAULT.runbook_url


def generate(tmp: Path) -> tuple[Path, Mixin]:
    config = tmp / "mixin.yaml"
    config.write_text(CONFIG, encoding="utf-8")
    for verb, where in (("rules", ["--root", str(tmp)]), ("dashboards", ["--out", str(tmp)])):
        done = subprocess.run(
            [sys.executable, "-m", "exporter", verb, "--config", str(config), *where],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stdout + done.stderr
    return tmp / "deploy" / "prometheus" / "rules", load(config)


def test_the_config_changes_what_it_says_and_nothing_else(tmp_path: Path) -> None:
    rules, mix = generate(tmp_path)
    assert mix.sidecar_job == JOB and mix.acceptance_drop.fraction == 0.35
    assert mix.acceptance_drop.z == DEFAULT.acceptance_drop.z  # the rest: defaults
    for name in ("specdec-recording.yml", "specdec-alerts.yml"):
        ours = (rules / name).read_text(encoding="utf-8")
        shipped = (REPO / "deploy/prometheus/rules" / name).read_text(encoding="utf-8")
        expected = (
            shipped.replace('job="specdec"', f'job="{JOB}"')
            .replace(DEFAULT_RUNBOOK, RUNBOOK)
            .replace("> 0.3\n", "> 0.35\n")
            .replace("> 0.3 and", "> 0.35 and")  # the drop alert's template names replicas
        )
        # compared as YAML: a longer job name wraps some lines differently
        assert yaml.safe_load(ours) == yaml.safe_load(expected), name
        assert ours != shipped
    assert sorted(p.name for p in tmp_path.glob("llm-spec-*.json")) == [
        "llm-spec-engine.json",
        "llm-spec-health.json",
        "llm-spec-payoff.json",
        "llm-spec-requests.json",
    ]


def test_promtool_accepts_the_rules_and_passes_the_unit_tests_rewritten(tmp_path: Path) -> None:
    promtool = need_tool("promtool")
    rules, _ = generate(tmp_path)
    checked = subprocess.run(
        [promtool, "check", "rules", *map(str, sorted(rules.glob("*.yml")))],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tests = rules.parent / "tests"
    tests.mkdir()
    # the rules differ from the shipped ones only by the job, the runbook (a consistent renaming:
    # test_the_config_changes_what_it_says_and_nothing_else) and the drop's threshold: the drop's
    # own unit tests run rewritten, the other files pass in test_prometheus_rules
    text = (REPO / "deploy/prometheus/tests/acceptance_drop.yml").read_text(encoding="utf-8")
    rewritten = (
        text.replace('job="specdec"', f'job="{JOB}"')
        .replace("job: specdec\n", f"job: {JOB}\n")
        .replace(DEFAULT_RUNBOOK, RUNBOOK)
    )
    assert rewritten != text
    (tests / "acceptance_drop.yml").write_text(rewritten, encoding="utf-8")
    done = subprocess.run(
        [promtool, "test", "rules", *map(str, sorted(tests.glob("*.yml")))],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.count("SUCCESS") == 1, done.stdout


@pytest.fixture(scope="module")
def renamed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Live, Mixin]]:
    tmp = tmp_path_factory.mktemp("mixin")
    rules, mix = generate(tmp)
    with live_stack(tmp, sorted(rules.glob("*.yml")), sidecar_job=JOB) as stack:
        yield stack, mix


def test_every_panel_returns_data_with_the_sidecar_under_another_job(
    renamed: tuple[Live, Mixin],
) -> None:
    live, mix = renamed
    assert live.query(f'up{{job="{JOB}"}} == 1'), "the sidecar is not scraped under its job"
    assert not live.query('up{job="specdec"}')
    values = {"job": JOB, "model_name": MODEL, "route": "voice_chat|coding_agent", "engine": "0"}
    empty = panels_without_data(live.prometheus, dashboards(mix), values, 120.0, live.started)
    assert not empty, f"{len(empty)} queries without data:\n" + "\n".join(empty)
    # and the alert that names the job: silent while the sidecar is up
    assert live.query('ALERTS{alertname="SpecDecodeExporterDown"}') == []
