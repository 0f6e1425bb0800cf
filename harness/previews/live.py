"""The queries of a dashboard with its variables substituted, and the Prometheus HTTP API to
run them: shared by the preview and by the test that every panel returns data."""

from __future__ import annotations

import json
import re
import urllib.parse
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dashboards.boards.panels import JSON

# --- queries of a dashboard, with variables substituted ------------------------------------------


@dataclass(frozen=True)
class Query:
    dashboard: str
    panel_id: int
    panel: str
    ref: str
    expr: str
    instant: bool
    legend: str


def panel_queries(data: JSON) -> list[Query]:
    """Every target of every panel (rows included)."""
    out = []

    def visit(panels: Sequence[JSON]) -> None:
        for panel in panels:
            visit(panel.get("panels", []))
            for target in panel.get("targets", []):
                out.append(
                    Query(
                        dashboard=str(data["uid"]),
                        panel_id=int(panel["id"]),
                        panel=str(panel.get("title", "")),
                        ref=str(target["refId"]),
                        expr=str(target["expr"]),
                        instant=bool(target.get("instant")) and not target.get("range"),
                        legend=str(target.get("legendFormat", "")),
                    )
                )

    visit(data.get("panels", []))
    return out


def annotation_queries(data: JSON) -> list[str]:
    return [
        str(a["target"]["expr"])
        for a in data.get("annotations", {}).get("list", [])
        if isinstance(a.get("target"), dict) and "expr" in a["target"]
    ]


BUILTINS = {"__rate_interval": "1m", "__interval": "15s", "__range": "1h"}


def substitute(expr: str, values: dict[str, str] | None = None, range_: str = "1h") -> str:
    """Replace Grafana's `$var` / `${var}` the way a default dashboard view would: dashboard
    variables by `values` (default `.*`, the All value), built-ins by fixed intervals."""
    values = values or {}
    builtins = {**BUILTINS, "__range": range_}

    def replace(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        if name in builtins:
            return builtins[name]
        if name.isdigit():  # label_replace's $1: no variable's name (Grafana leaves it)
            return match.group(0)
        return values.get(name, ".*")

    return re.sub(r"\$\{(\w+)\}|\$(\w+)", replace, expr)


# --- Prometheus HTTP API ------------------------------------------------------------------


class PrometheusError(RuntimeError):
    pass


def prometheus_query(base: str, path: str, params: dict[str, str], timeout: float = 10.0) -> Any:
    url = f"{base.rstrip('/')}/api/v1/{path}?{urllib.parse.urlencode(params)}"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            body = json.loads(resp.read().decode())
    except OSError as exc:
        raise PrometheusError(f"{url}: {exc}") from exc
    if body.get("status") != "success":
        raise PrometheusError(f"{url}: {body.get('error', body)}")
    return body["data"]


def instant(base: str, expr: str, at: float | None = None) -> list[JSON]:
    params = {"query": expr}
    if at is not None:
        params["time"] = f"{at:.3f}"
    data = prometheus_query(base, "query", params)
    return list(data["result"]) if data["resultType"] == "vector" else []


def label_values(base: str, metric: str, label: str, start: float, end: float) -> list[str]:
    params = {"match[]": metric, "start": f"{start:.3f}", "end": f"{end:.3f}"}
    return [str(v) for v in prometheus_query(base, f"label/{label}/values", params)]


def regex_escape(value: str) -> str:
    """A label value as a regex inside a PromQL string, as Grafana escapes it."""
    return re.sub(r"([\\$^*{}\[\]'+?.()|])", r"\\\\\1", value)


def resolve_variables(
    data: JSON, base: str, given: dict[str, str], start: float, end: float
) -> dict[str, str]:
    """Values of the dashboard's variables as Grafana uses them with "All" selected: `given`
    first, then the variable's allValue, else the alternation of the values its
    label_values() query finds (in variable order, so later queries see earlier values); a
    query_result() variable's first value, and its text as NAME:text (`${NAME:text}`)."""
    values: dict[str, str] = {}
    for var in data.get("templating", {}).get("list", []):
        name = var["name"]
        if name in given:
            values[name] = given[name]
        elif var.get("type") != "query":
            continue
        elif var.get("allValue"):
            values[name] = str(var["allValue"])
        elif str(var["query"]).startswith("query_result("):
            results = query_result(var, base, values, end)
            values[name], values[f"{name}:text"] = results[0] if results else ("", "")
        else:
            found = variable_values(var, base, values, start, end)
            values[name] = "(" + "|".join(regex_escape(v) for v in found) + ")" if found else ""
    return values


def variable_values(
    var: JSON, base: str, values: dict[str, str], start: float, end: float
) -> list[str]:
    """The values a query variable's label_values() (or query_result()) finds, with earlier
    variables' `values`."""
    if str(var["query"]).startswith("query_result("):
        return [value for value, _ in query_result(var, base, values, end)]
    query = substitute(str(var["query"]), values)
    match = re.fullmatch(r"label_values\((.*),\s*(\w+)\s*\)", query, re.DOTALL)
    if match is None:
        raise ValueError(f"variable {var['name']}: cannot resolve {query!r}")
    return label_values(base, match.group(1), match.group(2), start, end)


def query_result(var: JSON, base: str, values: dict[str, str], end: float) -> list[tuple[str, str]]:
    """(value, text) of a query_result(EXPR) variable, as Grafana makes them: each series of
    an instant query at the range's end as the line `name{a="x"} VALUE MILLISECONDS`, through
    the variable's regex (its named groups `value` and `text`, else its first group)."""
    query = substitute(str(var["query"]), values)
    expr = query[len("query_result(") : -1]
    regex = str(var.get("regex") or "")
    pattern = re.compile(regex.strip("/").replace("(?<", "(?P<")) if regex else None
    out = []
    for item in instant(base, expr, end):
        labels = dict(item["metric"])
        name = labels.pop("__name__", "")
        inner = ",".join(f'{k}="{v}"' for k, v in labels.items())
        at, value = item["value"]
        line = f"{name}{{{inner}}} {value} {int(float(at) * 1000)}"
        match = pattern.search(line) if pattern else None
        if pattern and match is None:
            continue
        if match is None:
            out.append((line, line))
        elif "value" in match.groupdict() or "text" in match.groupdict():
            found = match.groupdict()
            out.append((found.get("value") or found["text"], found.get("text") or found["value"]))
        else:
            out.append((match.group(1), match.group(1)))
    return out


def range_query(base: str, expr: str, start: float, end: float, step: float) -> list[JSON]:
    params = {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"}
    return list(prometheus_query(base, "query_range", params)["result"])
