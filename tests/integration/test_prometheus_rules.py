"""The Prometheus side as CI checks it: promtool on the config, the generated rules and their unit
tests; the generated files match their definitions; the Alertmanager example is valid, routes by
severity and inhibits; every alert carries its annotations and a runbook section that exists."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import urllib.request
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.helpers import child, free_port, need_tool, wait_for

pytestmark = pytest.mark.promtool

REPO = Path(__file__).resolve().parents[2]
RULES = sorted((REPO / "deploy/prometheus/rules").glob("*.yml"))
UNIT_TESTS = sorted((REPO / "deploy/prometheus/tests").glob("*.yml"))
ALERTMANAGER = REPO / "deploy/alertmanager/alertmanager.yml"
RUNBOOKS = REPO / "docs/runbooks.md"
RUNBOOK_URL = "https://github.com/specdec/specdec/blob/main/docs/runbooks.md#"
ALERTS = (
    "SpecDecodeAcceptanceDrop",
    "SpecDecodeRunawayGenerations",
    "SpecDecodeAcceptanceCollapsed",
    "SpecDecodeBelowBreakEven",
    "SpecDecodeCostlyAtLoad",
    "SpecDecodeSilentlyOff",
    "SpecDecodeScheduleNotInEffect",
    "SpecDecodeExactCountsLost",
    "SpecDecodeCountersMissing",
    "SpecDecodeTargetDown",
    "SpecDecodeExporterDown",
    "SpecDecodeAttributionCoverageLow",
    "SpecDecodeCurveStale",
)
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        list(args), cwd=REPO, capture_output=True, text=True, timeout=300, check=False
    )


def groups(path: Path) -> list[dict[str, Any]]:
    return list(yaml.safe_load(path.read_text(encoding="utf-8"))["groups"])


def rules_of(kind: str) -> list[dict[str, Any]]:
    return [r for path in RULES for g in groups(path) for r in g["rules"] if kind in r]


def test_promtool_check_config() -> None:
    promtool = need_tool("promtool")
    out = run(promtool, "check", "config", "prometheus.yml")
    assert out.returncode == 0, out.stdout + out.stderr
    text = out.stdout + out.stderr
    assert f"SUCCESS: {len(RULES)} rule files found" in text, text
    assert "is valid prometheus config file syntax" in text, text


def test_promtool_check_rules() -> None:
    promtool = need_tool("promtool")
    out = run(promtool, "check", "rules", *(str(p.relative_to(REPO)) for p in RULES))
    assert out.returncode == 0, out.stdout + out.stderr
    for path in RULES:
        n = sum(len(g["rules"]) for g in groups(path))
        assert n >= 6  # 7 alerts: one of them sits with its recording rules
        assert f"Checking {path.relative_to(REPO)}\n  SUCCESS: {n} rules found" in out.stdout, (
            out.stdout
        )


def test_promtool_unit_tests_pass() -> None:
    promtool = need_tool("promtool")
    assert len(UNIT_TESTS) >= 4, UNIT_TESTS
    out = run(promtool, "test", "rules", *(str(p.relative_to(REPO)) for p in UNIT_TESTS))
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("SUCCESS") == len(UNIT_TESTS), out.stdout
    assert "FAILED" not in out.stdout + out.stderr


def unit_tests() -> list[dict[str, Any]]:
    return [yaml.safe_load(p.read_text(encoding="utf-8")) for p in UNIT_TESTS]


def test_unit_tests_are_deterministic_and_cover_every_alert_and_key_rule() -> None:
    all_groups = [g["name"] for path in RULES for g in groups(path)]
    fires: set[str] = set()
    silent: set[str] = set()
    queried = ""
    for doc in unit_tests():
        # promtool evaluates rule groups in random order unless it is given
        assert sorted(doc["group_eval_order"]) == sorted(all_groups), doc["group_eval_order"]
        assert doc["group_eval_order"][-1] == "specdec-alerts"
        assert doc["evaluation_interval"] == "15s"  # as prometheus.yml
        for test in doc["tests"]:
            for case in test.get("alert_rule_test", []):
                (fires if case["exp_alerts"] else silent).add(case["alertname"])
                for alert in case["exp_alerts"]:
                    # fires with its labels and every annotation checked
                    assert alert["exp_labels"]["severity"] in ("critical", "warning", "info")
                    assert set(alert["exp_annotations"]) == {
                        "summary",
                        "description",
                        "runbook_url",
                    }
            queried += " ".join(c["expr"] for c in test.get("promql_expr_test", []))
    assert fires == set(ALERTS), set(ALERTS) ^ fires
    assert silent == set(ALERTS), set(ALERTS) ^ silent
    key = [
        r["record"]
        for r in rules_of("record")
        if re.search(
            "acceptance:ratio|tokens_per_step|position_acceptance|estimated_speedup|rejected",
            r["record"],
        )
    ]
    assert len(key) >= 20, key
    untested = [name for name in key if name not in queried]
    assert not untested, untested


def test_generated_rules_are_up_to_date(tmp_path: Path) -> None:
    out = run(sys.executable, "-m", "exporter", "rules", "--check")
    assert out.returncode == 0, f"run `specdec rules`: {out.stdout}{out.stderr}"
    # not vacuous: a copy with a stale file is reported
    shutil.copytree(REPO / "deploy", tmp_path / "deploy")
    stale = tmp_path / "deploy/prometheus/rules/specdec-alerts.yml"
    stale.write_text(stale.read_text().replace("for: 2m", "for: 3m"))
    out = run(sys.executable, "-m", "exporter", "rules", "--check", "--root", str(tmp_path))
    assert out.returncode == 1, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "stale: deploy/prometheus/rules/specdec-alerts.yml", out.stdout
    assert lines[-1].startswith(f"(looked under {tmp_path};"), out.stdout
    # and a missing file is called missing, not stale
    stale.unlink()
    out = run(sys.executable, "-m", "exporter", "rules", "--check", "--root", str(tmp_path))
    assert out.returncode == 1, out.stdout + out.stderr
    assert out.stdout.splitlines()[0] == "missing: deploy/prometheus/rules/specdec-alerts.yml"


def test_amtool_check_config_and_routes() -> None:
    amtool = need_tool("amtool")
    out = run(amtool, "check-config", str(ALERTMANAGER.relative_to(REPO)))
    assert out.returncode == 0, out.stdout + out.stderr
    for found in ("SUCCESS", " - route", " - 4 inhibit rules", " - 3 receivers"):
        assert found in out.stdout, out.stdout
    for labels, receiver in (
        (["severity=critical", "alertname=SpecDecodeTargetDown"], "pager"),
        (["severity=warning", "alertname=SpecDecodeAcceptanceDrop", "route=voice_chat"], "chat"),
        (["severity=info", "alertname=SpecDecodeAttributionCoverageLow"], "blackhole"),
    ):
        out = run(amtool, "config", "routes", "test", f"--config.file={ALERTMANAGER}", *labels)
        assert out.returncode == 0, out.stdout + out.stderr
        assert out.stdout.strip() == receiver, (labels, out.stdout)


def test_alertmanager_inhibits_route_alerts_while_the_target_is_down(tmp_path: Path) -> None:
    """The real Alertmanager on the example config: TargetDown mutes AcceptanceDrop."""
    binary = need_tool("prometheus-alertmanager")
    port = free_port()
    base = f"http://127.0.0.1:{port}/api/v2"
    args = [
        binary,
        f"--config.file={ALERTMANAGER}",
        f"--storage.path={tmp_path / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--cluster.listen-address=",
    ]
    with child(args, tmp_path / "alertmanager.log"):
        wait_for(lambda: _get(f"{base}/status"), timeout=30, what="alertmanager API")
        now = datetime.now(UTC)
        window = {
            "startsAt": now.isoformat(),
            "endsAt": (now + timedelta(minutes=10)).isoformat(),
        }
        drop = {
            "alertname": "SpecDecodeAcceptanceDrop",
            "severity": "warning",
            "route": "coding_agent",
            "model_name": "sim-27b",
        }
        down = {
            "alertname": "SpecDecodeTargetDown",
            "severity": "critical",
            "target": "sim",
            "job": "specdec",
            "instance": "127.0.0.1:10419",
        }
        _post(f"{base}/alerts", [{"labels": drop, **window}])

        def state(name: str) -> str | None:
            for alert in _get(f"{base}/alerts"):
                if alert["labels"]["alertname"] == name:
                    return str(alert["status"]["state"])
            return None

        assert wait_for(lambda: state(drop["alertname"]), what="the drop alert") == "active"
        _post(f"{base}/alerts", [{"labels": down, **window}])
        wait_for(
            lambda: state(drop["alertname"]) == "suppressed",
            timeout=30,
            what="the drop alert inhibited by SpecDecodeTargetDown",
        )
        assert state(down["alertname"]) == "active"


def _get(url: str) -> Any:
    with _DIRECT.open(url, timeout=5) as resp:
        return json.loads(resp.read())


def _post(url: str, body: Any) -> None:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with _DIRECT.open(req, timeout=5) as resp:
        assert resp.status == 200


def anchors(markdown: str) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    out = set()
    for heading in re.findall(r"^#{1,6} (.+?)\s*$", markdown, flags=re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        out.add(slug)
    return out


def test_every_alert_is_annotated_and_has_a_runbook_section() -> None:
    alerts = rules_of("alert")
    assert sorted(a["alert"] for a in alerts) == sorted(ALERTS)
    sections = anchors(RUNBOOKS.read_text(encoding="utf-8"))
    for alert in alerts:
        name = alert["alert"]
        annotations = alert["annotations"]
        assert alert["labels"]["severity"] in ("critical", "warning", "info"), name
        assert annotations["summary"].strip(), name
        assert "{{ $value" in annotations["description"] or name in (
            "SpecDecodeCountersMissing",
            "SpecDecodeTargetDown",
            "SpecDecodeExporterDown",
        ), f"{name}: the description should carry the number"
        url = annotations["runbook_url"]
        assert url == RUNBOOK_URL + name.lower(), url
        assert url.split("#", 1)[1] in sections, f"docs/runbooks.md has no section #{url}"
