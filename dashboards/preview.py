"""PNG previews: each panel in its gridPos with its live query results, so a reviewer without
Grafana sees what users will see. Needs matplotlib (optional)."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dashboards.live import (
    Query,
    annotation_queries,
    instant,
    panel_queries,
    range_query,
    regex_escape,
    resolve_variables,
    substitute,
    variable_values,
)
from dashboards.panels import JSON

# --- preview -------------------------------------------------------------------------------


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


class Fetcher:
    def __init__(self, base: str, values: dict[str, str], range_s: float, now: float) -> None:
        self.base, self.values, self.range_s, self.now = base, values, range_s, now
        self.range_text = f"{int(range_s)}s"
        self.step = max(1.0, range_s / 240)
        self._alerts: dict[str, list[tuple[float, float]]] = {}

    def expr_of(self, expr: str) -> str:
        return substitute(expr, self.values, self.range_text)

    def expr(self, query: Query) -> str:
        return self.expr_of(query.expr)

    def series(self, queries: Sequence[Query]) -> list[Series]:
        out = []
        for q in queries:
            result = range_query(
                self.base, self.expr(q), self.now - self.range_s, self.now, self.step
            )
            for item in result:
                points = [(float(t), float(v)) for t, v in item["values"]]
                out.append(
                    Series(
                        legend(q.legend, item["metric"]),
                        q.ref,
                        [t for t, _ in points],
                        [v for _, v in points],
                    )
                )
        return out

    def alerts(self, data: JSON) -> list[tuple[float, float]]:
        """(start, end) of each firing period of the dashboard's annotation queries."""
        key = str(data["uid"])
        if key not in self._alerts:
            regions = []
            for expr in annotation_queries(data):
                start, end = self.now - self.range_s, self.now
                for item in range_query(self.base, self.expr_of(expr), start, end, self.step):
                    times = [float(t) for t, _ in item["values"]]
                    first = prev = times[0]
                    for t in times[1:]:
                        if t - prev > 2 * self.step:  # a gap: the alert resolved in between
                            regions.append((first, prev))
                            first = t
                        prev = t
                    regions.append((first, prev))
            self._alerts[key] = regions
        return self._alerts[key]

    def latest(self, queries: Sequence[Query]) -> list[tuple[Query, JSON]]:
        return [(q, item) for q in queries for item in instant(self.base, self.expr(q), self.now)]


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


def _draw_timeseries(ax: Any, panel: JSON, data: list[Series], now: float, span: float) -> None:
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
    ax.yaxis.set_major_formatter(_formatter(unit, decimals))
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


def _formatter(unit: str, decimals: int | None) -> Any:
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


def _draw_values(ax: Any, panel: JSON, rows: list[tuple[str, float]]) -> None:
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


def _table_rows(
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


def _draw_table(ax: Any, panel: JSON, results: list[tuple[Query, JSON]]) -> None:
    ax.set_axis_off()
    header, body, colours = _table_rows(panel, results)
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


def _with_values(title: str, values: dict[str, str]) -> str:
    """A title with its `$variable`s replaced as Grafana shows them (several values: a, b)."""

    def value(match: re.Match[str]) -> str:
        found = values.get(match.group(1))
        if found is None:
            return match.group(0)
        shown = ", ".join(found.strip("()").split("|"))
        return "all" if found in (".+", ".*") else re.sub(r"\\(.)", r"\1", shown)

    return re.sub(r"\$(\w+)", value, title)


WIDTH_IN, UNIT_IN, HEAD_IN = 22.0, 0.36, 0.6  # 24 columns; one grid unit (30 px); the title


def preview(
    data: JSON, base: str, out: Path, values: dict[str, str], range_s: float, now: float
) -> Path:
    """Render one dashboard as a PNG of its panels in their grid positions."""
    from matplotlib.figure import Figure  # type: ignore[import-not-found,unused-ignore]

    values = resolve_variables(data, base, values, now - range_s, now)
    rows = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in data["panels"])
    height_in = rows * UNIT_IN + HEAD_IN
    fig = Figure(figsize=(WIDTH_IN, height_in), dpi=80, facecolor=BACKGROUND)
    fig.text(
        0.005,
        1 - 0.25 / height_in,
        f"{data['title']}   (preview: last {int(range_s // 60)} min, {base})",
        color=TEXT,
        fontsize=13,
        va="center",
    )
    queries = panel_queries(data)
    for panel, (gx, gy, gw, gh), own in _repeated(data, base, values, range_s, now):
        x0, w = gx / 24, gw / 24
        top = 1 - (HEAD_IN + gy * UNIT_IN) / height_in
        h = gh * UNIT_IN / height_in
        inner = _draw_frame(fig, panel, _with_values(panel.get("title", ""), own),
                            (x0, top - h, w, h), height_in)  # fmt: skip
        mine = [q for q in queries if q.panel_id == panel["id"]]
        fetch = Fetcher(base, own, range_s, now)
        _draw_panel(fig, inner, panel, fetch, mine, data)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{data['uid']}.png"
    fig.savefig(path, facecolor=BACKGROUND)
    return path


