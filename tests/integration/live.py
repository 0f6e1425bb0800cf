"""The one live stack of the integration tests: Debian's Prometheus (2.42) with the shipped
rules, scraping `specdec demo` (simulated vLLM, the sidecar with its route-tagging proxy,
voice_chat and coding_agent traffic through the proxy). conftest.py starts it once per session
for every test that asks for `live` (dashboards, cookbook, rules and alerts).

Prometheus gets a config generated from the repo's prometheus.yml: the same jobs and rule files
(absolute paths), targets pointed at the child's free ports, a 1 s scrape interval (the rule
groups keep their own intervals), no Alertmanager. Its TSDB is backfilled first with a day of
the routes' counters (so the 1-day baselines are a day's, as in production) and yesterday's
hourly acceptance (the dashboards' "same hour yesterday").
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml

from dashboards.boards import payoff
from dashboards.boards.panels import JSON
from dashboards.rules import RULES_DIR as SHIPPED_RULES_DIR
from exporter.core.durations import parse_duration
from exporter.demo import QUIET_DAY
from exporter.demo_history import history
from harness.helpers import child, free_port, need_tool, wait_for
from harness.previews.live import (
    PrometheusError,
    annotation_queries,
    instant,
    panel_queries,
    resolve_variables,
    substitute,
)

REPO = Path(__file__).resolve().parents[2]
RULES_DIR = REPO / SHIPPED_RULES_DIR
SHIPPED_RULES = sorted(RULES_DIR.glob("*.yml"))
SPEED = 20.0  # the simulated engine runs 20x faster than real time
T = TypeVar("T")

_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never via *_proxy

# the demo with a schedule that keeps k = 3 at every batch: the schedule's panel has data,
# and every other figure is what one k gives; its scenario (steady, or drop after SECONDS)
DEMO = """
import sys
from exporter import demo, logs
from exporter.core.schedule import Schedule
logs.setup("warning")
demo.main(demo.Options(
    sim_port=int(sys.argv[1]), sidecar_port=int(sys.argv[2]), proxy_port=int(sys.argv[3]),
    speed=float(sys.argv[4]), report_every=5.0, schedule=Schedule.parse([[1, 256, 3]]),
    scenario=sys.argv[5], drop_after=float(sys.argv[6]),
))
"""
MODEL = "sim-27b"  # exporter.demo.MODEL
LEVELS = {"voice_chat": 0.36, "coding_agent": 0.71}  # the demo's profiles (ja_chat, code_agent)
DAY_LEVELS = {day.route: day.acceptance for day in QUIET_DAY}  # the backfilled day's
MOVES_ONLY = {payoff.SPLIT_TITLE}  # tests/integration/test_demo_drop.py draws it on a drop


def rule_groups(paths: list[Path] = SHIPPED_RULES) -> list[dict[str, Any]]:
    groups: list[dict[str, Any]] = []
    for path in paths:
        groups += yaml.safe_load(path.read_text(encoding="utf-8"))["groups"]
    return groups


def recording_rule_names() -> list[str]:
    return [r["record"] for g in rule_groups() for r in g["rules"] if "record" in r]


def get_json(url: str, timeout: float = 5.0) -> Any:
    with _DIRECT.open(url, timeout=timeout) as resp:
        return json.loads(resp.read())


def post_json(url: str, body: dict[str, Any], timeout: float = 5.0) -> Any:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with _DIRECT.open(req, timeout=timeout) as resp:
        return json.loads(resp.read())


@dataclass(frozen=True)
class Live:
    prometheus: str  # http://127.0.0.1:PORT
    sim: str
    sidecar: str
    proxy: str
    logs: Path
    started: float = field(default_factory=time.time)  # the sidecar's start (its windows fill)

    def query(self, promql: str) -> list[dict[str, Any]]:
        """An instant query's result vector (raises on a PromQL error)."""
        url = f"{self.prometheus}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        answer = get_json(url)
        assert answer["status"] == "success", answer
        result = answer["data"]["result"]
        if answer["data"]["resultType"] == "scalar":
            return [{"metric": {}, "value": result}]
        return list(result)

    def poll(
        self, check: Callable[[], T | None], timeout: float, what: Callable[[], str] | str
    ) -> T:
        """wait_for with a failure message computed at the deadline (and the child logs)."""
        try:
            return wait_for(check, timeout=timeout, what="the condition")
        except AssertionError:
            detail = what() if callable(what) else what
            raise AssertionError(
                f"timed out after {timeout:.0f} s waiting for {detail}\n{self.tail()}"
            ) from None

    def tail(self) -> str:
        parts = []
        for log in sorted(self.logs.glob("*.log")):
            text = log.read_text(errors="replace")[-1500:]
            parts.append(f"--- {log.name} (end) ---\n{text}")
        return "\n".join(parts)


