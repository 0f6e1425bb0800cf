"""A fleet on Prometheus's own distributed path, for tests/integration/test_fleet.py and
bench/fleet.py.

N simulated engines (`specdec sim`) of two models, each with its own sidecar (`specdec serve`:
scraper and route-tagging proxy; one per replica, as in a pod: the proxy fronts one upstream),
two regional Prometheus servers in agent mode (`--enable-feature=agent`, external label
`cluster`), each scraping half of the replicas (the `specdec` and `vllm` jobs, target label
`pod`) and remote-writing everything to one global Prometheus
(`--web.enable-remote-write-receiver`), which alone evaluates the rules and alerts and answers
the dashboards' queries. Traffic: one closed-loop client per replica through its proxy, both
routes in the replica's own mix. A replica can be restarted (engine and sidecar: its counters
start from zero) and degraded (its simulator's profile accepts less), and each simulator's
/admin/truth is what the global figures are checked against."""

from __future__ import annotations

import asyncio
import json
import math
import threading
import urllib.parse
import urllib.request
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from dashboards.alerts import alert_groups
from dashboards.config import Mixin
from dashboards.rules import recording_rules, render
from exporter.measure.scenarios import builtin
from exporter.measure.stream_client import stream_chat
from exporter.sim.profiles import DEFAULT_PROFILES
from exporter.sim.steptime import MODEL
from harness.ab_traffic import ROUTES
from harness.helpers import child, free_port, http_get, specdec, stop_group, wait_for
from harness.pages import samples

MODELS = ("sim-27b", "sim-8b")
REGIONS = ("region-a", "region-b")
PROFILES = {route: work.scenario for route, work in ROUTES.items()}  # route -> its sim profile
DRAFT_LENGTH = 3
# the simulator's verify step over its plain step at batch 1 (1.78): one client per replica
# keeps the batch at 1, where the payoff the rules state without a step-time curve (tokens per
# step / this ratio) is the simulator's own
STEP_COST = MODEL.verify(1, DRAFT_LENGTH) / MODEL.plain(1)
COUNTERS = ("drafts", "draft_tokens", "accepted")  # a truth's counts, as /admin/truth names them
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never via *_proxy


