"""`specdec demo --scenario drop` against Debian's Prometheus with the shipped rules: the
coding agent's clients move to temperature 0.9 and the engine accepts less of the voice chat's
drafts; SpecDecodeAcceptanceDrop fires for both, labelled with what moved (cause=mix along
temperature; cause=within), the Payoff board's "Why acceptance moved" row names the same and
titles its baseline's real span, and none of the row's series is zero throughout.

Why it takes about 75 s: the live stack (live.py) backfills a quiet day of the routes' counters
and slices, so the split's baseline (the day before its 10-minute window) exists from the
start and the drop can begin at once (the demo itself waits out a window first). The alert's
1-minute window holds only dropped traffic from Prometheus' start (the backfill ends a minute
before), and at 20x the simulator makes the requests its z-score needs in seconds; what is
left is the rule groups' first evaluations: the day-long group (the 1-day acceptance, the
baseline's bands) every minute, the first up to a minute after the start, then the alert's
group every 15 s."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from dashboards.boards.build import dashboards
from dashboards.boards.panels import JSON
from harness.previews.draw import legend
from harness.previews.live import instant, range_query, resolve_variables, substitute
from harness.previews.render import _with_values
from tests.integration.live import LEVELS, Live, live_stack

pytestmark = pytest.mark.timeout(300)

ROUTES = set(LEVELS)
FIRING = 'ALERTS{alertname="SpecDecodeAcceptanceDrop", alertstate="firing"}'
DEADLINE = 150.0  # twice what it takes on a quiet machine


def why_row(board: JSON) -> list[JSON]:
    panels = board["panels"]
    first = next(p for p in panels if p["title"].startswith("Why acceptance moved"))
    return [p for p in panels if p["gridPos"]["y"] >= first["gridPos"]["y"]]


def causes(live: Live) -> dict[str, dict[str, str]] | None:
    """Each route's firing drop alert's labels, once both have a cause."""
    found = {a["metric"]["route"]: a["metric"] for a in live.query(FIRING)}
    known = set(found) == ROUTES and all(m.get("cause") != "unknown" for m in found.values())
    return found if known else None


def test_the_drop_alert_and_the_row_name_each_cause(tmp_path: Path) -> None:
    with live_stack(tmp_path, scenario="drop", drop_after=0.0) as live:
        labels = live.poll(
            lambda: causes(live), DEADLINE, lambda: f"both drop alerts: {live.query(FIRING)}"
        )
        cause = {r: (m["cause"], m["dimension"]) for r, m in labels.items()}
        assert cause == {
            "coding_agent": ("mix", "temperature"),
            "voice_chat": ("within", "all"),
        }, labels

        board = dashboards()["specdec-payoff"]
        url, now = live.prometheus, time.time()
        values = resolve_variables(board, url, {}, live.started, now)
        panels = why_row(board)
        first = panels[0]
        named = {
            legend(t["legendFormat"], item["metric"]): float(item["value"][1])
            for t in first["targets"]
            for item in instant(url, substitute(t["expr"], values), now)
        }
        assert set(named) == {
            "coding_agent: traffic mix along temperature",
            "voice_chat: the engine (within bands)",
        }, named
        assert all(v < -1.0 for v in named.values()), named  # percentage points, down
        # the backfilled day is the baseline: its real span, a day less the window
        assert _with_values(first["title"], values).endswith("against the 1 d before it")

        seen: dict[str, dict[str, list[float]]] = {}  # the last reading, for the message

        def drawn() -> dict[str, dict[str, list[float]]] | None:
            """Each panel's series over the run, once every panel has one and the split both
            parts (the split's first point comes with the alert's evaluation: a range's last
            step may precede it)."""
            out = seen
            out.clear()
            for panel in panels[1:]:
                for t in panel["targets"]:
                    expr = substitute(t["expr"], values)
                    for item in range_query(url, expr, live.started, time.time(), 5):
                        name = legend(t["legendFormat"], item["metric"])
                        points = [float(v) for _, v in item["values"]]
                        out.setdefault(panel["title"], {})[name] = points
            split = next((v for t, v in out.items() if t.startswith("Acceptance change")), {})
            # the split's parts cross its 0.5 pp floor one evaluation apart: wait for both
            both = len(split) >= 2
            return out if len(out) == len(panels) - 1 and both else None

        series = live.poll(drawn, 30, lambda: f"a series on each panel, two parts split: {seen}")
        for title, found in series.items():
            for name, points in found.items():
                assert any(v != 0 for v in points), (title, name)
        # the split draws what moved: the agent's traffic, the voice chat's engine
        (split,) = [t for t in series if t.startswith("Acceptance change")]
        assert sorted(series[split]) == [
            "coding_agent mix along temperature",
            "voice_chat within bands",
        ]
