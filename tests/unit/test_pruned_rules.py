"""`pruned_rules`: what promtool evaluates in the alert-quality test and bench is the shipped
rules an answer reads, closed under reading, each rule verbatim in its group and order."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from harness.alert_traffic import RULES, pruned_rules

NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def rules_in(paths: list[Path]) -> list[tuple[str, str, dict[str, Any]]]:
    """(file, group, rule) in file order."""
    out = []
    for path in paths:
        for group in yaml.safe_load(path.read_text(encoding="utf-8"))["groups"]:
            out += [(path.name, group["name"], rule) for rule in group["rules"]]
    return out


def test_the_drop_alert_keeps_what_it_reads_and_nothing_else(tmp_path: Path) -> None:
    now = "route_model_name:specdec_route_exact_acceptance:ratio_rate1m"
    kept = rules_in(pruned_rules(("SpecDecodeAcceptanceDrop", now), tmp_path))
    shipped = rules_in(RULES)
    recorded = {rule["record"] for _, _, rule in shipped if "record" in rule}
    names = {rule.get("record") or rule["alert"] for _, _, rule in kept}
    assert {"SpecDecodeAcceptanceDrop", now} <= names
    read = {n for _, _, rule in kept for n in NAME.findall(rule["expr"]) if n in recorded}
    assert read <= names  # closed: every recorded series a kept rule reads is kept
    # and minimal: each kept recording is read by a kept rule or asked for
    assert names - {"SpecDecodeAcceptanceDrop"} <= read | {now}
    assert len(kept) < len(shipped) / 2
    # verbatim, in the shipped groups and order
    assert kept == [entry for entry in shipped if entry in kept]
    intervals = {
        g["name"]: g.get("interval")
        for p in RULES
        for g in yaml.safe_load(p.read_text(encoding="utf-8"))["groups"]
    }
    for path in pruned_rules(("SpecDecodeAcceptanceDrop",), tmp_path / "again"):
        for group in yaml.safe_load(path.read_text(encoding="utf-8"))["groups"]:
            assert group.get("interval") == intervals[group["name"]]


def test_an_alert_reading_alerts_keeps_every_alert(tmp_path: Path) -> None:
    source = tmp_path / "source" / "r.yml"
    source.parent.mkdir()
    groups = [
        {"name": "rec", "rules": [{"record": "a:x:rate1m", "expr": "rate(x[1m])"}]},
        {"name": "rec2", "rules": [{"record": "b:y:rate1m", "expr": "rate(y[1m])"}]},
        {
            "name": "alerts",
            "rules": [
                {"alert": "Low", "expr": "a:x:rate1m < 1"},
                {"alert": "Other", "expr": "b:y:rate1m > 1"},
                {"alert": "Meta", "expr": 'count(ALERTS{alertstate="firing"}) > 1'},
            ],
        },
    ]
    source.write_text(yaml.safe_dump({"groups": groups}), encoding="utf-8")
    only_low = rules_in(pruned_rules(("Low",), tmp_path / "low", [source]))
    assert [rule.get("record") or rule["alert"] for _, _, rule in only_low] == ["a:x:rate1m", "Low"]
    meta = rules_in(pruned_rules(("Meta",), tmp_path / "meta", [source]))
    assert len(meta) == 5
