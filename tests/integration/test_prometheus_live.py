"""End to end: Debian's prometheus on the repo's config and rules, scraping a live simulator +
sidecar + proxy; every recording rule returns data, and an acceptance drop made through the
simulator's admin API takes SpecDecodeAcceptanceDrop to firing for that route only.

Test-only rules variant (the shipped files are not touched): the alert compares the last
minute with the route's 1-day level and waits `for: 1m`, evaluated every 15 s. A test cannot
wait a day, so a copy of the generated rules is written to the test's temp dir by text
substitution: the baseline window [1d] -> [10m] (with a minute of history it is simply the
pre-change level), `for: 1m` -> `for: 10s`, and the groups' evaluation intervals -> 1s.
Thresholds and guards are the shipped ones. bench/alert_quality.py measures the shipped rules.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.conftest_prometheus import (
    SHIPPED_RULES,
    Live,
    live_stack,
    post_json,
    recording_rule_names,
)

pytestmark = pytest.mark.promtool

# (old, new, how many times it must occur in the shipped files together)
SUBSTITUTIONS = (
    ("[1d]", "[10m]", 2),  # the route baseline's two rates
    ("for: 1m\n", "for: 10s\n", 1),  # SpecDecodeAcceptanceDrop only
    ("interval: 15s\n", "interval: 1s\n", 2),  # the two recording groups
    ("interval: 1m\n", "interval: 1s\n", 1),  # the baselines group
)
ALERT = "SpecDecodeAcceptanceDrop"
BASELINE = "route_model_name:specdec_route_acceptance:ratio_rate1d"
NOW = "route_model_name:specdec_route_acceptance:ratio_rate1m"


def fast_rules(tmp: Path) -> list[Path]:
    texts = {p.name: p.read_text(encoding="utf-8") for p in SHIPPED_RULES}
    for old, new, expected in SUBSTITUTIONS:
        found = sum(t.count(old) for t in texts.values())
        assert found == expected, f"shipped rules changed: {old!r} occurs {found}x, not {expected}x"
        texts = {name: t.replace(old, new) for name, t in texts.items()}
    out = []
    for name, text in texts.items():
        path = tmp / f"fast-{name}"
        path.write_text(text, encoding="utf-8")
        out.append(path)
    return out


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    tmp = tmp_path_factory.mktemp("prometheus-live")
    with live_stack(tmp, fast_rules(tmp)) as stack:
        yield stack


def route_value(live: Live, promql: str, route: str) -> float | None:
    for sample in live.query(promql):
        if sample["metric"].get("route") == route:
            return float(sample["value"][1])
    return None


def test_every_recording_rule_returns_data(live: Live) -> None:
    names = recording_rule_names()
    assert len(names) >= 25, names  # both scopes x windows, the baselines
    missing = list(names)

    def all_present() -> bool:
        missing[:] = [n for n in names if not live.query(n)]
        return not missing

    live.poll(all_present, 90, lambda: f"data from every recording rule; missing: {missing}")
    # per-route rules carry both demo routes, per-engine rules the simulated engine
    routes = {s["metric"]["route"] for s in live.query(NOW)}
    assert routes >= {"voice_chat", "coding_agent"}, routes
    engines = live.query("model_name_engine:specdec_acceptance:ratio_rate1m")
    assert {(s["metric"]["model_name"], s["metric"]["engine"]) for s in engines} == {
        ("sim-27b", "0")
    }
    positions = live.query(
        'route_model_name_position:specdec_route_position_acceptance:ratio_rate5m{route="coding_agent"}'
    )
    assert sorted(s["metric"]["position"] for s in positions) == ["0", "1", "2"]


def test_acceptance_drop_fires_for_the_changed_route_only(live: Live) -> None:
    # a minute of baseline first, so the 10m "baseline" is the pre-change level
    live.poll(
        lambda: live.query(f'count_over_time({BASELINE}{{route="coding_agent"}}[10m]) >= 60'),
        150,
        "60 s of the coding_agent baseline",
    )
    before = route_value(live, NOW, "coding_agent")
    assert before is not None and 0.6 < before < 0.82, before  # code_agent profile: 0.71
    assert live.query(f'ALERTS{{alertname="{ALERT}"}}') == []  # not pending, not firing

    changed = post_json(f"{live.sim}/admin/profile", {"name": "code_agent", "acceptance": 0.36})
    assert changed["acceptance"] == 0.36
    start = time.monotonic()
    firing = f'ALERTS{{alertname="{ALERT}", alertstate="firing", route="coding_agent"}}'
    alerts = live.poll(
        lambda: live.query(firing),
        120,
        lambda: f"{ALERT} firing for coding_agent; now: {live.query(f'{NOW} or {BASELINE}')}",
    )
    took = time.monotonic() - start
    labels = alerts[0]["metric"]
    assert labels["model_name"] == "sim-27b" and labels["severity"] == "warning", labels
    after = route_value(live, NOW, "coding_agent")
    assert after is not None and after < 0.5, after  # the route's acceptance really fell
    # the voice route shares the engine but kept its profile: no alert for it
    others = live.query(f'ALERTS{{alertname="{ALERT}", route!="coding_agent"}}')
    assert others == [], others
    print(f"{ALERT} firing {took:.0f} s after the change (test rules: for 10s)")
