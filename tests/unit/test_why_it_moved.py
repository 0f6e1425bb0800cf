"""The Payoff board's "Why acceptance moved" row as generated: its first panel names each
route's cause (traffic mix along a dimension, the engine, or steady) and titles the baseline's
real span, every panel's unit says what it counts (a table here), every query waits for a full
window as the rest of the board, and the previews resolve the span as Grafana does."""

from __future__ import annotations

import re

import pytest

from dashboards.boards.build import dashboards
from dashboards.boards.panels import JSON
from dashboards.config import DEFAULT
from dashboards.queries import slices
from harness.previews import live
from harness.previews.render import _with_values

BOARD = dashboards()["specdec-payoff"]
WINDOW = DEFAULT.breakdown.window

# what each panel's numbers are: ratio changes in percentage points, shares and acceptance as
# ratios, draft tokens per completion token, the draft length k as a count
UNITS = {
    "Why acceptance moved": "suffix: pp",
    "Acceptance change: traffic mix (dashed) and within bands": "suffix: pp",
    "Share of draft tokens by band": "percentunit",
    "Acceptance by band": "percentunit",
    "Draft rate by band": "suffix: drafts/token",
    "Draft length in effect": "short",
}


def row() -> list[JSON]:
    """The row's panels: the cause panel and those below it."""
    panels = BOARD["panels"]
    first = next(p for p in panels if p["title"].startswith("Why acceptance moved"))
    return [p for p in panels if p["gridPos"]["y"] >= first["gridPos"]["y"]]


def unit(panel: JSON) -> str:
    return str(panel["fieldConfig"]["defaults"].get("unit", ""))


def test_the_first_panel_names_the_cause_per_route() -> None:
    first = row()[0]
    assert first["type"] == "stat", first["type"]
    (target,) = first["targets"]
    assert target["legendFormat"] == "{{route}}: {{cause}}"
    assert target["instant"] and not target["range"]  # a past cause leaves no value behind
    expr = target["expr"]
    assert slices.cause_rule(WINDOW, DEFAULT.breakdown.baseline) in expr
    named = re.findall(r'label_replace\(.*?"cause", "([^"]+)", "(\w*)", "([^"]*)"', expr, re.S)
    assert named == [
        ("traffic mix along $1", "dimension", "(.+)"),
        ("the engine (within bands)", "", ""),
        ("steady", "", ""),
    ]
    assert first["title"] == (
        f"Why acceptance moved: the last {WINDOW} against the $baseline ${{baseline:text}} "
        "before it"
    )


def test_the_baseline_span_is_a_hidden_variable_of_the_recorded_span() -> None:
    (var,) = [v for v in BOARD["templating"]["list"] if v["name"] == "baseline"]
    assert var["hide"] == 2 and var["type"] == "query"
    assert var["query"].startswith("query_result(") and slices.SPAN in var["query"]


@pytest.mark.parametrize("title", sorted(UNITS))
def test_each_panel_says_what_it_counts(title: str) -> None:
    (panel,) = [p for p in BOARD["panels"] if p["title"].startswith(title)]
    assert unit(panel) == UNITS[title], (title, unit(panel))


def test_every_panel_of_the_row_is_in_the_table_and_none_reads_tokens_per_step() -> None:
    titles = [p["title"] for p in row()]
    assert all(any(t.startswith(k) for k in UNITS) for t in titles), titles
    assert all("tok/step" not in unit(p) for p in row())


def test_the_row_waits_for_a_full_window_as_the_board_does() -> None:
    """Each query is a figure `and on (route, model_name)` routes a window old (the board's
    full-window guard), so no start-up point sets the axis."""
    for panel in row():
        for target in panel["targets"]:
            guard = re.search(r"and on \(route, model_name\) group by \(route, model_name\) "
                              r"\(specdec_route_requests_total\{[^}]*\} offset (\S+)\)",
                              target["expr"])  # fmt: skip
            assert guard, (panel["title"], target["refId"])
            assert guard.group(1) in (WINDOW, "$__rate_interval"), panel["title"]


def test_a_band_holding_everything_is_not_on_the_panels_edge() -> None:
    (share,) = [p for p in row() if p["title"] == "Share of draft tokens by band"]
    assert share["fieldConfig"]["defaults"]["max"] >= 1.05


def test_only_the_parts_that_moved_are_drawn() -> None:
    (split,) = [p for p in row() if p["title"].startswith("Acceptance change")]
    least = DEFAULT.breakdown.min_part
    for target in split["targets"]:
        assert f">= {least}" in target["expr"] and f"<= -{least}" in target["expr"]
    assert [t["legendFormat"] for t in split["targets"]] == [
        "{{route}} mix along {{dimension}}",
        "{{route}} within bands",
    ]


def test_the_previews_title_the_span_as_grafana_does(monkeypatch: pytest.MonkeyPatch) -> None:
    """query_result's line `{unit="min"} 16 <ms>` through the variable's regex: the value
    16, the text min, in the title as `$baseline ${baseline:text}`."""
    answers = {"unit": "min"}

    def instant(base: str, expr: str, at: float | None = None) -> list[JSON]:
        assert expr.startswith("(label_replace(round(max(" + slices.SPAN), expr
        return [{"metric": answers, "value": [1_700_000_000.0, "16"]}]

    monkeypatch.setattr(live, "instant", instant)
    monkeypatch.setattr(live, "label_values", lambda *_: ["specdec"])
    values = live.resolve_variables(BOARD, "http://prometheus", {}, 0.0, 1.0)
    assert (values["baseline"], values["baseline:text"]) == ("16", "min")
    title = _with_values(row()[0]["title"], values)
    assert title == f"Why acceptance moved: the last {WINDOW} against the 16 min before it"
