"""The Grafana dashboards: committed JSON up to date, Grafana's schema types accept it (tsc),
every panel query returns data from a live Prometheus scraping the demo bundle, and the PNG
preview (the docs tool, harness/previews) renders.

No Grafana can be installed here, so the JSON is checked against Grafana's own TypeScript types
(npm @grafana/schema) and every query against Debian's prometheus, which scrapes a simulator +
sidecar + proxy with traffic (exporter.demo) and evaluates the shipped rules (the shared live
stack, live.py, with a day of history backfilled for the "yesterday" panels).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from dashboards.boards.build import dashboards
from dashboards.boards.encode import (
    OLD_DASHBOARD_KEYS,
    OLD_PANEL_KEYS,
    OLD_VARIABLE_KEYS,
)
from dashboards.config import DEFAULT
from dashboards.queries import panel_queries as Q
from harness.helpers import need_tool
from harness.previews.live import instant, panel_queries, range_query, resolve_variables, substitute
from tests.dashboards_ts import generate
from tests.integration.live import (
    LEVELS,
    MODEL,
    Live,
    panels_without_data,
    queries_without_data,
)

ROOT = Path(__file__).resolve().parents[2]
TS = ROOT / "tests" / "dashboards_ts"
PROVISIONING = ROOT / "deploy" / "grafana" / "provisioning"
ROUTES = tuple(LEVELS)  # exporter.demo.WORKLOADS
# what a user who picks every concrete value sees; the preview uses the All value (.*)
VALUES = {"job": "specdec", "model_name": MODEL, "route": "|".join(ROUTES), "engine": "0"}
DATA_DEADLINE = 120.0
DATASOURCE_UID = DEFAULT.dashboards.datasource


def tsc(*files: Path) -> subprocess.CompletedProcess[str]:
    npx = shutil.which("npx")
    assert npx is not None
    return subprocess.run(
        [
            npx,
            "--no-install",
            "tsc",
            "--strict",
            "--noEmit",
            "--module",
            "esnext",
            "--moduleResolution",
            "bundler",
            "--target",
            "es2022",
            *(str(f.relative_to(TS)) for f in files),
        ],
        cwd=TS,
        capture_output=True,
        text=True,
        timeout=180,
    )


def npm_install() -> None:
    npm = need_tool("npm")
    need_tool("node")
    if (TS / "node_modules" / "@grafana" / "schema").is_dir() and (
        TS / "node_modules" / "typescript"
    ).is_dir():
        return
    done = subprocess.run(
        [npm, "install", "--no-audit", "--no-fund"],
        cwd=TS,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr


# --- generated JSON, provisioning ---------------------------------------------------------


def test_committed_json_matches_the_sources() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "exporter", "dashboards", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_dashboards_use_modern_panels_and_the_provisioned_datasource() -> None:
    source = yaml.safe_load((PROVISIONING / "datasources" / "prometheus.yml").read_text())
    assert [d["uid"] for d in source["datasources"]] == [DATASOURCE_UID]
    provider = yaml.safe_load((PROVISIONING / "dashboards" / "specdec.yml").read_text())
    assert provider["providers"][0]["options"]["path"].startswith("/")
    for uid, data in dashboards().items():
        assert data["schemaVersion"] == 36
        variables = {v["name"]: v for v in data["templating"]["list"]}
        assert variables["datasource"]["current"]["value"] == DATASOURCE_UID, uid
        for panel in data["panels"]:
            where = f"{uid}: {panel['title']}"
            assert panel["type"] in ("timeseries", "stat", "table", "bargauge", "heatmap"), where
            assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, where
            assert panel.get("description"), f"{where}: no description"
            assert panel["fieldConfig"]["defaults"].get("noValue"), f"{where}: no noValue"
            for target in panel["targets"]:
                assert target["datasource"] == panel["datasource"], where
                assert "[5m]" not in target["expr"] and "[1m]" not in target["expr"], (
                    f"{where}: raw rates use $__rate_interval"
                )


def _nulls(value: object, path: str = "") -> Iterator[str]:
    if isinstance(value, dict):
        step = "color" in value and "value" in value  # a threshold step: null = minus infinity
        for k, v in value.items():
            if v is None and not (step and k == "value"):
                yield f"{path}.{k}"
            yield from _nulls(v, f"{path}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _nulls(v, f"{path}[{i}]")


def test_normaliser_leaves_no_nulls_or_old_keys() -> None:
    for uid, data in dashboards().items():
        assert not list(_nulls(data)), uid
        assert not OLD_DASHBOARD_KEYS & set(data), uid
        for panel in data["panels"]:
            assert not OLD_PANEL_KEYS & set(panel), (uid, panel["title"])
            assert "overrides" in panel["fieldConfig"], (uid, panel["title"])
        for var in data["templating"]["list"]:
            assert not OLD_VARIABLE_KEYS & set(var), (uid, var["name"])
            assert "tags" not in var["current"], (uid, var["name"])
        assert "time_options" not in data["timepicker"], uid


# --- Grafana's schema types -------------------------------------------------------------------


def test_dashboards_type_check_against_grafana_schema() -> None:
    npm_install()
    data = dashboards()
    good = generate.write(data, "dashboards")
    done = tsc(good)
    assert done.returncode == 0, done.stdout + done.stderr

    # the check bites: every deliberate mistake is rejected, each in its own file
    broken = [
        generate.write({name: copy}, f"broken_{name}")
        for name, copy in generate.broken(data["specdec-payoff"]).items()
    ]
    done = tsc(*broken)
    assert done.returncode != 0
    missed = [p.name for p in broken if f"{p.name}(" not in done.stdout]
    assert not missed, f"tsc accepted deliberate mistakes: {missed}\n{done.stdout}"


# --- live Prometheus ---------------------------------------------------------------------------


def test_legends_and_titles_name_what_they_show(live: Live) -> None:
    """As the preview renders a board over the last hour (All selected; a repeated panel
    once per value, as in Grafana): no title keeps a `$variable`, every {{label}} of a legend
    is a label of its series, and no two series of one panel share a legend (two routes
    under one "acceptance")."""
    from harness.previews.draw import legend
    from harness.previews.render import _repeated, _with_values

    url = live.prometheus
    assert not panels_without_data(url, dashboards(), {}, DATA_DEADLINE, live.started)
    wrong = []
    for uid, data in dashboards().items():
        now = time.time()
        values = resolve_variables(data, url, {}, now - 3600, now)
        queries = panel_queries(data)
        for panel, _, own in _repeated(data, url, values, 3600, now):
            title = _with_values(panel["title"], own)
            if "$" in title:
                wrong.append(f"{uid}: title {title!r}")
            if panel["type"] in ("table", "heatmap"):  # columns / buckets, not legends
                continue
            shown = []
            for q in (q for q in queries if q.panel_id == panel["id"]):
                expr = substitute(q.expr, own)
                found = (
                    range_query(url, expr, now - 3600, now, 15)
                    if panel["type"] == "timeseries"  # drawn over the last hour
                    else instant(url, expr)
                )
                for item in found:
                    named = set(re.findall(r"\{\{\s*(\w+)\s*\}\}", q.legend))
                    missing = named - set(item["metric"])
                    if missing:
                        wrong.append(f"{uid}: {title} / {q.ref}: {q.legend!r} lacks {missing}")
                    shown.append(legend(q.legend, item["metric"]))
            if len(shown) != len(set(shown)):
                wrong.append(f"{uid}: {title}: legends {shown}")
    assert not wrong, "\n".join(wrong)


def test_every_panel_query_returns_data(live: Live) -> None:
    prometheus = live.prometheus
    empty = panels_without_data(prometheus, dashboards(), VALUES, DATA_DEADLINE, live.started)
    assert not empty, f"{len(empty)} queries without data after {DATA_DEADLINE:.0f} s:\n" + (
        "\n".join(empty)
    )
    # with "All" selected (as a dashboard opens) too
    assert not queries_without_data(prometheus, dashboards(), {}, live.started)


def test_preview_renders_a_png_per_dashboard(live: Live, tmp_path: Path) -> None:
    prometheus = live.prometheus
    try:
        import matplotlib.image
    except ImportError:
        if os.environ.get("CI"):
            pytest.fail("matplotlib is not installed; the test extra must bring it")
        pytest.skip("matplotlib not installed")
    assert not panels_without_data(prometheus, dashboards(), {}, DATA_DEADLINE, live.started)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "harness.previews",
            str(tmp_path),
            "--prometheus",
            prometheus,
            "--range",
            "5m",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    for uid in dashboards():
        png = tmp_path / f"{uid}.png"
        assert png.stat().st_size > 50_000, f"{png}: suspiciously small"
        pixels = matplotlib.image.imread(png)
        height, width = pixels.shape[:2]
        assert width >= 1600 and height >= 600, (uid, pixels.shape)
        colours = {tuple(p) for p in pixels[::7, ::7].reshape(-1, pixels.shape[2]).tolist()}
        assert len(colours) > 200, f"{uid}: {len(colours)} colours, a near-blank image?"


def test_the_speedup_by_batch_panel_falls_with_the_batch_and_meets_the_estimate(
    live: Live,
) -> None:
    """On the simulator's step-time line a verify step grows faster with the batch than a plain
    one: the payoff falls with the batch, and the batch now sits between 1 and 64. Past the
    largest batch the demo's curve was measured at (64), a column stays empty."""

    def per_route(promql: str) -> dict[str, float]:
        found = live.query(substitute(promql, VALUES))
        return {s["metric"]["route"]: float(s["value"][1]) for s in found}

    def figures() -> tuple[dict[str, float], ...] | None:
        got = tuple(
            per_route(q)
            for q in (
                Q.route_speedup_at_batch(1),
                Q.route_rule("estimated_speedup", "ratio_rate5m"),
                Q.route_speedup_at_batch(64),
                Q.route_batch_now(),
            )
        )
        return got if all(set(g) >= set(ROUTES) for g in got) else None

    at1, now, at64, batch = live.poll(figures, DATA_DEADLINE, "the speedup-by-batch figures")
    for route in ROUTES:
        assert 1 <= batch[route] <= 64, batch
        assert at1[route] > now[route] > at64[route] > 0, (route, at1, now, at64)
    assert per_route(Q.route_speedup_at_batch(128)) == {}
