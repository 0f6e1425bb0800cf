"""PNG previews: each panel in its gridPos with its live query results, so a reviewer without
Grafana sees what users will see (the drawing of each panel kind: draw.py). Needs
matplotlib (optional)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dashboards.boards.panels import JSON
from harness.previews.draw import (
    BACKGROUND,
    GRID,
    PANEL,
    TEXT,
    Series,
    draw_alerts,
    draw_heatmap,
    draw_table,
    draw_timeseries,
    draw_values,
    legend,
)
from harness.previews.live import (
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


def _with_values(title: str, values: dict[str, str]) -> str:
    """A title with its `$variable`s (`${variable}`, `${variable:text}`) replaced as Grafana
    shows them (several values: a, b)."""

    def value(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(3)
        found = values.get(f"{name}:text" if match.group(2) == "text" else name)
        if found is None:
            return match.group(0)
        shown = ", ".join(found.strip("()").split("|"))
        return "all" if found in (".+", ".*") else re.sub(r"\\(.)", r"\1", shown)

    return re.sub(r"\$\{(\w+)(?::(\w+))?\}|\$(\w+)", value, title)


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
        draw_timeseries(ax, panel, series, now, fetch.range_s)
        draw_alerts(ax, fetch.alerts(data), now)
        empty = not series
    elif kind in ("stat", "bargauge"):
        latest = fetch.latest(mine)
        ax = fig.add_axes(inner)
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1)
        shown = [(legend(q.legend, item["metric"]), float(item["value"][1])) for q, item in latest]
        draw_values(ax, panel, shown)
        empty = not shown
    elif kind == "table":
        latest = fetch.latest(mine)
        ax = fig.add_axes(inner)
        draw_table(ax, panel, latest)
        empty = not latest
    elif kind == "heatmap":
        series = fetch.series(mine)
        ax = fig.add_axes(inner, facecolor=PANEL)
        draw_heatmap(ax, panel, series, now)
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
