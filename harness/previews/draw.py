"""The drawing of each panel kind for the PNG previews (time series, stat and bar gauge,
table, heatmap), in Grafana's dark theme with its units, thresholds and value mappings: what
`render.py` places in each panel's box. Needs matplotlib (optional)."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dashboards.boards.panels import JSON
from harness.previews.live import Query

BACKGROUND, PANEL, TEXT, GRID = "#111217", "#181b1f", "#ccccdc", "#2c3235"
NAMED = {
    "green": "#73bf69",
    "red": "#f2495c",
    "orange": "#ff9830",
    "yellow": "#fade2a",
    "blue": "#5794f2",
    "purple": "#b877d9",
    "text": TEXT,
}
PALETTE = ["#7eb26d", "#eab839", "#6ed0e0", "#ef843c", "#e24d42", "#1f78c1", "#ba43a9", "#705da0"]


def color(name: str) -> str:
    return NAMED.get(name, name)


def legend(fmt: str, labels: dict[str, str]) -> str:
    if not fmt:
        return "{" + ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}"
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt)


def fmt_value(value: float, unit: str, decimals: int | None) -> str:
    """A number in one of the dashboards' units, about as Grafana shows it."""
    if math.isnan(value):
        return "NaN"

    def num(v: float, default: int = 2) -> str:
        d = decimals if decimals is not None else (0 if abs(v) >= 100 else default)
        return f"{v:.{d}f}"

    if unit == "percentunit":
        return f"{num(value * 100, 1)}%"
    if unit.startswith("suffix:"):
        return f"{num(value)}{unit[len('suffix:') :]}"
    if unit == "s":
        return f"{num(value * 1000, 0)} ms" if abs(value) < 1 else f"{num(value)} s"
    if unit == "reqps":
        return f"{num(value)} req/s"
    if unit == "bytes":
        for prefix, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
            if abs(value) >= size:
                return f"{num(value / size, 1)} {prefix}"
        return f"{value:.0f} B"
    return num(value)


def threshold_color(value: float, thresholds: JSON | None, default: str = "blue") -> str:
    chosen = default
    for step in (thresholds or {}).get("steps", []):
        if step.get("value") is None or value >= step["value"]:
            chosen = step["color"]
    return color(chosen)


def mapped(value: float, mappings: Sequence[JSON]) -> tuple[str, str] | None:
    for mapping in mappings:
        if mapping.get("type") == "value":
            key = f"{value:g}"
            if key in mapping["options"]:
                result = mapping["options"][key]
                return str(result.get("text", key)), color(result.get("color", "text"))
    return None


@dataclass
class Series:
    name: str
    ref: str
    times: list[float]
    values: list[float]


def _overrides_for(panel: JSON, ref: str, name: str) -> dict[str, Any]:
    props: dict[str, Any] = {}
    for override in panel.get("fieldConfig", {}).get("overrides", []):
        matcher = override["matcher"]
        hit = (
            (matcher["id"] == "byFrameRefID" and matcher["options"] == ref)
            or (matcher["id"] == "byName" and matcher["options"] == name)
            or (matcher["id"] == "byRegexp" and re.search(matcher["options"], name) is not None)
        )
        if hit:
            props.update({p["id"]: p.get("value") for p in override["properties"]})
    return props


def draw_timeseries(ax: Any, panel: JSON, data: list[Series], now: float, span: float) -> None:
    defaults = panel["fieldConfig"]["defaults"]
    unit, decimals = defaults.get("unit", ""), defaults.get("decimals")
    handles = []
    for i, s in enumerate(data):
        props = _overrides_for(panel, s.ref, s.name)
        c = props.get("color", {}).get("fixedColor")
        (line,) = ax.plot(
            [(t - now) / 60 for t in s.times],
            s.values,
            linestyle="--" if "custom.lineStyle" in props else "-",
            linewidth=1.4,
            color=color(c) if c else PALETTE[i % len(PALETTE)],
            label=s.name,
        )
        handles.append(line)
        opacity = defaults.get("custom", {}).get("fillOpacity", 0)
        if opacity and not defaults.get("custom", {}).get("stacking", {}).get("group"):
            x = [(t - now) / 60 for t in s.times]  # the area below the line, as Grafana fills it
            ax.fill_between(x, s.values, color=line.get_color(), alpha=opacity / 200, lw=0)
        below = props.get("custom.fillBelowTo")  # a band down to the series of that name
        pairs = [o for o in data if o.name == below and o.times == s.times]
        if below and pairs:
            nth = sum(1 for o in data[:i] if o.name == s.name)  # the k-th band of k-th route
            other = pairs[min(nth, len(pairs) - 1)]
            x = [(t - now) / 60 for t in s.times]
            ax.fill_between(x, s.values, other.values, color=line.get_color(), alpha=0.2, lw=0)
    custom = defaults.get("custom", {})
    if custom.get("thresholdsStyle", {}).get("mode", "off") != "off":
        for step in defaults.get("thresholds", {}).get("steps", []):
            if step.get("value") is not None and step["color"] != "transparent":
                ax.axhline(step["value"], color=color(step["color"]), linestyle="--", lw=1)
    if "min" in defaults:
        ax.set_ylim(bottom=defaults["min"])
        _headroom(ax, [v for s in data for v in s.values], defaults["min"])
    if "max" in defaults:
        ax.set_ylim(top=defaults["max"])
    ax.set_xlim(-span / 60, 0)
    ax.yaxis.set_major_formatter(formatter(unit, decimals))
    ax.tick_params(colors=TEXT, labelsize=7)
    ax.grid(color=GRID, linewidth=0.5)
    ax.set_xlabel("minutes ago", color=TEXT, fontsize=7, labelpad=1)
    for spine in ax.spines.values():
        spine.set_color(GRID)
    if handles:
        ax.legend(
            handles=handles,
            fontsize=6,
            loc="upper left",
            facecolor=PANEL,
            edgecolor=GRID,
            labelcolor=TEXT,
            ncol=2 if len(handles) > 4 else 1,
        )


