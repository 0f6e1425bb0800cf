"""grafanalib's dashboard as the JSON Grafana 10-12 loads: encoded with grafanalib's own
encoder, then stripped of nulls and of the keys its schema no longer has (only deletions), so
the committed dashboards diff cleanly and pass the schema check."""

from __future__ import annotations

import json
from typing import Any

from grafanalib._gen import DashboardEncoder  # grafanalib's one encoder (no public name)

from dashboards.boards.panels import JSON

# keys grafanalib emits that Grafana 10-12's dashboard schema no longer has
OLD_DASHBOARD_KEYS = {"__inputs", "hideControls", "rows", "sharedCrosshair", "style"}
OLD_PANEL_KEYS = {
    "columns",  # Table: pre-8 layout
    "color",  # Table: panel-level, Grafana reads fieldConfig.defaults.color
    "editable",
    "error",
    "fontSize",
    "height",
    "mappings",  # Table: panel-level mappings are ignored (fieldConfig.defaults.mappings)
    "minSpan",
    "span",
    "styles",
}
OLD_VARIABLE_KEYS = {"auto", "auto_count", "auto_min", "tagValuesQuery", "tagsQuery", "useTags"}
OLD_TIMEPICKER_KEYS = {"time_options"}


def _drop_nulls(value: Any) -> Any:
    """Remove null-valued keys, except a threshold step's `value` (the base step's is null:
    "from minus infinity"; the schema types it `number | null`)."""
    if isinstance(value, dict):
        step = "color" in value and "value" in value
        return {
            k: _drop_nulls(v) for k, v in value.items() if v is not None or (step and k == "value")
        }
    if isinstance(value, list):
        return [_drop_nulls(v) for v in value]
    return value


def _panel(panel: JSON) -> JSON:
    for key in OLD_PANEL_KEYS:
        panel.pop(key, None)
    config = panel.setdefault("fieldConfig", {"defaults": {}})
    config.setdefault("defaults", {})
    config.setdefault("overrides", [])
    if panel.get("type") == "row":
        panel["panels"] = [_panel(p) for p in panel.get("panels", [])]
    return panel


def normalise(data: JSON) -> JSON:
    """grafanalib's dashboard JSON without nulls and pre-schema keys; only deletes keys (plus an
    empty `fieldConfig` / `overrides` where a panel lacks them)."""
    out: JSON = _drop_nulls(data)
    for key in OLD_DASHBOARD_KEYS:
        out.pop(key, None)
    for key in OLD_TIMEPICKER_KEYS:
        out.get("timepicker", {}).pop(key, None)
    for variable in out.get("templating", {}).get("list", []):
        for key in OLD_VARIABLE_KEYS:
            variable.pop(key, None)
        variable.get("current", {}).pop("tags", None)
    out["panels"] = [_panel(p) for p in out.get("panels", [])]
    return out


def to_json(dash: Any) -> JSON:
    """The dashboard as normalised plain JSON data (via grafanalib's encoder)."""
    raw: JSON = json.loads(json.dumps(dash.to_json_data(), cls=DashboardEncoder))
    return normalise(raw)