@dataclass
class Replica:
    """One engine and its sidecar; `earlier`: its simulator's truth before its restarts."""

    index: int
    model: str
    region: str
    voice_share: float  # of its requests
    sim_port: int = field(default_factory=free_port)
    proxy_port: int = field(default_factory=free_port)
    metrics_port: int = field(default_factory=free_port)
    earlier: dict[str, dict[str, float]] = field(default_factory=dict)
    starts: int = 0

    @property
    def name(self) -> str:
        return f"replica-{self.index}"

    @property
    def sim(self) -> str:
        return f"http://127.0.0.1:{self.sim_port}"

    @property
    def proxy(self) -> str:
        return f"http://127.0.0.1:{self.proxy_port}"

    @property
    def metrics(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"


def layout(n: int) -> list[Replica]:
    """n replicas: the models alternate, the first half in one region, the rest in the other,
    each with its own share of voice requests (0.2 .. 0.8 across the fleet)."""
    half = math.ceil(n / 2)
    return [
        Replica(i, MODELS[i % 2], REGIONS[i // half], 0.2 + 0.6 * i / max(1, n - 1))
        for i in range(n)
    ]


def sidecar_config(r: Replica, windows: str, interval: str) -> str:
    """`specdec serve`'s config for replica `r`: its engine scraped every `interval`, the proxy
    in front of it with the two routes by header, the model's step cost (no step-time curve)."""
    routes = "\n".join(
        f"    - name: {name}\n      when: {{header: {{X-Route: {work.header}}}}}"
        for name, work in ROUTES.items()
    )
    return f"""listen: 127.0.0.1:{r.metrics_port}
windows: [{windows}]
targets:
  - name: vllm
    url: {r.sim}/metrics
    interval: {interval}
proxy:
  listen: 127.0.0.1:{r.proxy_port}
  upstream: {r.sim}
  target: vllm
  routes:
{routes}
models:
  - name: {r.model}
    num_speculative_tokens: {DRAFT_LENGTH}
    step_cost_ratio: {STEP_COST:.4f}
"""


def rule_files(directory: Path, mix: Mixin, interval: str | None = None) -> list[Path]:
    """The bundle's recording rules and alerts as `specdec rules` generates them from `mix`;
    with `interval`, every group evaluated that often (the shipped files: 15 s and 1 m)."""
    out = []
    for name, groups in (
        ("specdec-recording.yml", recording_rules(mix)),
        ("specdec-alerts.yml", alert_groups(mix)),
    ):
        if interval is not None:
            groups = [{**g, "interval": interval} for g in groups]
        path = directory / name
        path.write_text(render(groups), encoding="utf-8")
        out.append(path)
    return out


def agent_config(replicas: list[Replica], region: str, scrape: str, receiver: str) -> str:
    """A regional Prometheus in agent mode: scrapes its replicas' sidecars (job specdec) and
    engines (job vllm), target label `pod`, and remote-writes every sample to the global one,
    marked with its region (external label `cluster`)."""

    def job(name: str, port: str) -> dict[str, Any]:
        targets = [
            {"targets": [f"127.0.0.1:{getattr(r, port)}"], "labels": {"pod": r.name}}
            for r in replicas
            if r.region == region
        ]
        return {"job_name": name, "static_configs": targets}

    config = {
        "global": {
            "scrape_interval": scrape,
            "scrape_timeout": scrape,
            "external_labels": {"cluster": region},
        },
        "scrape_configs": [job("specdec", "metrics_port"), job("vllm", "sim_port")],
        "remote_write": [
            {
                "url": f"{receiver}/api/v1/write",
                # samples reach the global within about a second (the default waits 5 s)
                "queue_config": {"batch_send_deadline": "500ms", "min_backoff": "50ms"},
            }
        ],
    }
    return yaml.safe_dump(config, sort_keys=False)


def global_config(rules: list[Path], evaluation: str) -> str:
    """The global Prometheus: no scrapes of its own, the rules and alerts over what the
    regions write."""
    config = {
        "global": {"evaluation_interval": evaluation},
        "rule_files": [str(p) for p in rules],
    }
    return yaml.safe_dump(config, sort_keys=False)


def add(
    a: dict[str, dict[str, float]], b: dict[str, dict[str, float]]
) -> dict[str, dict[str, float]]:
    """Two truths (per profile: counts and decode sums) added."""
    out = {k: dict(v) for k, v in a.items()}
    for profile, figures in b.items():
        into = out.setdefault(profile, {})
        for key, value in figures.items():
            into[key] = into.get(key, 0.0) + value
    return out


def read_truth(sim: str) -> dict[str, dict[str, float]]:
    """A simulator's /admin/truth per profile: drafts, draft tokens, accepted, and its decode
    steps' tokens and seconds beside a plain step's (the same-state A/B)."""
    data = json.loads(http_get(sim + "/admin/truth"))
    out = {}
    for profile, t in data.items():
        d = t["decode"]
        out[profile] = {
            **{k: float(t[k]) for k in COUNTERS},
            **{f"decode_{k}": float(d[k]) for k in ("steps", "tokens", "seconds", "plain_seconds")},
        }
    return out


def sidecar_totals(page_text: str) -> dict[str, float]:
    """The sidecar's exact per-route counters summed over routes: what the global must hold of
    it once its samples have arrived."""
    totals = dict.fromkeys(COUNTERS, 0.0)
    names = {
        "specdec_route_drafts_total": "drafts",
        "specdec_route_draft_tokens_total": "draft_tokens",
        "specdec_route_accepted_tokens_total": "accepted",
    }
    for (name, labels), v in samples(page_text).items():
        if name in names and dict(labels).get("source") == "exact":
            totals[names[name]] += v
    return totals


class Traffic:
    """One closed-loop client per replica through its proxy (concurrency 1: the engine's batch
    stays 1), each request's route from the replica's mix, in a thread of its own. `pause`
    returns once the replica's client has no request in flight (for a restart, or the end)."""

    def __init__(self, replicas: list[Replica], pace: float = 0.0) -> None:
        self.replicas = replicas
        self.pace = pace  # seconds between a client's requests (0: back to back)
        self.requests = dict.fromkeys((r.index for r in replicas), 0)
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._paused = {r.index: threading.Event() for r in replicas}
        self._idle = {r.index: threading.Event() for r in replicas}
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    def __enter__(self) -> Traffic:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(60)

    def pause(self, *indices: int) -> None:
        for i in indices:
            self._idle[i].clear()
            self._paused[i].set()
        for i in indices:
            wait_for(self._idle[i].is_set, timeout=60, what=f"replica {i}'s last request")

    def resume(self, *indices: int) -> None:
        for i in indices:
            self._paused[i].clear()

    async def _main(self) -> None:
        await asyncio.gather(*(self._client(r) for r in self.replicas))

    async def _client(self, r: Replica) -> None:
        n = 0
        session: aiohttp.ClientSession | None = None
        try:
            while not self._stop.is_set():
                if self._paused[r.index].is_set():
                    if session is not None:  # its sidecar may restart: new connections after
                        await session.close()
                        session = None
                    self._idle[r.index].set()
                    await asyncio.sleep(0.02)
                    continue
                session = session or aiohttp.ClientSession()
                # request n is voice where the running share of voice crosses a whole number
                voice = math.floor((n + 1) * r.voice_share) > math.floor(n * r.voice_share)
                work = ROUTES["voice_chat" if voice else "coding_agent"]
                body = {
                    "model": r.model,
                    "messages": builtin(work.scenario).messages(n),
                    "max_tokens": work.tokens(f"{r.index}/{r.starts}/{n}"),
                }
                try:
                    await stream_chat(session, r.proxy + work.path, body, work.headers)
                    self.requests[r.index] += 1
                except (aiohttp.ClientError, OSError, ValueError) as exc:
                    self.failures.append(f"{r.name}: {exc!r}")
                n += 1
                if self.pace:
                    await asyncio.sleep(self.pace)  # the load's shape, not a synchronisation
        finally:
            if session is not None:
                await session.close()


class Fleet:
    """The running fleet: its replicas, the global Prometheus's API, restarts and faults."""

    def __init__(self, tmp: Path, replicas: list[Replica], speed: float, windows: str) -> None:
        self.tmp = tmp
        self.replicas = replicas
        self.speed = speed
        self.windows = windows
        self.prometheus = ""  # the global one's URL
        self.agents: list[str] = []
        self.stack = ExitStack()
        self.procs: dict[int, list[Any]] = {}

    # --- the replicas ------------------------------------------------------------------

    def start(self, rs: list[Replica]) -> None:
        """Start each replica's engine and sidecar (at once), then wait for all of them."""
        for r in rs:
            r.starts += 1
            config = self.tmp / f"{r.name}.yaml"
            config.write_text(sidecar_config(r, self.windows, "1s"), encoding="utf-8")
            sim = specdec("sim", "--listen", f"127.0.0.1:{r.sim_port}", "--model", r.model)
            sim += ["--speed", f"{self.speed:g}", "--seed", str(r.index)]
            log = f"{r.name}.{r.starts}"
            self.procs[r.index] = [
                self.stack.enter_context(child(sim, self.tmp / f"{log}.sim.log")),
                self.stack.enter_context(
                    child(specdec("serve", "--config", str(config)), self.tmp / f"{log}.serve.log")
                ),
            ]
        for r in rs:
            wait_for(lambda r=r: http_get(r.sim + "/v1/models"), 60, f"{r.name}'s engine")
            wait_for(lambda r=r: http_get(r.metrics), 60, f"{r.name}'s sidecar")

    def restart(self, r: Replica, traffic: Traffic) -> None:
        """Stop the replica's engine and sidecar (as a pod restarts: its counters start from
        zero) and start both again on the same ports. Its client pauses first and the global
        Prometheus gets the sidecar's last counts before it goes, so nothing it counted is
        lost to the figures (what a restart loses between scrapes is not this test's)."""
        traffic.pause(r.index)
        self.settle([r])
        r.earlier = add(r.earlier, read_truth(r.sim))
        for proc in self.procs[r.index]:
            stop_group(proc)
        self.start([r])
        traffic.resume(r.index)

    def truth(self, r: Replica) -> dict[str, dict[str, float]]:
        """Everything the replica's engines did, across its restarts."""
        return add(r.earlier, read_truth(r.sim))

    def set_profile(self, r: Replica, profile: str, acceptance: float) -> None:
        body = json.dumps({"name": profile, "acceptance": acceptance}).encode()
        req = urllib.request.Request(
            r.sim + "/admin/profile", data=body, headers={"Content-Type": "application/json"}
        )
        with _DIRECT.open(req, timeout=5) as resp:
            assert resp.status == 200

    def degrade(self, r: Replica, profile: str, acceptance: float) -> None:
        self.set_profile(r, profile, acceptance)

    def restore(self, r: Replica, profile: str) -> None:
        self.set_profile(r, profile, DEFAULT_PROFILES[profile].acceptance)

    def settle(self, rs: list[Replica], timeout: float = 30.0) -> None:
        """Wait until the global Prometheus holds each replica's sidecar counters as its page
        shows them now (the replica's traffic paused): scraped, remote-written, stored."""
        for r in rs:
            want = sidecar_totals(http_get(r.metrics))

            def arrived(r: Replica = r, want: dict[str, float] = want) -> bool:
                got = dict.fromkeys(COUNTERS, 0.0)
                for name, key in (
                    ("drafts", "drafts"),
                    ("draft_tokens", "draft_tokens"),
                    ("accepted_tokens", "accepted"),
                ):
                    promql = f'sum(specdec_route_{name}_total{{pod="{r.name}", source="exact"}})'
                    for sample in self.query(promql):
                        got[key] = float(sample["value"][1])
                return all(abs(got[k] - want[k]) < 1e-6 * max(1.0, want[k]) for k in COUNTERS)

            wait_for(arrived, timeout, f"the global Prometheus to hold {r.name}'s counts {want}")

    # --- the global Prometheus --------------------------------------------------------

    def query(self, promql: str, at: float | None = None) -> list[dict[str, Any]]:
        """An instant query's result vector at the global Prometheus (raises on an error)."""
        params = {"query": promql, **({"time": f"{at:.3f}"} if at is not None else {})}
        return list(self.api("query", params)["result"])

    def api(self, path: str, params: dict[str, str] | None = None) -> Any:
        url = f"{self.prometheus}/api/v1/{path}"
        if params:
            url += "?" + urllib.parse.urlencode(params)
        with _DIRECT.open(url, timeout=30) as resp:
            answer = json.loads(resp.read())
        assert answer["status"] == "success", answer
        return answer["data"]

    def tail(self) -> str:
        """The end of every child's log, for a failure's message."""
        parts = []
        for log in sorted(self.tmp.glob("*.log")):
            text = log.read_text(errors="replace")[-800:]
            parts.append(f"--- {log.name} (end) ---\n{text}")
        return "\n".join(parts)


@contextmanager
def fleet(
    tmp: Path,
    replicas: list[Replica],
    rules: list[Path],
    prometheus: str,
    *,
    speed: float,
    scrape: str = "1s",
    evaluation: str = "1s",
    windows: str = "1m, 5m, 15m",
) -> Iterator[Fleet]:
    """The fleet running (`prometheus`: the binary): the global Prometheus, every replica, the
    two regional agents, all up and every sidecar's `up` arrived at the global one; every
    child stopped on exit."""
    f = Fleet(tmp, replicas, speed, windows)
    with f.stack:
        port = free_port()
        f.prometheus = f"http://127.0.0.1:{port}"
        config = tmp / "global.yml"
        config.write_text(global_config(rules, evaluation), encoding="utf-8")
        args = [prometheus, f"--config.file={config}", f"--storage.tsdb.path={tmp / 'global'}"]
        args += [f"--web.listen-address=127.0.0.1:{port}", "--web.enable-remote-write-receiver"]
        server = f.stack.enter_context(child([*args, "--log.level=warn"], tmp / "global.log"))
        f.start(replicas)
        for region in REGIONS:
            port = free_port()
            config = tmp / f"{region}.yml"
            config.write_text(agent_config(replicas, region, scrape, f.prometheus))
            args = [prometheus, "--enable-feature=agent", f"--config.file={config}"]
            args += [
                f"--storage.agent.path={tmp / region}",
                f"--web.listen-address=127.0.0.1:{port}",
            ]
            f.stack.enter_context(child([*args, "--log.level=warn"], tmp / f"{region}.log"))
            f.agents.append(f"http://127.0.0.1:{port}")
        assert server.poll() is None, f.tail()

        def all_up() -> bool:
            found = f.query('count(up{job="specdec"} == 1)')
            return bool(found) and int(found[0]["value"][1]) == len(replicas)

        wait_for(all_up, 90, "every sidecar's `up` at the global Prometheus")
        yield f
        assert server.poll() is None, f"the global Prometheus died\n{f.tail()}"