def _headroom(ax: Any, values: list[float], bottom: float) -> None:
    """With the axis pinned at `bottom`, room above the highest line up to a round tick (as
    Grafana's soft max), so a flat line is not drawn on the panel's top edge."""
    finite = [v for v in values if math.isfinite(v)]
    if not finite or max(finite) <= bottom:
        return
    top = bottom + (max(finite) - bottom) * 1.1
    ax.set_ylim(*ax.yaxis.get_major_locator().view_limits(bottom, top))
    ax.set_ylim(bottom=bottom)


def formatter(unit: str, decimals: int | None) -> Any:
    """Tick labels in the panel's unit, with as many decimals as it takes to tell the ticks
    apart (Grafana picks the axis' decimals from the tick step, not the panel's)."""
    from matplotlib.ticker import Formatter  # type: ignore[import-not-found,unused-ignore]

    class Ticks(Formatter):  # type: ignore[misc,unused-ignore]
        def __call__(self, value: float, pos: int | None = None) -> str:
            return fmt_value(value, unit, decimals)

        def format_ticks(self, values: Sequence[float]) -> list[str]:
            start = decimals if decimals is not None else 0
            for places in range(start, start + 5):
                labels = [fmt_value(v, unit, places) for v in values]
                if len(set(labels)) == len(labels):
                    return labels
            return labels

    return Ticks()


def draw_values(ax: Any, panel: JSON, rows: list[tuple[str, float]]) -> None:
    """Stat and bar gauge: one line (stat) or bar (bar gauge) per series, last value."""
    defaults = panel["fieldConfig"]["defaults"]
    unit, decimals = defaults.get("unit", ""), defaults.get("decimals")
    thresholds = defaults.get("thresholds")
    mappings = defaults.get("mappings", [])
    ax.set_axis_off()
    n = len(rows)
    if panel["type"] == "bargauge":
        low, high = defaults.get("min", 0), defaults.get("max")
        top = high if high is not None else max([v for _, v in rows] + [1e-9])
        for i, (name, value) in enumerate(rows):
            y = 1 - (i + 0.5) / n
            h = 0.6 / n
            ax.add_patch(_rect((0.45, y - h / 2), 0.45, h, GRID))
            frac = 0.0 if top == low else max(0.0, min(1.0, (value - low) / (top - low)))
            ax.add_patch(
                _rect((0.45, y - h / 2), 0.45 * frac, h, threshold_color(value, thresholds))
            )
            ax.text(0.44, y, name, ha="right", va="center", color=TEXT, fontsize=7)
            ax.text(0.91, y, fmt_value(value, unit, decimals), va="center", color=TEXT, fontsize=7)
        return
    for i, (name, value) in enumerate(rows):
        y = 1 - (i + 0.5) / n
        shown = mapped(value, mappings)
        text, c = shown or (fmt_value(value, unit, decimals), threshold_color(value, thresholds))
        size = max(9.0, min(22.0, 40.0 / n))
        ax.text(0.5, y, text, ha="left", va="center", color=c, fontsize=size, weight="bold")
        ax.text(0.47, y, name, ha="right", va="center", color=TEXT, fontsize=max(7.0, size / 2))


def _rect(xy: tuple[float, float], w: float, h: float, c: str) -> Any:
    from matplotlib.patches import Rectangle  # type: ignore[import-not-found,unused-ignore]

    return Rectangle(xy, w, h, color=c)


