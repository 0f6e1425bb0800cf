"""`specdec demo`: the whole bundle on a laptop, in one process.

Starts the vLLM simulator, the sidecar scraping it with its route-tagging proxy in front, and
traffic from two workloads sharing the engine through the proxy (Japanese voice chat tagged by
a header, an English coding agent by a path prefix); prints the URLs, then every few seconds
one line per route (the proxy's exact per-request accounting) and one for the engine (the
sidecar's rolling window over vLLM's counters). `--with-prometheus` also runs Debian's
prometheus on the repo's prometheus.yml. Ctrl-C stops everything.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
from aiohttp import web

from exporter.config import Config, ModelConfig, ProxyConfig, Route, Target
from exporter.core.counts import ratios, total
from exporter.core.windows import DEFAULT_WINDOWS
from exporter.measure.scenarios import Scenario, builtin
from exporter.measure.stream_client import RequestFailed, stream_chat
from exporter.sidecar import Sidecar
from exporter.sim.decoder import DRAFT_COST, PLAIN_STEP_SECONDS, SimEngine
from exporter.sim.server import build_app

MODEL = "sim-27b"


@dataclass
class Options:
    host: str = "127.0.0.1"
    sim_port: int = 8000
    sidecar_port: int = 10419
    proxy_port: int = 8001
    speed: float = 1.0
    concurrency: int = 2
    report_every: float = 5.0
    duration: float | None = None
    with_prometheus: bool = False
    prometheus_port: int = 9090


@dataclass(frozen=True)
class Workload:
    route: str
    scenario: str
    max_tokens: int
    path: str
    headers: dict[str, str]


WORKLOADS = (
    Workload("voice_chat", "ja_chat", 160, "/v1/chat/completions", {"X-Route": "voice"}),
    Workload("coding_agent", "code_agent", 400, "/agent/v1/chat/completions", {}),
)


def config(opts: Options) -> Config:
    """The sidecar config the demo runs: one target, the proxy with two routes, the model."""
    base = f"http://{opts.host}"
    routes = (
        Route("voice_chat", headers=(("x-route", "voice"),)),
        Route("coding_agent", path_prefix="/agent"),
    )
    step_cost = 1 + DRAFT_COST * 3
    return Config(
        listen=(opts.host, opts.sidecar_port),
        targets=(Target("sim", f"{base}:{opts.sim_port}/metrics"),),
        windows=DEFAULT_WINDOWS,
        proxy=ProxyConfig(f"{base}:{opts.sim_port}", (opts.host, opts.proxy_port), "sim", routes),
        # the published dense-27B figures: ~20 GB read per token, 1.7 TB/s -> ~85 tok/s ceiling
        models=(ModelConfig(MODEL, 3, step_cost, 1 / PLAIN_STEP_SECONDS, 20e9, 1.7e12),),
    )


async def _traffic(
    session: aiohttp.ClientSession,
    base: str,
    load: Workload,
    scenario: Scenario,
    offset: int,
    failures: list[int],
) -> None:
    for i in itertools.count(offset):
        body = {"model": MODEL, "messages": scenario.messages(i), "max_tokens": load.max_tokens}
        try:
            await stream_chat(session, base + load.path, body, headers=load.headers)
        except (RequestFailed, aiohttp.ClientError):
            failures[0] += 1
            await asyncio.sleep(1.0)


def route_line(sidecar: Sidecar, route: str) -> str:
    """Since-start acceptance and tokens per step, and the last window's decode rate."""
    assert sidecar.proxy is not None
    acc = sidecar.proxy.accounting
    counts = total([c for (r, _), c in acc.snapshot().items() if r == route])
    r = ratios(counts)
    if r.acceptance is None or r.mean_acceptance_length is None:
        return f"{route:<13} no completed requests yet"
    window = acc.decode_history.windows[0]
    decode = [
        d
        for (name, _), d in acc.decode_history.increase(window, time.monotonic()).items()
        if name == route
    ]
    rate = f"{decode[0].rate:6.1f}" if decode and decode[0].rate else "     -"
    requests = sum(n for (name, *_), n in acc.requests.items() if name == route)
    share = f"({counts.accepted:.0f}/{counts.draft_tokens:.0f})"
    return (
        f"{route:<13} acceptance {100 * r.acceptance:5.1f}% {share}"
        f"  tokens/step {r.mean_acceptance_length:.2f}  decode {rate} tok/s"
        f"  requests {requests}"
    )


def engine_line(sidecar: Sidecar) -> str:
    state = sidecar.targets[0]
    window = state.history.windows[0]
    r = ratios(total(list(state.history.increase(window, time.monotonic()).values())))
    if r.acceptance is None or r.mean_acceptance_length is None:
        return f"{'engine':<13} no drafts in the last {window.label} yet"
    return (
        f"{'engine':<13} acceptance {100 * r.acceptance:5.1f}% over {window.label} (vLLM counters)"
        f"  tokens/step {r.mean_acceptance_length:.2f}"
    )


async def run(opts: Options) -> None:
    engine = SimEngine(MODEL, speed=opts.speed)
    runner = web.AppRunner(build_app(engine, "summary"), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, opts.host, opts.sim_port).start()
    sidecar = Sidecar(config(opts))
    try:
        await sidecar.start()
        with _prometheus(opts) as prometheus:
            await _report(opts, sidecar, prometheus)
    finally:
        await sidecar.stop()
        await runner.cleanup()


async def _report(opts: Options, sidecar: Sidecar, prometheus: bool) -> None:
    base = f"http://{opts.host}"
    print(f"simulated vLLM   {base}:{opts.sim_port}/v1  (metrics: {base}:{opts.sim_port}/metrics)")
    print(
        f"specdec proxy    {base}:{opts.proxy_port}/v1  (voice: header X-Route: voice; "
        f"agent: {base}:{opts.proxy_port}/agent/v1)"
    )
    print(f"specdec sidecar  {base}:{opts.sidecar_port}/metrics")
    if prometheus:
        print(f"prometheus       {base}:{opts.prometheus_port}")
    print(
        "traffic: Japanese voice chat and an English coding agent on one engine; Ctrl-C stops\n",
        flush=True,
    )
    failures = [0]
    proxy = f"{base}:{opts.proxy_port}"
    async with aiohttp.ClientSession() as session:
        tasks = [
            asyncio.create_task(
                _traffic(session, proxy, load, builtin(load.scenario), worker, failures)
            )
            for load in WORKLOADS
            for worker in range(opts.concurrency)
        ]
        try:
            started = time.monotonic()
            while opts.duration is None or time.monotonic() - started < opts.duration:
                await asyncio.sleep(opts.report_every)
                for load in WORKLOADS:
                    print(route_line(sidecar, load.route))
                print(
                    engine_line(sidecar)
                    + (f"  failed requests {failures[0]}" if failures[0] else ""),
                    flush=True,
                )
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


@contextlib.contextmanager
def _prometheus(opts: Options) -> Iterator[bool]:
    """Debian's prometheus on ./prometheus.yml with a throw-away TSDB, if it is there."""
    binary, config = shutil.which("prometheus"), Path("prometheus.yml")
    if not opts.with_prometheus:
        yield False
        return
    if binary is None or not config.exists():
        print(
            "--with-prometheus: needs `prometheus` on PATH and ./prometheus.yml (run from the repo)"
        )
        yield False
        return
    with tempfile.TemporaryDirectory(prefix="specdec-demo-prometheus-") as data:
        proc = subprocess.Popen(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={data}",
                f"--web.listen-address={opts.host}:{opts.prometheus_port}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            yield True
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def main(opts: Options) -> None:
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(run(opts))
