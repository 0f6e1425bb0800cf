"""`specdec demo`: the whole bundle on a laptop, in one process.

Starts the vLLM simulator, the sidecar scraping it, and traffic from two workloads sharing the
engine (Japanese voice chat, an English coding agent); prints the URLs, then every few seconds
one line per workload (from vLLM's per-request objects) and one for the engine (from the
sidecar's rolling window). `--with-prometheus` also runs Debian's prometheus on the repo's
prometheus.yml. Ctrl-C stops everything.
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
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from aiohttp import web

from exporter.client import RequestFailed, stream_chat
from exporter.config import Config, Target
from exporter.counts import Counts, from_spec_object, ratios, total
from exporter.scenarios import Scenario, builtin
from exporter.sidecar import Sidecar
from exporter.sim.engine import SimEngine
from exporter.sim.server import build_app
from exporter.windows import DEFAULT_WINDOWS


@dataclass
class Options:
    host: str = "127.0.0.1"
    sim_port: int = 8000
    sidecar_port: int = 10419
    speed: float = 1.0
    concurrency: int = 2
    report_every: float = 5.0
    duration: float | None = None
    with_prometheus: bool = False
    prometheus_port: int = 9090


@dataclass
class Tally:
    """What one workload's requests did, from their per-request objects."""

    requests: int = 0
    failures: int = 0
    counts: Counts = field(default_factory=Counts)
    tokens: int = 0
    decode_seconds: float = 0.0

    def line(self, name: str) -> str:
        r = ratios(self.counts)
        rate = self.tokens / self.decode_seconds if self.decode_seconds else 0.0
        acc = "-" if r.acceptance is None else f"{100 * r.acceptance:5.1f}%"
        tps = "-" if r.mean_acceptance_length is None else f"{r.mean_acceptance_length:.2f}"
        c = self.counts
        return (
            f"{name:<13} acceptance {acc} ({c.accepted:.0f}/{c.draft_tokens:.0f})"
            f"  tokens/step {tps}  decode {rate:6.1f} tok/s  requests {self.requests}"
            + (f"  failed {self.failures}" if self.failures else "")
        )


WORKLOADS = (("voice_chat", "ja_chat", 160), ("coding_agent", "code_agent", 400))


async def _traffic(
    session: aiohttp.ClientSession,
    url: str,
    model: str,
    scenario: Scenario,
    max_tokens: int,
    tally: Tally,
    offset: int,
) -> None:
    for i in itertools.count(offset):
        body = {"model": model, "messages": scenario.messages(i), "max_tokens": max_tokens}
        try:
            result = await stream_chat(session, url, body)
        except (RequestFailed, aiohttp.ClientError):
            tally.failures += 1
            await asyncio.sleep(1.0)
            continue
        tally.requests += 1
        tally.tokens += result.completion_tokens
        tally.decode_seconds += result.decode_seconds
        if result.spec is not None:
            tally.counts = tally.counts + from_spec_object(result.spec)


def _engine_line(sidecar: Sidecar) -> str:
    state = sidecar.targets[0]
    window = state.history.windows[0]
    increases = state.history.increase(window, time.monotonic())
    r = ratios(total(list(increases.values())))
    if r.acceptance is None or r.mean_acceptance_length is None:
        return f"{'engine':<13} no drafts in the last {window.label} yet"
    return (
        f"{'engine':<13} acceptance {100 * r.acceptance:5.1f}% over {window.label} (sidecar)"
        f"  tokens/step {r.mean_acceptance_length:.2f}"
    )


async def run(opts: Options) -> None:
    engine = SimEngine("sim-27b", speed=opts.speed)
    base = f"http://{opts.host}"
    config = Config(
        listen=(opts.host, opts.sidecar_port),
        targets=(Target("sim", f"{base}:{opts.sim_port}/metrics"),),
        windows=DEFAULT_WINDOWS,
    )
    sidecar = Sidecar(config)
    runners = []
    for app, port in (
        (build_app(engine, "summary"), opts.sim_port),
        (sidecar.app(), opts.sidecar_port),
    ):
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, opts.host, port).start()
        runners.append(runner)
    with _prometheus(opts) as prometheus:
        try:
            await _report(opts, engine, sidecar, prometheus)
        finally:
            for runner in reversed(runners):
                await runner.cleanup()


async def _report(opts: Options, engine: SimEngine, sidecar: Sidecar, prometheus: bool) -> None:
    base = f"http://{opts.host}"
    print(f"simulated vLLM   {base}:{opts.sim_port}/v1  (metrics: {base}:{opts.sim_port}/metrics)")
    print(f"specdec sidecar  {base}:{opts.sidecar_port}/metrics")
    if prometheus:
        print(f"prometheus       {base}:{opts.prometheus_port}")
    print(
        "traffic: Japanese voice chat and an English coding agent on one engine; Ctrl-C stops\n",
        flush=True,
    )
    tallies = {name: Tally() for name, _, _ in WORKLOADS}
    url = f"{base}:{opts.sim_port}/v1/chat/completions"
    async with aiohttp.ClientSession() as session:
        tasks = [
            asyncio.create_task(
                _traffic(
                    session,
                    url,
                    engine.model,
                    builtin(scenario),
                    cap,
                    tallies[name],
                    offset=worker,
                )
            )
            for name, scenario, cap in WORKLOADS
            for worker in range(opts.concurrency)
        ]
        try:
            started = time.monotonic()
            while opts.duration is None or time.monotonic() - started < opts.duration:
                await asyncio.sleep(opts.report_every)
                for name, tally in tallies.items():
                    print(tally.line(name))
                print(_engine_line(sidecar), flush=True)
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
