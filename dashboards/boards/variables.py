"""Template variables shared by the dashboards: datasource, job, model_name, route, engine (and
a hidden one that titles read: the breakdown baseline's real span).

Every query variable is multi-value with an "All" option and panels select with
`label=~"$var"`. For model_name, route and engine All is the regex `.*`, so a new route or engine
shows up without a variable refresh. For job All is Grafana's default, the alternation of the
sidecar jobs found: `.*` would also match every other job's `up` and scrape durations.
"""

from __future__ import annotations

from typing import Any

from grafanalib import core as G

from dashboards.boards.panels import DATASOURCE

ALL = ".*"


class Variable:
    """grafanalib's Template plus a description and an explicit current selection."""

    def __init__(self, template: Any, description: str, current: dict[str, Any]) -> None:
        self.template, self.description, self.current = template, description, current

    def to_json_data(self) -> dict[str, Any]:
        data: dict[str, Any] = self.template.to_json_data()
        data["current"] = self.current
        data["description"] = self.description
        return data


def datasource(uid: str) -> Any:
    """The data source variable, its current value the provisioned Prometheus' `uid`."""
    template = G.Template(
        name="datasource",
        label="Data source",
        query="prometheus",
        type="datasource",
        regex="",
        refresh=G.REFRESH_ON_DASHBOARD_LOAD,
    )
    return Variable(
        template,
        "The Prometheus that scrapes the specdec sidecar and loads its rules.",
        {"selected": True, "text": "Prometheus", "value": uid},
    )


def query(name: str, label: str, metric: str, description: str, all_value: str | None = ALL) -> Any:
    """A `label_values(metric, name)` variable, multi-value, All = `.*` (None: the values
    found), refreshed with the time range."""
    template = G.Template(
        name=name,
        label=label,
        query=f"label_values({metric}, {name})",
        dataSource=DATASOURCE,
        multi=True,
        includeAll=True,
        allValue=all_value,
        refresh=G.REFRESH_ON_TIME_RANGE_CHANGE,
        sort=G.SORT_ALPHA_ASC,
    )
    return Variable(template, description, {"selected": True, "text": ["All"], "value": ["$__all"]})


def job() -> Any:
    return query(
        "job",
        "Sidecar job",
        "specdec_build_info",
        "Prometheus job(s) scraping the specdec sidecar. Panels on recording rules sum over all jobs.",
        all_value=None,
    )


def route_model() -> Any:
    return query(
        "model_name",
        "Model",
        'specdec_route_requests_total{job=~"$job"}',
        "Served model name (vLLM's model_name label).",
    )


def engine_model() -> Any:
    return query(
        "model_name",
        "Model",
        'specdec_draft_tokens_total{job=~"$job"}',
        "Served model name (vLLM's model_name label).",
    )


def route() -> Any:
    return query(
        "route",
        "Route",
        'specdec_route_requests_total{job=~"$job", model_name=~"$model_name"}',
        "Workload route, as configured in the proxy's routes.",
    )


def engine() -> Any:
    return query(
        "engine",
        "Engine",
        'specdec_draft_tokens_total{job=~"$job", model_name=~"$model_name"}',
        "vLLM engine (data-parallel rank).",
    )


def baseline_span(expr: str) -> Any:
    """Hidden: the breakdown baseline's real span, its number as the value and its unit as the
    text (`$baseline ${baseline:text}` in a title), from `query_result(expr)`: one series
    with a `unit` label. Refreshed with the time range, as the data it titles."""
    template = G.Template(
        name="baseline",
        label="Baseline span",
        query=f"query_result({expr})",
        dataSource=DATASOURCE,
        regex='/unit="(?<text>[^"]+)"} (?<value>[0-9.]+)/',
        refresh=G.REFRESH_ON_TIME_RANGE_CHANGE,
        hide=G.HIDE_VARIABLE,
    )
    return Variable(
        template,
        "How much history the breakdown's baseline holds (the selected routes' longest): "
        "its length until the routes are that old.",
        {"selected": False, "text": "", "value": ""},
    )
