"""The dashboards' full-window guard (dashboards/queries/panel_queries.py `full_window`), by
promtool on series of known age: a route or engine younger than a figure's window has no point
yet, an old one has, and the young one shows once its window is full. The expressions are the
dashboards' own, with their variables at "All"."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from dashboards.boards import engine, payoff
from dashboards.queries import panel_queries as Q
from harness.helpers import need_tool
from harness.previews.live import substitute

pytestmark = pytest.mark.promtool

YOUNG = "_x10 "  # absent for the first 10 minutes (1-minute steps), then present
ROUTES = {"old": 0.7, "young": 0.9}  # route -> its recorded acceptance
ENGINES = {"0": 0.5, "1": 0.6}  # engine -> ... ("1" is the young one)


def route_inputs(recorded: str) -> list[dict[str, str]]:
    out = []
    for route, level in ROUTES.items():
        age = YOUNG if route == "young" else ""
        labels = f'route="{route}", model_name="m"'
        requests = f'specdec_route_requests_total{{job="specdec", {labels}, status="200"}}'
        out.append({"series": requests, "values": f"{age}0+10x40"})
        out.append({"series": f"{recorded}{{{labels}}}", "values": f"{age}{level}x40"})
    return out


def engine_inputs() -> list[dict[str, str]]:
    out = []
    for engine_, level in ENGINES.items():
        age = YOUNG if engine_ == "1" else ""
        labels = f'model_name="m", engine="{engine_}"'
        restarts = f'specdec_engine_restarts_total{{job="specdec", target="t", {labels}}}'
        out.append({"series": restarts, "values": f"{age}0x40"})
        out.append({"series": f"{ENGINE_5M}{{{labels}}}", "values": f"{age}{level}x40"})
    return out


ROUTE_5M = "route_model_name:specdec_route_acceptance:ratio_rate5m"
ROUTE_10M = "route_model_name:specdec_route_exact_acceptance:ratio_rate10m"
ENGINE_5M = "model_name_engine:specdec_acceptance:ratio_rate5m"


def expect(name: str, key: str, which: list[str]) -> list[dict[str, object]]:
    levels = ROUTES if key == "route" else ENGINES
    return [{"labels": f'{name}{{{key}="{k}", model_name="m"}}', "value": levels[k]} for k in which]


def test_young_series_wait_for_a_full_window(tmp_path: Path) -> None:
    promtool = need_tool("promtool")
    route_5m = substitute(payoff.ACCEPTANCE_5M)
    route_10m = substitute(Q.exact_rule("exact_acceptance", "ratio_rate", "10m"))
    engine_5m = substitute(engine.ACCEPTANCE_5M)
    assert "offset 5m" in route_5m and "offset 10m" in route_10m and "offset 5m" in engine_5m
    cases = [
        # 2 and 4 minutes after the young route appeared its 5m figure still waits; at 6, shown
        (route_5m, "12m", expect(ROUTE_5M, "route", ["old"])),
        (route_5m, "14m", expect(ROUTE_5M, "route", ["old"])),
        (route_5m, "16m", expect(ROUTE_5M, "route", ["old", "young"])),
        # a 10m figure waits ten minutes
        (route_10m, "16m", expect(ROUTE_10M, "route", ["old"])),
        (route_10m, "21m", expect(ROUTE_10M, "route", ["old", "young"])),
        # engines: the same, on the sidecar's per-engine restart counter
        (engine_5m, "13m", expect(ENGINE_5M, "engine", ["0"])),
        (engine_5m, "16m", expect(ENGINE_5M, "engine", ["0", "1"])),
    ]
    inputs = [
        *route_inputs(ROUTE_5M),
        *route_inputs(ROUTE_10M),
        *engine_inputs(),
    ]
    test = {
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": inputs,
                "promql_expr_test": [
                    {"expr": e, "eval_time": t, "exp_samples": s} for e, t, s in cases
                ],
            }
        ],
    }
    path = tmp_path / "full_window.yml"
    path.write_text(yaml.safe_dump(test, sort_keys=False), encoding="utf-8")
    done = subprocess.run(
        [promtool, "test", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
