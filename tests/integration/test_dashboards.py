"""The Grafana dashboards: committed JSON up to date, Grafana's schema types accept it (tsc),
every panel query returns data from a live Prometheus scraping the demo bundle, and the PNG
preview renders.

No Grafana can be installed here, so the JSON is checked against Grafana's own TypeScript types
(npm @grafana/schema) and every query against Debian's prometheus, which scrapes a simulator +
sidecar + proxy with traffic (exporter.demo) and evaluates the repo's rules.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from dashboards.build import dashboards
from dashboards.live import (
    PrometheusError,
    Query,
    annotation_queries,
    instant,
    panel_queries,
    resolve_variables,
    substitute,
)
from dashboards.panels import (
    DATASOURCE_UID,
    OLD_DASHBOARD_KEYS,
    OLD_PANEL_KEYS,
    OLD_VARIABLE_KEYS,
)
from tests.dashboards_ts import generate
from tests.helpers import child, free_port, http_get, need_tool, wait_for

ROOT = Path(__file__).resolve().parents[2]
TS = ROOT / "tests" / "dashboards_ts"
RULES = ROOT / "deploy" / "prometheus" / "rules"
PROVISIONING = ROOT / "deploy" / "grafana" / "provisioning"
MODEL = "sim-27b"  # exporter.demo.MODEL
ROUTES = ("voice_chat", "coding_agent")  # exporter.demo.WORKLOADS
# what a user who picks every concrete value sees; the preview uses the All value (.*)
VALUES = {"job": "specdec", "model_name": MODEL, "route": "|".join(ROUTES), "engine": "0"}
DATA_DEADLINE = 120.0

# The demo bundle with a bandwidth roofline in its model config (the Engine dashboard's ceiling
# panel needs bytes_per_token and memory_bandwidth_bytes_per_second) and its proxy on a free port.
DEMO = """
import dataclasses, sys
from exporter import demo

base = demo.config

def config(opts):
    c = base(opts)
    models = tuple(
        m if m.bytes_per_token else dataclasses.replace(
            m, bytes_per_token=20e9, memory_bandwidth_bytes_per_second=1.7e12)
        for m in c.models
    )
    return dataclasses.replace(c, models=models)

demo.config = config
sim, side, proxy = map(int, sys.argv[1:4])
demo.main(demo.Options(sim_port=sim, sidecar_port=side, proxy_port=proxy, speed=20,
                       report_every=5))
"""


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
        [sys.executable, "-m", "dashboards.build", "--check"],
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
            assert panel["type"] in ("timeseries", "stat", "table", "bargauge"), where
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


def _rules(into: Path) -> None:
    """The repo's rule files, each group evaluated every second instead of every 15 s / 1 m."""
    into.mkdir()
    for path in sorted(RULES.glob("*.yml")):
        doc = yaml.safe_load(path.read_text())
        for group in doc["groups"]:
            group["interval"] = "1s"
        (into / path.name).write_text(yaml.safe_dump(doc, sort_keys=False))


def _yesterday(tsdb: Path, tmp: Path, promtool: str) -> None:
    """Backfill one day ago's hourly route acceptance (the table's 'same hour yesterday')."""
    name = "route_model_name:specdec_route_acceptance:ratio_rate1h"
    now = int(time.time())
    lines = [f"# TYPE {name} gauge"]
    for route, level in zip(ROUTES, (0.38, 0.72), strict=True):
        for t in range(now - 86400 - 5400, now - 86400 + 1800, 15):
            lines.append(f'{name}{{model_name="{MODEL}",route="{route}"}} {level} {t}')
    lines.append("# EOF")
    source = tmp / "yesterday.om"
    source.write_text("\n".join(lines) + "\n")
    done = subprocess.run(
        [promtool, "tsdb", "create-blocks-from", "openmetrics", str(source), str(tsdb)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    binary = need_tool("prometheus")
    promtool = need_tool("promtool")
    tmp = tmp_path_factory.mktemp("dashboards")
    sim, side, proxy, port = free_port(), free_port(), free_port(), free_port()
    _rules(tmp / "rules")
    tsdb = tmp / "tsdb"
    tsdb.mkdir()
    _yesterday(tsdb, tmp, promtool)
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(tmp / "rules" / "*.yml")],
        "scrape_configs": [
            {"job_name": "specdec", "static_configs": [{"targets": [f"127.0.0.1:{side}"]}]},
            {"job_name": "vllm", "static_configs": [{"targets": [f"127.0.0.1:{sim}"]}]},
        ],
    }
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
    demo = [sys.executable, "-c", DEMO, str(sim), str(side), str(proxy)]
    prom = [
        binary,
        f"--config.file={tmp / 'prometheus.yml'}",
        f"--storage.tsdb.path={tsdb}",
        f"--web.listen-address=127.0.0.1:{port}",
    ]
    env = {"PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    with child(demo, tmp / "demo.log", env=env), child(prom, tmp / "prometheus.log"):
        url = f"http://127.0.0.1:{port}"
        wait_for(lambda: "Ready" in http_get(f"{url}/-/ready"), 30, "prometheus ready")
        yield url


def _empty(url: str, given: dict[str, str]) -> list[str]:
    """Panel queries (and variable queries) without a sample now, as readable lines; variables
    not `given` take their "All" value, as a dashboard opens."""
    out = []
    for data in dashboards().values():
        now = time.time()
        values = resolve_variables(data, url, given, now - 3600, now)
        queries: list[Query] = panel_queries(data)
        for q in queries:
            expr = substitute(q.expr, values)
            try:
                if not instant(url, expr):
                    out.append(f"{q.dashboard} / {q.panel} / {q.ref}: {expr}")
            except PrometheusError as exc:
                out.append(f"{q.dashboard} / {q.panel} / {q.ref}: ERROR {exc}")
        for var in data["templating"]["list"]:
            query = var.get("query", "")
            if var["type"] == "query" and query.startswith("label_values("):
                metric, label = query[len("label_values(") : -1].rsplit(",", 1)
                expr = substitute(f"count by ({label.strip()}) ({metric})", values)
                if not instant(url, expr):
                    out.append(f"{data['uid']} / variable {var['name']}: {expr}")
        for expr in annotation_queries(data):
            instant(url, substitute(expr, values))  # must parse; alerts need not fire
    return out


def _wait_for_data(url: str, values: dict[str, str]) -> list[str]:
    deadline = time.monotonic() + DATA_DEADLINE
    while True:
        empty = _empty(url, values)
        if not empty or time.monotonic() > deadline:
            return empty
        time.sleep(2)


def test_every_panel_query_returns_data(prometheus: str) -> None:
    empty = _wait_for_data(prometheus, VALUES)
    assert not empty, f"{len(empty)} queries without data after {DATA_DEADLINE:.0f} s:\n" + (
        "\n".join(empty)
    )
    # with "All" selected (as a dashboard opens) too
    assert not _empty(prometheus, {})


def test_preview_renders_a_png_per_dashboard(prometheus: str, tmp_path: Path) -> None:
    try:
        import matplotlib.image
    except ImportError:
        if os.environ.get("CI"):
            pytest.fail("matplotlib is not installed; the test extra must bring it")
        pytest.skip("matplotlib not installed")
    assert not _wait_for_data(prometheus, {})
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "dashboards.build",
            "--preview",
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
