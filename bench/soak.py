"""Hours of mixed traffic through `specdec serve`: does anything leak, grow or break?

A fixed-rate open-loop load (requests start on a clock, not when the previous one ends) goes
through the proxy of `specdec serve` to `specdec sim`, both child processes:

    voice     streamed chat, header X-Route: voice                     -> route voice_chat
    agent     streamed chat under /agent                              -> route coding_agent
    whole     non-streamed chat, X-Route: voice                       -> route voice_chat
    junk      streamed chat with a random X-Route value                -> route other
    hang-up   streamed chat the client drops after its first chunk     -> 499/abort, counted

Half-way through, the engine restarts for real: the simulator is stopped and started again on
its port (its counters start from zero, the proxy's upstream connections break). Requests that
fail while it is down are counted apart ("restart"), every other failure is an error.

Every `--report-every` seconds one line: requests, errors, the sidecar's RSS, open file
descriptors, series on its /metrics, its CPU (share of one core) and its internal errors.
`--check` exits 1 unless: no client errors and no internal errors; the sidecar exited 0
with no traceback in its log; it saw exactly one engine restart; after warm-up and once the
longest window filled (its gauges appear only then) no series
appears with a new name, route, model or engine (a first 502 or finish reason is a value of
a fixed outcome label: listed, not growth); and, on a run long enough to judge (3 reports
after the longest window filled), RSS grows at most `--rss-growth-mb` from then to the end.

    python bench/soak.py --minutes 120 --rate 40 --json /tmp/soak.json --check
    python bench/soak.py --minutes 1.5 --rate 20 --report-every 10 --windows 10s,30s --check
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from _run import SIDECAR_CONF, free_port, guarded, proc_stats, spawn, stop, wait_http

from exporter.core.durations import parse_duration

MODEL = "sim-27b"
MAX_IN_FLIGHT = 256  # the load generator's own cap: beyond it a tick is skipped, and counted
MIX = (("voice", 0.45), ("agent", 0.20), ("whole", 0.15), ("junk", 0.12), ("hang-up", 0.08))
WARM_UP_REPORTS = 1  # the label sets appear in the first report; flat from the next on


@dataclass
class Tally:
    """What the clients saw since the start."""

    sent: int = 0
    ok: int = 0
    hung_up: int = 0
    errors: int = 0
    restart: int = 0  # failures while the engine was down
    skipped: int = 0  # ticks with the load generator at its cap
    examples: list[str] = field(default_factory=list)

    def error(self, what: str) -> None:
        self.errors += 1
        if len(self.examples) < 10:
            self.examples.append(what)


@dataclass
class Report:
    seconds: float
    sent: int
    ok: int
    hung_up: int
    errors: int
    restart: int
    rss_mb: float
    fds: int
    series: int
    cpu_share: float
    internal_errors: float
    engine_restarts: float


class Engine:
    """The simulator child; `restart()` stops it and starts it again on the same port."""

    def __init__(self, port: int, speed: float, tmp: Path) -> None:
        self.port, self.speed, self.tmp = port, speed, tmp
        self.down_since: float | None = None
        self.up_again = float("inf")
        self.proc = self._spawn(0)

    def _spawn(self, seed: int) -> subprocess.Popen[bytes]:
        cmd = [sys.executable, "-m", "exporter", "sim", "--listen", f"127.0.0.1:{self.port}"]
        cmd += ["--speed", str(self.speed), "--seed", str(seed)]
        proc = spawn(cmd, self.tmp / f"sim-{seed}.log")
        wait_http(proc, f"http://127.0.0.1:{self.port}/health")
        return proc

    async def restart(self) -> None:
        self.down_since = time.monotonic()
        await asyncio.to_thread(stop, self.proc)
        self.proc = await asyncio.to_thread(self._spawn, 1)
        self.up_again = time.monotonic()

    def explains(self, started: float, failed: float) -> bool:
        """The request was under way or began while the engine was down (cut or refused)."""
        return self.down_since is not None and started < self.up_again and failed >= self.down_since


def _body(rng: random.Random, stream: bool) -> dict[str, Any]:
    words = " ".join(rng.choice(("alpha", "beta", "gamma", "delta")) for _ in range(8))
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": words}],
        "max_tokens": rng.randrange(16, 96),
        "stream": stream,
    }


async def _one(
    session: aiohttp.ClientSession, proxy: str, kind: str, rng: random.Random, tally: Tally,
    engine: Engine,
) -> None:  # fmt: skip
    started = time.monotonic()
    path, headers = "/v1/chat/completions", {"X-Route": "voice"}
    if kind == "agent":
        path, headers = "/agent/v1/chat/completions", {}
    elif kind == "junk":
        headers = {"X-Route": "".join(rng.choices("abcdefghijklmnopqrstuvwxyz0123456789-", k=12))}
    try:
        async with session.post(
            proxy + path, json=_body(rng, kind != "whole"), headers=headers
        ) as resp:
            if resp.status != 200:
                raise RuntimeError(f"HTTP {resp.status}: {(await resp.text())[:200]}")
            if kind == "hang-up":
                await resp.content.readany()
                resp.close()
                tally.hung_up += 1
                return
            data = await resp.read()
            complete = data.endswith(b"data: [DONE]\n\n") if kind != "whole" else b'"usage"' in data
            if not complete:
                raise RuntimeError(f"incomplete {kind} response: {data[-120:]!r}")
            tally.ok += 1
    except (aiohttp.ClientError, RuntimeError, TimeoutError) as exc:
        if engine.explains(started, time.monotonic()):
            tally.restart += 1
        else:
            tally.error(f"{kind}: {type(exc).__name__}: {exc}"[:300])


SEEN: dict[str, float] = {}  # series -> minutes into the run it first appeared
# labels whose values are a fixed set in the code (an outcome, not a name from outside): a new
# value of one of them is a first occurrence, not growth
BOUNDED = re.compile(r'(?:status|finish_reason|kind|reason|stage|limit)="[^"]*",?')
MODEL_NAME = re.compile(r'model_name="[^"]*",?')  # "" on a request no model answered (a 502)


async def _page(
    session: aiohttp.ClientSession, url: str, minutes: float
) -> tuple[int, float, float]:
    """Series on the sidecar's page, its internal errors and the engine restarts it saw."""
    async with session.get(url) as resp:
        text = await resp.text()
    series, internal, restarts = 0, 0.0, 0.0
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        series += 1
        SEEN.setdefault(line.rsplit(" ", 1)[0], minutes)
        if line.startswith("specdec_proxy_internal_errors_total"):
            internal += float(line.rsplit(" ", 1)[1])
        elif line.startswith("specdec_engine_restarts_total"):
            restarts += float(line.rsplit(" ", 1)[1])
    return series, internal, restarts