def _draw_frame(
    fig: Any, panel: JSON, title: str, box: tuple[float, float, float, float], height_in: float
) -> tuple[float, float, float, float]:
    """The panel's frame and title at `box` (figure fractions); the box left for its content."""
    x0, y0, w, h = box
    frame = fig.add_axes((x0 + 0.002, y0 + 0.002, w - 0.004, h - 0.004))
    frame.set_facecolor(PANEL)
    frame.set_xticks([])
    frame.set_yticks([])
    for spine in frame.spines.values():
        spine.set_color(GRID)
    frame.set_title(title, color=TEXT, fontsize=9, loc="left", pad=-12, y=1.0, x=0.01)
    axes = panel["type"] in ("timeseries", "heatmap")  # room for tick labels
    left, right, bottom, head = (0.95, 0.2, 0.45, 0.4) if axes else (0.1, 0.1, 0.1, 0.4)
    return (
        x0 + left / WIDTH_IN,
        y0 + bottom / height_in,
        w - (left + right) / WIDTH_IN,
        h - (bottom + head) / height_in,
    )


def _draw_panel(
    fig: Any, inner: tuple[float, float, float, float], panel: JSON, fetch: Fetcher,
    mine: list[Query], data: JSON,
) -> None:  # fmt: skip
    """The panel's content as its type draws it, or its noValue text when nothing came."""
    kind, now = panel["type"], fetch.now
    if kind == "timeseries":
        series = fetch.series(mine)
        ax = fig.add_axes(inner, facecolor=PANEL)
        _draw_timeseries(ax, panel, series, now, fetch.range_s)
        _draw_alerts(ax, fetch.alerts(data), now)
        empty = not series
    elif kind in ("stat", "bargauge"):
        latest = fetch.latest(mine)
        ax = fig.add_axes(inner)
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        shown = [(legend(q.legend, item["metric"]), float(item["value"][1])) for q, item in latest]
        _draw_values(ax, panel, shown)
        empty = not shown
    elif kind == "table":
        latest = fetch.latest(mine)
        ax = fig.add_axes(inner)
        _draw_table(ax, panel, latest)
        empty = not latest
    elif kind == "heatmap":
        series = fetch.series(mine)
        ax = fig.add_axes(inner, facecolor=PANEL)
        _draw_heatmap(ax, panel, series, now)
        empty = not series
    else:
        return
    if empty:
        no_value = panel["fieldConfig"]["defaults"].get("noValue", "No data")
        ax.text(0.5, 0.5, no_value, color=TEXT, ha="center", va="center", fontsize=12,
                transform=ax.transAxes)  # fmt: skip


def _repeated(
    data: JSON, base: str, values: dict[str, str], range_s: float, now: float
) -> list[tuple[JSON, tuple[float, float, float, float], dict[str, str]]]:
    """Each panel with its grid box and variable values; a repeated one as Grafana shows it:
    one copy per value of its variable (side by side, at most maxPerRow a row), each copy's
    queries and title seeing its one value. The copies share the panel's box."""
    variables = {v["name"]: v for v in data.get("templating", {}).get("list", [])}
    out = []
    for panel in data["panels"]:
        g = panel["gridPos"]
        box = (float(g["x"]), float(g["y"]), float(g["w"]), float(g["h"]))
        name = panel.get("repeat")
        if not name or name not in variables:
            out.append((panel, box, values))
            continue
        chosen = values.get(name, ".*")
        found = [
            v
            for v in variable_values(variables[name], base, values, now - range_s, now)
            if re.fullmatch(chosen, v)
        ]
        if not found:
            out.append((panel, box, values))
            continue
        per_row = min(len(found), int(panel.get("maxPerRow") or 4))
        rows = -(-len(found) // per_row)
        w, h = box[2] / per_row, box[3] / rows
        for i, value in enumerate(found):
            at = (box[0] + (i % per_row) * w, box[1] + (i // per_row) * h, w, h)
            out.append((panel, at, {**values, name: regex_escape(value)}))
    return out


def _draw_heatmap(ax: Any, panel: JSON, data: list[Series], now: float) -> None:
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


def _draw_alerts(ax: Any, regions: list[tuple[float, float]], now: float) -> None:
    """Firing-alert regions, as the dashboard's annotations draw them."""
    for start, end in regions:
        ax.axvspan((start - now) / 60, (end - now) / 60, color=NAMED["red"], alpha=0.15, lw=0)