def prometheus_config(
    sim_port: int, sidecar_port: int, rule_files: list[Path], sidecar_job: str = "specdec"
) -> dict[str, Any]:
    """The repo's prometheus.yml, pointed at this bundle, 1 s scrapes, no Alertmanager; the
    sidecar's job renamed to `sidecar_job` (a mixin config's)."""
    config: dict[str, Any] = yaml.safe_load((REPO / "prometheus.yml").read_text(encoding="utf-8"))
    config["global"]["scrape_interval"] = "1s"
    assert config["rule_files"] == ["deploy/prometheus/rules/*.yml"], config["rule_files"]
    config["rule_files"] = [str(p) for p in rule_files]
    config.pop("alerting", None)
    ports = {"specdec": sidecar_port, "vllm": sim_port}
    jobs = [job["job_name"] for job in config["scrape_configs"]]
    assert sorted(jobs) == sorted(ports), jobs
    for job in config["scrape_configs"]:
        job["static_configs"] = [{"targets": [f"127.0.0.1:{ports[job['job_name']]}"]}]
        if job["job_name"] == "specdec":
            job["job_name"] = sidecar_job
    return config


def backfill(tsdb: Path, tmp: Path, promtool: str) -> None:
    source = tmp / "history.om"
    source.write_text(history(time.time(), MODEL, QUIET_DAY), encoding="utf-8")
    done = subprocess.run(
        [promtool, "tsdb", "create-blocks-from", "openmetrics", str(source), str(tsdb)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr


@contextmanager
def live_stack(
    tmp: Path,
    rule_files: list[Path] = SHIPPED_RULES,
    sidecar_job: str = "specdec",
    speed: float = SPEED,
    scenario: str = "steady",
    drop_after: float = 0.0,
) -> Iterator[Live]:
    """Demo bundle + Prometheus on free ports; both process groups stopped on exit. `speed`:
    the simulated engine's, against real time; `scenario`: the demo's (drop: `drop_after`
    seconds in)."""
    prometheus = need_tool("prometheus")
    promtool = need_tool("promtool")
    sim_port, sidecar_port, proxy_port, prom_port = (free_port() for _ in range(4))
    config = tmp / "prometheus.yml"
    config.write_text(
        yaml.safe_dump(prometheus_config(sim_port, sidecar_port, rule_files, sidecar_job))
    )
    tsdb = tmp / "tsdb"
    tsdb.mkdir()
    backfill(tsdb, tmp, promtool)
    with ExitStack() as stack:
        checked = subprocess.run(
            [promtool, "check", "config", str(config)], capture_output=True, text=True, timeout=60
        )
        assert checked.returncode == 0, checked.stdout + checked.stderr
        args = [sys.executable, "-c", DEMO, str(sim_port), str(sidecar_port), str(proxy_port)]
        demo = stack.enter_context(
            child([*args, str(speed), scenario, str(drop_after)], tmp / "demo.log")
        )
        server = stack.enter_context(
            child(
                [
                    prometheus,
                    f"--config.file={config}",
                    f"--storage.tsdb.path={tsdb}",
                    f"--web.listen-address=127.0.0.1:{prom_port}",
                    "--log.level=warn",
                ],
                tmp / "prometheus.log",
            )
        )
        live = Live(
            prometheus=f"http://127.0.0.1:{prom_port}",
            sim=f"http://127.0.0.1:{sim_port}",
            sidecar=f"http://127.0.0.1:{sidecar_port}",
            proxy=f"http://127.0.0.1:{proxy_port}",
            logs=tmp,
        )

        def ready() -> bool:
            assert demo.poll() is None, "specdec demo exited"
            assert server.poll() is None, "prometheus exited"
            with _DIRECT.open(f"{live.prometheus}/-/ready", timeout=2) as resp:
                return resp.status == 200

        live.poll(ready, 60, "prometheus /-/ready")
        live.poll(
            lambda: len(live.query(f'up{{job=~"{sidecar_job}|vllm"}} == 1')) == 2,
            30,
            lambda: f"both jobs up: {live.query('up')}",
        )
        yield live
        # the children must still be alive at the end: a crash mid-test is a failure
        assert demo.poll() is None, f"specdec demo died during the test\n{live.tail()}"
        assert server.poll() is None, f"prometheus died during the test\n{live.tail()}"


# --- dashboards against the stack ---------------------------------------------------


def queries_without_data(
    url: str, boards: dict[str, JSON], given: dict[str, str], started: float = 0.0
) -> list[str]:
    """Panel queries (and variable queries) without a sample now, as readable lines; variables
    not `given` take their "All" value, as a dashboard opens. A query of a sidecar gauge over a
    window longer than the sidecar has run (`started`) is not expected to have data yet: the
    gauge appears once the sidecar holds the window's history. A panel that draws only what
    moved (MOVES_ONLY) has nothing to draw on the steady demo."""
    out = []
    for data in boards.values():
        now = time.time()
        values = resolve_variables(data, url, given, now - 3600, now)
        queries = panel_queries(data)
        for q in queries:
            if q.panel in MOVES_ONLY:
                continue
            expr = substitute(q.expr, values)
            windows = [parse_duration(w) for w in re.findall(r'window="([0-9a-z]+)"', expr)]
            if windows and max(windows) > now - started:
                continue
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


def panels_without_data(
    url: str, boards: dict[str, JSON], values: dict[str, str], seconds: float, started: float = 0.0
) -> list[str]:
    """`queries_without_data`, polled until none is left or `seconds` have passed (the rule
    groups evaluate every 15 s and 1 m: the first figures take that long)."""
    deadline = time.monotonic() + seconds
    while True:
        empty = queries_without_data(url, boards, values, started)
        if not empty or time.monotonic() > deadline:
            return empty
        time.sleep(2)
