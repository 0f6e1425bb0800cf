"""What the previews (and Grafana) show: tick labels that tell the ticks apart, no "c/s"
unit, one unit per graph (memory and file descriptors apart), and the speedup panel's
break-even line as a series with a legend entry; and the previews stay a docs tool, out of
the wheel, with a command line of their own."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from setuptools import find_namespace_packages

from dashboards.boards.build import dashboards
from dashboards.boards.panels import JSON, PER_SECOND

# the formatter needs matplotlib (a test extra)
from harness.previews.draw import fmt_value, formatter

ROOT = Path(__file__).resolve().parents[2]


def panels() -> list[JSON]:
    return [p for board in dashboards().values() for p in board["panels"]]


@pytest.mark.parametrize(
    ("unit", "decimals", "ticks"),
    [
        ("percentunit", None, [0.36, 0.365, 0.37, 0.375]),
        ("suffix:x", 2, [1.0, 1.005, 1.01]),
        ("bytes", None, [60.0 * 2**20, 60.25 * 2**20, 60.5 * 2**20]),
        ("suffix: tok/s", None, [100.0, 100.5, 101.0]),
        ("", None, [0.0, 0.25, 0.5, 0.75, 1.0]),
    ],
)
def test_tick_labels_tell_the_ticks_apart(
    unit: str, decimals: int | None, ticks: list[float]
) -> None:
    labels = formatter(unit, decimals).format_ticks(ticks)
    assert len(set(labels)) == len(labels), labels


def test_round_ticks_keep_short_labels() -> None:
    assert formatter("percentunit", None).format_ticks([0.0, 0.2, 0.4]) == ["0%", "20%", "40%"]


def test_events_per_second_read_per_second() -> None:
    assert PER_SECOND == "suffix:/s" and fmt_value(0.5, PER_SECOND, None) == "0.50/s"
    units = {p["fieldConfig"]["defaults"].get("unit") for p in panels() if "fieldConfig" in p}
    assert "cps" not in units


def test_one_unit_per_graph() -> None:
    """A second axis hides one line behind another: no override changes a graph's unit or axis."""
    for panel in panels():
        if panel["type"] != "timeseries":
            continue
        for override in panel["fieldConfig"]["overrides"]:
            ids = {p["id"] for p in override["properties"]}
            assert not ids & {"unit", "custom.axisPlacement"}, panel["title"]


def test_the_speedup_break_even_is_a_series_with_a_legend_entry() -> None:
    (speedup,) = [p for p in panels() if p["title"] == "Speedup: estimated and measured"]
    legends = [t["legendFormat"] for t in speedup["targets"]]
    assert any(f.startswith("break-even 1x") for f in legends), legends
    assert speedup["fieldConfig"]["defaults"]["custom"]["thresholdsStyle"]["mode"] == "off"


def test_a_table_cell_shows_its_value_mapping_as_grafana_does() -> None:
    """The Requests table's Confidence column maps 0 -> "ok", 1 -> "low confidence"."""
    from harness.previews.draw import table_rows
    from harness.previews.live import Query

    (table,) = [p for p in panels() if p["title"] == "Routes: acceptance with its 95 % interval"]
    queries = [
        Query("r", table["id"], table["title"], t["refId"], t["expr"], True, "")
        for t in table["targets"]
    ]
    results = [
        (q, {"metric": {"route": route, "model_name": "m"}, "value": [0, "1" if low else "0"]})
        for q in queries
        for route, low in (("a", False), ("b", True))
    ]
    header, body, _ = table_rows(table, results)
    column = header.index("Confidence")
    assert [row[column] for row in body] == ["ok", "low confidence"], (header, body)


def test_the_wheel_ships_no_preview_code() -> None:
    """pyproject's package discovery (namespace packages, its include list) finds no package of
    the harness; nothing it ships imports the harness, and the mixin draws nothing (matplotlib
    stays `specdec measure --plot`'s)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    include = config["tool"]["setuptools"]["packages"]["find"]["include"]
    shipped = find_namespace_packages(str(ROOT), include=include)
    assert "dashboards.boards" in shipped and "exporter.core" in shipped, shipped
    assert not [p for p in shipped if not p.startswith(("exporter", "dashboards"))], shipped
    wrong = [
        str(path.relative_to(ROOT))
        for package in shipped
        for path in (ROOT / package.replace(".", "/")).glob("*.py")
        if re.search(
            r"^\s*(?:from|import) (?:harness|matplotlib)\b"
            if package.startswith("dashboards")
            else r"^\s*(?:from|import) harness\b",
            path.read_text(encoding="utf-8"),
            re.MULTILINE,
        )
    ]
    assert not wrong, wrong


def test_the_previews_command_names_a_prometheus_it_cannot_reach(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from harness.previews.__main__ import main

    assert main([str(tmp_path), "--prometheus", "http://127.0.0.1:9", "--range", "5m"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("previews: cannot query Prometheus at http://127.0.0.1:9"), err
    assert not list(tmp_path.iterdir())
