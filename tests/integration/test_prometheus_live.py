"""End to end: Debian's prometheus on the repo's config and the shipped rules, scraping a live
simulator + sidecar + proxy (the shared stack, live.py); every recording rule returns data, and
an acceptance drop made through the simulator's admin API takes SpecDecodeAcceptanceDrop to
firing for that route only. The 1-day baseline is a day's: the stack's TSDB was backfilled with
a day of the routes' counters. bench/alert_quality.py measures the same rules' detection times.
"""

from __future__ import annotations

import json
import subprocess
import time
from typing import Any

import pytest

from harness.helpers import specdec
from tests.integration.live import DAY_LEVELS, Live, post_json, recording_rule_names

pytestmark = pytest.mark.promtool

ALERT = "SpecDecodeAcceptanceDrop"
BASELINE = "route_model_name:specdec_route_acceptance:ratio_rate1d"
NOW = "route_model_name:specdec_route_acceptance:ratio_rate1m"


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


def advice(*source: str) -> dict[str, Any] | None:
    out = subprocess.run(specdec("advise", *source, "--window", "1m", "--json"),
                         capture_output=True, text=True)  # fmt: skip
    return json.loads(out.stdout) if out.returncode == 0 else None


def test_advise_reads_the_same_advice_from_prometheus_as_from_the_sidecar(live: Live) -> None:
    def both_routes() -> dict[str, Any] | None:
        found = advice("--prometheus", live.prometheus)
        routes = {r["route"] for r in found["routes"]} if found else set()
        # and the schedule: its per-position acceptance over 1m comes with its own scrapes
        schedules = found["dynamic_speculative_decoding"].values() if found else []
        ready = any("acceptance_rate_per_pos" in s for s in schedules)
        return found if routes >= {"voice_chat", "coding_agent"} and ready else None

    scraped = live.poll(both_routes, 150, "advise --prometheus with both routes and a schedule")
    direct = advice("--sidecar", live.sidecar)
    assert direct is not None
    for a, b in zip(scraped["routes"], direct["routes"], strict=True):
        assert a["route"] == b["route"]
        assert abs(a["speedup_estimated"] / b["speedup_estimated"] - 1) < 0.05, (a, b)
    ((model, schedule),) = scraped["dynamic_speculative_decoding"].items()
    assert model == "sim-27b"
    per_position = direct["dynamic_speculative_decoding"][model]["acceptance_rate_per_pos"]
    assert len(schedule["acceptance_rate_per_pos"]) == len(per_position) == 3
    for x, y in zip(schedule["acceptance_rate_per_pos"], per_position, strict=True):
        assert abs(x - y) < 0.05


@pytest.mark.changes_live
def test_acceptance_drop_fires_for_the_changed_route_only(live: Live) -> None:
    baseline = live.poll(
        lambda: route_value(live, BASELINE, "coding_agent"), 120, "the 1-day baseline"
    )
    assert abs(baseline - DAY_LEVELS["coding_agent"]) < 0.02, baseline  # the backfilled day's
    live.poll(lambda: route_value(live, NOW, "coding_agent"), 60, "the 1m acceptance")
    before = route_value(live, NOW, "coding_agent")
    assert before is not None and 0.6 < before < 0.82, before  # code_agent profile: 0.71
    assert live.query(f'ALERTS{{alertname="{ALERT}"}}') == []  # not pending, not firing

    changed = post_json(f"{live.sim}/admin/profile", {"name": "code_agent", "acceptance": 0.36})
    assert changed["acceptance"] == 0.36
    start = time.monotonic()
    firing = f'ALERTS{{alertname="{ALERT}", alertstate="firing", route="coding_agent"}}'
    try:
        alerts = live.poll(
            lambda: live.query(firing),
            240,
            lambda: f"{ALERT} firing for coding_agent; now: {live.query(f'{NOW} or {BASELINE}')}",
        )
    finally:
        post_json(f"{live.sim}/admin/profile", {"name": "code_agent", "acceptance": 0.71})
    took = time.monotonic() - start
    labels = alerts[0]["metric"]
    assert labels["model_name"] == "sim-27b" and labels["severity"] == "warning", labels
    after = route_value(live, NOW, "coding_agent")
    assert after is not None and after < 0.5, after  # the route's acceptance really fell
    # the voice route shares the engine but kept its profile: no alert for it
    others = live.query(f'ALERTS{{alertname="{ALERT}", route!="coding_agent"}}')
    assert others == [], others
    print(f"{ALERT} firing {took:.0f} s after the change (shipped rules)")


@pytest.mark.changes_live
def test_a_repetition_loop_fires_the_runaway_alert(live: Live) -> None:
    """Half of the agent's requests become loops (acceptance near 1, run to max_tokens)."""
    alert = "SpecDecodeRunawayGenerations"
    share = "route_model_name:specdec_route_runaway_requests:share_rate10m"
    assert live.query(f'ALERTS{{alertname="{alert}"}}') == []
    loops = {"name": "code_agent", "acceptance": 0.71, "loop_share": 0.5}
    assert post_json(f"{live.sim}/admin/profile", loops)["loop_share"] == 0.5
    start = time.monotonic()
    firing = f'ALERTS{{alertname="{alert}", alertstate="firing", route="coding_agent"}}'
    try:
        live.poll(
            lambda: live.query(firing),
            240,
            lambda: f"{alert} firing for coding_agent; share now: {live.query(share)}",
        )
    finally:
        post_json(f"{live.sim}/admin/profile", {**loops, "loop_share": 0.0})
    took = time.monotonic() - start
    # the loops are what it saw: the route's requests ended by length, the voice route's not
    ended = live.query(
        'sum by (route) (rate(specdec_route_requests_total{finish_reason="length"}[1m]))'
    )
    by_route = {s["metric"]["route"]: float(s["value"][1]) for s in ended}
    assert by_route.get("coding_agent", 0) > 0, by_route
    assert live.query(f'ALERTS{{alertname="{alert}", route!="coding_agent"}}') == []
    print(f"{alert} firing {took:.0f} s after loops began (shipped rules)")
