"""Panel building blocks on top of grafanalib 0.7.1, and the normaliser for its output.

grafanalib is the authoring layer; what it gets wrong for Grafana 10-12 is handled here once:
datasource references as `{type, uid}` through the `datasource` variable, targets without the
legacy Graphite/`intervalFactor: 2` keys, thresholds as modern steps, a small raw panel for
bar gauges and heatmaps (grafanalib's emit the Grafana 6 and pre-9 layouts), "No traffic" instead of an empty
or NaN panel, and `normalise()`, which deletes the nulls and old keys Grafana's schema rejects
(it never renames anything).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from grafanalib import core as G

from exporter.core.durations import parse_duration

JSON = dict[str, Any]

DATASOURCE: JSON = {"type": "prometheus", "uid": "${datasource}"}
SCHEMA_VERSION = 36  # 37+ would need what its migrations add: showLegend, table cellOptions
NO_TRAFFIC = "No traffic"


def no_value_for(queries: Sequence[tuple[str, str]]) -> str:
    """What an empty panel says, short enough for a stat panel or a table cell: a panel of
    full-window figures (an `offset` history guard, see dashboards/queries/panel_queries.py) is
    also empty while traffic flows, until its routes or engines have the window's history."""
    windows = sorted(
        {
            w
            for _, expr in queries
            if "group by" in expr
            for w in re.findall(r" offset (\w+)", expr)
        },
        key=parse_duration,
    )
    if not windows:
        return NO_TRAFFIC
    return f"No full {windows[-1]} of data yet"


# units (Grafana unit ids; "suffix:" is Grafana's custom-unit syntax)
PERCENT = "percentunit"
TIMES = "suffix:x"
TOKENS_PER_SECOND = "suffix: tok/s"
TOKENS_PER_STEP = "suffix: tok/step"
SECONDS = "s"
REQUESTS_PER_SECOND = "reqps"
PER_SECOND = "suffix:/s"  # events per second (Grafana's "cps" reads "c/s")
BYTES = "bytes"
COUNT = "short"
PERCENTAGE_POINTS = "suffix: pp"  # a change of a ratio, x 100 in the query
DRAFTS_PER_TOKEN = "suffix: drafts/token"  # draft tokens per completion token

GREEN, YELLOW, ORANGE, RED, BLUE = "green", "yellow", "orange", "red", "blue"
TRANSPARENT = "transparent"  # a threshold step that only draws its line


def steps(base: str, *levels: tuple[float, str]) -> list[JSON]:
    """Threshold steps: `base` colour below the first level, then each (value, colour)."""
    return [{"color": base, "value": None}] + [{"color": c, "value": v} for v, c in levels]


NEUTRAL = steps(BLUE)
SPEEDUP = steps(RED, (1.0, GREEN))  # above 1 speculation pays
UP_DOWN = steps(RED, (1.0, GREEN))


@dataclass(frozen=True)
class PromTarget:
    """A Prometheus query as Grafana 10-12 store it (grafanalib's Target adds a Graphite
    `target`, `intervalFactor: 2` and a fixed `step`)."""

    expr: str
    ref: str
    legend: str = ""
    instant: bool = False
    table: bool = False
    heatmap: bool = False  # a histogram's buckets as heatmap rows (legend {{le}})
    exemplar: bool = False  # the series' exemplars too: a dot per request, linked to its trace

    def to_json_data(self) -> JSON:
        return ({"exemplar": True} if self.exemplar else {}) | {
            "datasource": DATASOURCE,
            "editorMode": "code",
            "expr": self.expr,
            "format": "table" if self.table else "heatmap" if self.heatmap else "time_series",
            "instant": self.instant or self.table,
            "legendFormat": self.legend,
            "range": not (self.instant or self.table),
            "refId": self.ref,
        }