async def soak(args: argparse.Namespace, tmp: Path) -> list[Report]:
    sim_port, metrics_port, proxy_port = free_port(), free_port(), free_port()
    config = tmp / "specdec.yaml"
    windows = f"windows: [{', '.join(args.windows)}]\n"
    config.write_text(
        windows
        + SIDECAR_CONF.format(metrics=metrics_port, upstream=sim_port, port=proxy_port, model=MODEL)
    )
    engine = Engine(sim_port, args.speed, tmp)
    sidecar = spawn(
        [sys.executable, "-m", "exporter", "serve", "--config", str(config)],
        tmp / "sidecar.log",
    )
    try:
        await asyncio.to_thread(wait_http, sidecar, f"http://127.0.0.1:{metrics_port}/-/ready")
        reports = await _drive(args, engine, sidecar.pid, proxy_port, metrics_port)
    finally:
        stop(sidecar)
        stop(engine.proc)
    log = (tmp / "sidecar.log").read_text(errors="replace")
    if sidecar.returncode != 0 or "Traceback" in log:
        raise RuntimeError(
            f"the sidecar exited {sidecar.returncode}; the end of its log:\n{log[-2000:]}"
        )
    return reports


async def _drive(
    args: argparse.Namespace, engine: Engine, pid: int, proxy_port: int, metrics_port: int
) -> list[Report]:
    rng = random.Random(args.seed)
    tally = Tally()
    reports: list[Report] = []
    proxy, metrics = f"http://127.0.0.1:{proxy_port}", f"http://127.0.0.1:{metrics_port}/metrics"
    kinds = [kind for kind, _ in MIX]
    weights = [weight for _, weight in MIX]
    tasks: set[asyncio.Task[None]] = set()
    timeout = aiohttp.ClientTimeout(total=60)
    connector = aiohttp.TCPConnector(limit=MAX_IN_FLIGHT)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        loop = asyncio.get_running_loop()
        start = loop.time()
        duration = args.minutes * 60
        restart_at = duration / 2
        restarted: asyncio.Task[None] | None = None
        next_report = start + args.report_every
        _, _, cpu_before = proc_stats(pid)
        tick, n = 1 / args.rate, 0
        print(
            f"{'min':>6} {'sent':>8} {'ok':>8} {'hangup':>7} {'errors':>6} {'restart':>7} "
            f"{'rss MB':>7} {'fds':>4} {'series':>6} {'cpu':>5} {'internal':>8}",
            flush=True,
        )
        while (now := loop.time()) - start < duration:
            if restarted is None and now - start >= restart_at:
                restarted = asyncio.create_task(engine.restart())
            if len(tasks) >= MAX_IN_FLIGHT:
                tally.skipped += 1
            else:
                kind = rng.choices(kinds, weights)[0]
                task = asyncio.create_task(_one(session, proxy, kind, rng, tally, engine))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                tally.sent += 1
            if now >= next_report:
                rss, fds, cpu = proc_stats(pid)
                series, internal, restarts = await _page(session, metrics, (now - start) / 60)
                report = Report(
                    round((now - start) / 60, 2), tally.sent, tally.ok, tally.hung_up,
                    tally.errors, tally.restart, round(rss, 1), fds, series,
                    round((cpu - cpu_before) / args.report_every, 3), internal, restarts,
                )  # fmt: skip
                cpu_before = cpu
                reports.append(report)
                print(
                    f"{report.seconds:6.2f} {report.sent:8d} {report.ok:8d} {report.hung_up:7d} "
                    f"{report.errors:6d} {report.restart:7d} {report.rss_mb:7.1f} "
                    f"{report.fds:4d} {report.series:6d} {100 * report.cpu_share:4.1f}% "
                    f"{report.internal_errors:8.0f}",
                    flush=True,
                )
                next_report += args.report_every
            n += 1
            await asyncio.sleep(max(0.0, start + n * tick - loop.time()))
        if restarted is not None:
            await restarted
        await asyncio.gather(*tasks)
        series, internal, restarts = await _page(session, metrics, args.minutes)
        rss, fds, _ = proc_stats(pid)
        last = reports[-1] if reports else None
        final = Report(
            round(args.minutes, 2), tally.sent, tally.ok, tally.hung_up, tally.errors,
            tally.restart, round(rss, 1), fds, series, last.cpu_share if last else 0.0,
            internal, restarts,
        )  # fmt: skip
        reports.append(final)
    print(
        f"end: {tally.sent} sent, {tally.ok} ok, {tally.hung_up} hung up on purpose, "
        f"{tally.errors} errors, {tally.restart} failed while the engine restarted, "
        f"{tally.skipped} ticks skipped (load generator at its cap)"
    )
    for example in tally.examples:
        print("  error:", example)
    return reports


