"""A live Prometheus (Debian's 2.42 binary) scraping a simulator + sidecar + proxy, for the tests
that need one (test_prometheus_live.py, test_promql_cookbook.py). Imported explicitly, not a
conftest.py: nothing here runs unless a test asks for it.

The bundle is `specdec demo` in a child process (simulated vLLM, the sidecar with its
route-tagging proxy, voice_chat and coding_agent traffic through the proxy). `specdec demo` has no
--proxy-port flag, so the child calls `exporter.demo.main` with the same Options the CLI builds
plus the proxy port. Prometheus gets a config generated from the repo's prometheus.yml: the same
jobs and rule files (absolute paths), targets pointed at the child's free ports, 1 s scrape and
evaluation intervals, no Alertmanager.
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import yaml

from tests.helpers import child, free_port, need_tool, wait_for

REPO = Path(__file__).resolve().parents[2]
RULES_DIR = REPO / "deploy" / "prometheus" / "rules"
SHIPPED_RULES = sorted(RULES_DIR.glob("*.yml"))
SPEED = 20.0  # the simulated engine runs 20x faster than real time
T = TypeVar("T")

_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never via *_proxy

DEMO = """
import sys
from exporter import demo, logs
logs.setup("warning")
demo.main(demo.Options(
    sim_port=int(sys.argv[1]), sidecar_port=int(sys.argv[2]), proxy_port=int(sys.argv[3]),
    speed=float(sys.argv[4]), report_every=5.0,
))
"""


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


def prometheus_config(sim_port: int, sidecar_port: int, rule_files: list[Path]) -> dict[str, Any]:
    """The repo's prometheus.yml, pointed at this bundle, 1 s intervals, no Alertmanager."""
    config: dict[str, Any] = yaml.safe_load((REPO / "prometheus.yml").read_text(encoding="utf-8"))
    config["global"]["scrape_interval"] = "1s"
    config["global"]["evaluation_interval"] = "1s"
    assert config["rule_files"] == ["deploy/prometheus/rules/*.yml"], config["rule_files"]
    config["rule_files"] = [str(p) for p in rule_files]
    config.pop("alerting", None)
    ports = {"specdec": sidecar_port, "vllm": sim_port}
    jobs = [job["job_name"] for job in config["scrape_configs"]]
    assert sorted(jobs) == sorted(ports), jobs
    for job in config["scrape_configs"]:
        job["static_configs"] = [{"targets": [f"127.0.0.1:{ports[job['job_name']]}"]}]
    return config


@contextmanager
def live_stack(tmp: Path, rule_files: list[Path]) -> Iterator[Live]:
    """Demo bundle + Prometheus on free ports; both process groups stopped on exit."""
    prometheus = need_tool("prometheus")
    promtool = need_tool("promtool")
    sim_port, sidecar_port, proxy_port, prom_port = (free_port() for _ in range(4))
    config = tmp / "prometheus.yml"
    config.write_text(yaml.safe_dump(prometheus_config(sim_port, sidecar_port, rule_files)))
    with ExitStack() as stack:
        checked = subprocess.run(
            [promtool, "check", "config", str(config)], capture_output=True, text=True, timeout=60
        )
        assert checked.returncode == 0, checked.stdout + checked.stderr
        demo = stack.enter_context(
            child(
                [
                    sys.executable,
                    "-c",
                    DEMO,
                    str(sim_port),
                    str(sidecar_port),
                    str(proxy_port),
                    str(SPEED),
                ],
                tmp / "demo.log",
            )
        )
        server = stack.enter_context(
            child(
                [
                    prometheus,
                    f"--config.file={config}",
                    f"--storage.tsdb.path={tmp / 'tsdb'}",
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

        live.poll(ready, 30, "prometheus /-/ready")
        live.poll(
            lambda: len(live.query('up{job=~"specdec|vllm"} == 1')) == 2,
            30,
            lambda: f"both jobs up: {live.query('up')}",
        )
        yield live
        # the children must still be alive at the end: a crash mid-test is a failure
        assert demo.poll() is None, f"specdec demo died during the test\n{live.tail()}"
        assert server.poll() is None, f"prometheus died during the test\n{live.tail()}"