class RawPanel(G.Panel):  # type: ignore[misc]  # grafanalib is untyped
    """A panel type with raw `options` / `fieldConfig` (bar gauge: grafanalib's is Grafana 6)."""

    def __init__(self, *, type: str, options: JSON, fieldConfig: JSON, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.type, self.options, self.fieldConfig = type, options, fieldConfig

    def to_json_data(self) -> JSON:
        return dict(
            self.panel_json(
                {"type": self.type, "options": self.options, "fieldConfig": self.fieldConfig}
            )
        )


def targets(
    *queries: tuple[str, str], instant: bool = False, table: bool = False
) -> list[PromTarget]:
    """(legend, expr) pairs as targets A, B, C ...; `table`: instant queries in table format."""
    return [
        PromTarget(expr, chr(ord("A") + i), legend, instant, table)
        for i, (legend, expr) in enumerate(queries)
    ]


def by_ref(ref: str, *properties: JSON) -> JSON:
    return {"matcher": {"id": "byFrameRefID", "options": ref}, "properties": list(properties)}


def by_name(name: str, *properties: JSON) -> JSON:
    return {"matcher": {"id": "byName", "options": name}, "properties": list(properties)}


def prop(key: str, value: Any) -> JSON:
    return {"id": key, "value": value}


def fixed(color: str) -> JSON:
    return prop("color", {"fixedColor": color, "mode": "fixed"})


def dashed() -> JSON:
    return prop("custom.lineStyle", {"dash": [10, 10], "fill": "dash"})


def reference_line(ref: str, color: str = RED) -> JSON:
    """Override for a reference series (break-even, ceiling): dashed, fixed colour, no fill."""
    return by_ref(ref, dashed(), fixed(color), prop("custom.fillOpacity", 0))


def timeseries(
    title: str,
    description: str,
    queries: Sequence[tuple[str, str]],
    unit: str,
    *,
    overrides: Iterable[JSON] = (),
    thresholds: list[JSON] | None = None,
    threshold_style: str = "off",
    min_value: int | None = None,
    max_value: int | None = None,
    decimals: int | None = None,
    stack: bool = False,
    fill: int = 0,
    no_value: str | None = None,
    repeat: str = "",
    defaults: JSON | None = None,
) -> Any:
    """`repeat`: one panel per value of that variable (its queries see one value each);
    `fill`: opacity of the area below each line (%); `defaults`: more field defaults (a
    fractional max)."""
    return G.TimeSeries(
        title=title,
        repeat=_repeat(repeat),
        description=description,
        dataSource=DATASOURCE,
        targets=targets(*queries),
        unit=unit,
        maxDataPoints=None,
        interval=None,
        lineWidth=2,
        fillOpacity=10 if stack else fill,
        stacking={"group": "A", "mode": "normal"} if stack else {"mode": "none"},
        legendDisplayMode="list",
        legendPlacement="bottom",
        legendCalcs=["lastNotNull"],
        tooltipMode="multi",
        thresholds=thresholds if thresholds is not None else steps(GREEN),
        thresholdsStyleMode=threshold_style,
        valueMin=min_value,
        valueMax=max_value,
        valueDecimals=decimals,
        overrides=list(overrides),
        extraJson={
            "fieldConfig": {
                "defaults": {"noValue": no_value or no_value_for(queries), **(defaults or {})}
            }
        },
    )


def tokens_per_step(description: str, figure: tuple[str, str], ceiling: tuple[str, str]) -> Any:
    """Tokens per verify step against its ceiling k + 1 (dashed): one chart on two boards, per
    engine (the engine board) and per route (the payoff board)."""
    return timeseries(
        "Tokens per step vs the k+1 ceiling",
        description,
        [figure, ceiling],
        TOKENS_PER_STEP,
        min_value=1,
        decimals=2,
        overrides=[reference_line("B", ORANGE)],
    )


def stat(
    title: str,
    description: str,
    queries: Sequence[tuple[str, str]],
    unit: str,
    *,
    thresholds: list[JSON] = NEUTRAL,
    decimals: int | None = None,
    mappings: list[JSON] | None = None,
    text_mode: str = "value_and_name",
    graph: bool = True,
    no_value: str | None = None,
    instant: bool = False,
) -> Any:
    """`instant`: the value now only (a series whose labels change over the range, say a
    cause, would otherwise leave its last value beside the new one); no sparkline then."""
    return G.Stat(
        title=title,
        description=description,
        dataSource=DATASOURCE,
        targets=targets(*queries, instant=instant),
        format=unit,
        decimals=decimals,
        color={"mode": "thresholds"},
        colorMode="value",
        graphMode="area" if graph and not instant else "none",
        textMode=text_mode,
        reduceCalc="lastNotNull",
        noValue=no_value or no_value_for(queries),
        thresholds=thresholds,
        mappings=mappings or [],
        maxDataPoints=None,
    )


def heatmap(
    title: str, description: str, expr: str, unit: str, *, repeat: str = "", exemplar: bool = False
) -> Any:
    """A Prometheus histogram's buckets over time (grafanalib's Heatmap is the pre-9 layout).
    `repeat`: one panel per value of that variable; `exemplar`: its requests as dots."""
    return RawPanel(
        type="heatmap",
        title=title,
        repeat=_repeat(repeat),
        description=description,
        dataSource=DATASOURCE,
        targets=[PromTarget(expr, "A", "{{le}}", heatmap=True, exemplar=exemplar)],
        maxDataPoints=None,
        options={
            "calculate": False,
            "cellGap": 1,
            "color": {
                "exponent": 0.5,
                "fill": ORANGE,
                "mode": "scheme",
                "reverse": False,
                "scale": "exponential",
                "scheme": "Oranges",
                "steps": 64,
            },
            "exemplars": {"color": "rgba(255,0,255,0.7)"},
            "filterValues": {"le": 1e-9},
            "legend": {"show": True},
            "rowsFrame": {"layout": "auto"},
            "showValue": "never",
            "tooltip": {"mode": "single", "showColorScale": False, "yHistogram": True},
            "yAxis": {"axisPlacement": "left", "reverse": False, "unit": unit, "decimals": 0},
        },
        fieldConfig={
            "defaults": {
                "custom": {"scaleDistribution": {"type": "linear"}},
                "noValue": NO_TRAFFIC,
            },
            "overrides": [],
        },
    )


def _repeat(variable: str) -> Any:
    if not variable:
        return G.Repeat()
    return G.Repeat(direction="h", variable=variable, maxPerRow=4)


def up_mappings(up: str = "UP", down: str = "DOWN") -> list[JSON]:
    return [
        {
            "options": {
                "0": {"color": RED, "index": 0, "text": down},
                "1": {"color": GREEN, "index": 1, "text": up},
            },
            "type": "value",
        }
    ]


def bargauge(
    title: str,
    description: str,
    queries: Sequence[tuple[str, str]],
    unit: str,
    *,
    min_value: float = 0,
    max_value: float | None = None,
    thresholds: list[JSON] = NEUTRAL,
    no_value: str | None = None,
) -> Any:
    """A horizontal bar per series, each showing its last value (instant queries)."""
    defaults: JSON = {
        "color": {"mode": "thresholds"},
        "min": min_value,
        "noValue": no_value or no_value_for(queries),
        "unit": unit,
        "decimals": 1,
    }
    if max_value is not None:
        defaults["max"] = max_value
    return RawPanel(
        type="bargauge",
        title=title,
        description=description,
        dataSource=DATASOURCE,
        targets=targets(*queries, instant=True),
        thresholds=thresholds,
        maxDataPoints=None,
        options={
            "displayMode": "gradient",
            "orientation": "horizontal",
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "showUnfilled": True,
            "text": {},
        },
        fieldConfig={"defaults": defaults, "overrides": []},
    )


def table(
    title: str,
    description: str,
    queries: Sequence[tuple[str, str]],
    *,
    columns: dict[str, str],
    hide: Sequence[str] = ("Time",),
    overrides: Iterable[JSON] = (),
    sort_by: str | None = None,
    no_value: str | None = None,
) -> Any:
    """Instant queries in table format merged into one row per label set.

    `columns` renames the value columns ("Value #A" -> a header) and orders them after the
    label columns; `hide` drops columns (the timestamp by default).
    """
    order = {name: i for i, name in enumerate(columns)}
    return G.Table(
        title=title,
        description=description,
        dataSource=DATASOURCE,
        targets=targets(*queries, table=True),
        maxDataPoints=None,
        overrides=list(overrides),
        thresholds=steps(GREEN),
        sortBy=[G.TableSortByField(displayName=columns[sort_by])] if sort_by else [],
        transformations=[
            {"id": "merge", "options": {}},
            {
                "id": "organize",
                "options": {
                    "excludeByName": {name: True for name in hide},
                    "indexByName": order,
                    "renameByName": columns,
                },
            },
        ],
        extraJson={"fieldConfig": {"defaults": {"noValue": no_value or no_value_for(queries)}}},
    )


def layout(rows: Sequence[tuple[int, Sequence[Any]]]) -> list[Any]:
    """Place panels row by row: (height, panels) with the row's 24 columns shared equally
    (a panel given as (panel, width) takes that width instead); number them in that order."""
    placed: list[Any] = []
    y = 0
    for height, panels in rows:
        items = [p if isinstance(p, tuple) else (p, None) for p in panels]
        fixed_width = sum(w for _, w in items if w is not None)
        free = [p for p, w in items if w is None]
        share = (24 - fixed_width) // len(free) if free else 0
        x = 0
        for panel, width in items:
            w = width if width is not None else share
            panel.gridPos = G.GridPos(h=height, w=w, x=x, y=y)
            panel.id = len(placed) + 1
            placed.append(panel)
            x += w
        y += height
    return placed


ALERTS_EXPR = 'ALERTS{alertname=~"SpecDecode.*", alertstate="firing"}'


def alert_annotations() -> JSON:
    """Firing specdec alerts (Prometheus' ALERTS series) as regions on every time series."""
    return {
        "datasource": DATASOURCE,
        "enable": True,
        "hide": False,
        "iconColor": RED,
        "name": "specdec alerts",
        "tagKeys": "alertname,severity,route,model_name",
        "target": {"expr": ALERTS_EXPR, "interval": "1m", "refId": "Anno"},
        "textFormat": "{{route}} {{model_name}} {{target}}",
        "titleFormat": "{{alertname}} ({{severity}})",
        "useValueForTime": False,
    }


def dashboard(
    uid: str,
    title: str,
    description: str,
    variables: Sequence[Any],
    rows: Sequence[tuple[int, Sequence[Any]]],
    tags: Sequence[str],
) -> Any:
    return G.Dashboard(
        uid=uid,
        title=title,
        description=description,
        tags=list(tags),
        editable=True,
        schemaVersion=SCHEMA_VERSION,
        graphTooltip=G.GRAPH_TOOLTIP_MODE_SHARED_CROSSHAIR,
        timezone="browser",
        refresh="30s",
        time=G.Time("now-3h", "now"),
        templating=G.Templating(list=list(variables)),
        annotations=G.Annotations(list=[alert_annotations()]),
        links=[
            {
                "asDropdown": False,
                "icon": "external link",
                "includeVars": True,
                "keepTime": True,
                "tags": ["specdec"],
                "targetBlank": False,
                "title": "specdec dashboards",
                "tooltip": "The other specdec dashboards, with the same variables and time range",
                "type": "dashboards",
            }
        ],
        panels=layout(rows),
    )