def verdict(reports: list[Report], args: argparse.Namespace) -> list[str]:
    """What --check refuses; empty when the run is clean."""
    problems = []
    end = reports[-1]
    if end.errors:
        problems.append(f"{end.errors} client errors")
    if end.internal_errors:
        problems.append(f"{end.internal_errors:.0f} internal errors in the sidecar")
    if end.engine_restarts != 1:
        problems.append(f"the sidecar counted {end.engine_restarts:.0f} engine restarts, not 1")
    # after warm-up and once the longest window filled (a window's gauges appear only then)
    longest = max(parse_duration(w) for w in args.windows)
    first = next(
        (i for i, r in enumerate(reports) if r.seconds * 60 >= longest + args.report_every),
        len(reports) - 1,
    )
    settled = reports[max(WARM_UP_REPORTS, first) :]
    early = {BOUNDED.sub("", name) for name, at in SEEN.items() if at <= settled[0].seconds}
    early |= {MODEL_NAME.sub("", name) for name in early}

    def known(name: str) -> bool:
        key = BOUNDED.sub("", name)
        return key in early or ('model_name=""' in key and MODEL_NAME.sub("", key) in early)

    late = sorted(name for name, at in SEEN.items() if at > settled[0].seconds)
    grown = [name for name in late if not known(name)]
    print(
        f"series {settled[0].series} after warm-up -> {end.series} at the end; "
        f"{len(late)} first occurrences of an outcome label value after warm-up"
        + (f" ({', '.join(late[:6])})" if late else "")
    )
    if grown:
        problems.append(
            f"{len(grown)} series of a new name or label set after warm-up: {grown[:5]}"
        )
    filled = [r for r in reports[:-1] if r.seconds * 60 >= longest + args.report_every]
    if len(filled) >= 3:
        growth = end.rss_mb - filled[0].rss_mb
        print(
            f"RSS {filled[0].rss_mb:.1f} MB at {filled[0].seconds:.1f} min (longest window "
            f"filled) -> {end.rss_mb:.1f} MB at the end: {growth:+.1f} MB"
        )
        if growth > args.rss_growth_mb:
            problems.append(f"RSS grew {growth:.1f} MB after the longest window filled")
    else:
        print("RSS not judged: the run is too short after the longest window filled")
    return problems


def run(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="specdec-soak-") as tmp:
        reports = asyncio.run(soak(args, Path(tmp)))
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(r) for r in reports], indent=1))
    problems = verdict(reports, args)
    for problem in problems:
        print("soak: FAIL:", problem)
    return 1 if problems and args.check else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--rate", type=float, default=40.0, help="requests per second")
    parser.add_argument("--report-every", type=float, default=60.0, help="seconds")
    parser.add_argument("--windows", type=lambda s: s.split(","), default=["1m", "5m", "15m"])
    parser.add_argument("--speed", type=float, default=50.0, help="the simulator's --speed")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rss-growth-mb", type=float, default=5.0)
    parser.add_argument("--json", help="write every report to this file")
    parser.add_argument("--check", action="store_true", help="exit 1 on a problem")
    return guarded("soak", run, parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