def table_rows(
    panel: JSON, results: list[tuple[Query, JSON]]
) -> tuple[list[str], list[list[str]], list[list[str]]]:
    """Grafana's merge + organize transformations, for instant table queries: the header,
    the cells' text and colours."""
    organize: JSON = {}
    for transformation in panel.get("transformations", []):
        if transformation["id"] == "organize":
            organize = transformation["options"]
    rows: dict[tuple[tuple[str, str], ...], dict[str, float]] = {}
    for q, item in results:
        labels = tuple(sorted((k, v) for k, v in item["metric"].items() if k != "__name__"))
        rows.setdefault(labels, {})[f"Value #{q.ref}"] = float(item["value"][1])
    rename: dict[str, str] = organize.get("renameByName", {})
    index: dict[str, int] = organize.get("indexByName", {})
    excluded = set(organize.get("excludeByName", {}))
    names = {k for labels in rows for k, _ in labels} | {k for v in rows.values() for k in v}
    names |= {k for k in rename if k.startswith("Value #")}
    columns = sorted(names - excluded, key=lambda c: (index.get(c, 99), c))
    header = [rename.get(c, c) for c in columns]
    no_value = panel["fieldConfig"]["defaults"].get("noValue", "")
    body, colours = [], []
    for labels, values in sorted(rows.items()):
        label_map = dict(labels)
        cells, tints = [], []
        for column, title in zip(columns, header, strict=True):
            props = _overrides_for(panel, "", title)
            tint = TEXT
            if column in values:
                value = values[column]
                shown = mapped(value, props.get("mappings", []))  # Grafana maps before units
                if shown is not None:
                    cells.append(shown[0])
                    tint = shown[1]
                else:
                    cells.append(fmt_value(value, props.get("unit", ""), props.get("decimals")))
                if props.get("custom.displayMode") == "color-text":
                    tint = threshold_color(value, props.get("thresholds"))
            else:
                cells.append(label_map.get(column, no_value if column.startswith("Value") else ""))
            tints.append(tint)
        body.append(cells)
        colours.append(tints)
    return header, body, colours


def draw_table(ax: Any, panel: JSON, results: list[tuple[Query, JSON]]) -> None:
    ax.set_axis_off()
    header, body, colours = table_rows(panel, results)
    if not body:
        return
    tab = ax.table(cellText=body, colLabels=header, loc="upper center", cellLoc="left")
    tab.auto_set_font_size(False)
    tab.set_fontsize(8)
    tab.scale(1, 1.4)
    for (row, col), cell in tab.get_celld().items():
        cell.set_facecolor(PANEL)
        cell.set_edgecolor(GRID)
        cell.get_text().set_color(TEXT if row == 0 else colours[row - 1][col])


def draw_heatmap(ax: Any, panel: JSON, data: list[Series], now: float) -> None:
    """Cumulative `le` buckets over time -> counts per bucket, as Grafana's heatmap draws them."""
    rows = sorted(data, key=lambda s: math.inf if s.name == "+Inf" else float(s.name))
    rows = [s for s in rows if s.name != "+Inf"]
    if not rows:
        return
    times = rows[0].times
    grid = []
    below = [0.0] * len(times)
    for s in rows:
        by_time = dict(zip(s.times, s.values, strict=True))
        level = [by_time.get(t, b) for t, b in zip(times, below, strict=True)]
        grid.append([max(0.0, a - b) for a, b in zip(level, below, strict=True)])
        below = level
    minutes = [(t - now) / 60 for t in times]
    import matplotlib as mpl  # type: ignore[import-not-found,unused-ignore]
    import numpy as np

    cmap = mpl.colormaps["inferno"].copy()
    cmap.set_bad(PANEL)  # an empty cell is the panel, as on Grafana's dark theme
    image = ax.imshow(
        np.ma.masked_less_equal(np.array(grid), 0.0),
        aspect="auto",
        origin="lower",
        cmap=cmap,
        extent=(minutes[0], minutes[-1] if len(minutes) > 1 else 0, 0, len(rows)),
        interpolation="nearest",
    )
    bar = ax.figure.colorbar(image, ax=ax, pad=0.01, fraction=0.03)
    bar.ax.tick_params(colors=TEXT, labelsize=6)
    bar.set_label("requests", color=TEXT, fontsize=7)
    unit = panel["options"].get("yAxis", {}).get("unit", "")
    labels = [fmt_value(float(s.name), unit, 0) for s in rows]
    ax.set_yticks([i + 0.5 for i in range(len(rows))][:: max(1, len(rows) // 8)])
    ax.set_yticklabels(labels[:: max(1, len(rows) // 8)], fontsize=7, color=TEXT)
    ax.tick_params(colors=TEXT, labelsize=7)
    ax.set_xlabel("minutes", color=TEXT, fontsize=7)


def draw_alerts(ax: Any, regions: list[tuple[float, float]], now: float) -> None:
    """Firing-alert regions, as the dashboard's annotations draw them."""
    for start, end in regions:
        ax.axvspan((start - now) / 60, (end - now) / 60, color=NAMED["red"], alpha=0.15, lw=0)
