"""Mixed traffic through `specdec serve` at its connection limit: is any request lost, does
anything leak, grow or break?

`specdec serve` (its proxy at `--max-connections`) in front of `specdec sim`, both child
processes, and at once:

    pooled    a fixed-rate open loop (requests start on a clock) on a keep-alive pool:
              voice (streamed, X-Route: voice), agent (streamed, under /agent), whole
              (non-streamed), junk (a random X-Route: route other), hang-up (the client
              drops the stream after its first chunk: 499)
    bursts    every --burst-every s, --burst clients connect at the same moment, each
              sending a whole streamed request at once (1.5 x the limit by default)
    churners  --churn connections a second that send nothing (a peer that only connects)
    slow      --slow streams a second read 512 bytes at a time through a 4 KiB buffer
    restarts  the engine stopped and started again --restarts times, evenly spread (its
              counters start from zero, the proxy's upstream connections break)

Every request ends in one outcome as its client saw it (`_soak_clients.COUNTER`): whole,
hung up, refused with a status (503 past the limit; the 408 of a connection the proxy closed
as the request came: one that had sent nothing, or a keep-alive one between requests, both to
make room), or failed by the upstream (502/504, or a 200 cut while the engine was
down). Each outcome's count must equal the proxy's own counter for it, one to one, over the
run; a request with no status line, or cut while the engine was up, is lost. Every
`--report-every` seconds one line: requests, lost, refused, the sidecar's RSS, open file
descriptors, series on its /metrics, its CPU (share of one core) and its internal errors.

`--check` exits 1 unless: no request lost and every outcome matched; no internal errors; the
sidecar exited 0 with no traceback in its log; it saw exactly --restarts engine restarts; after
warm-up and once the longest window filled no series appears with a new name, route, model or
engine (a new value of an outcome label is listed, not growth); descriptors back to where they
started once the clients left; and, on a run long enough to judge (3 reports after the longest
window filled), RSS grows at most `--rss-growth-mb` from then to the end. The added latency:
TTFT p50/p99 of pooled streams through the proxy against `--direct` of them sent to the
simulator directly, in the same run. `--record` keeps the figures in bench/results/.

    python bench/soak.py --minutes 30 --restarts 3 --check --record
    python bench/soak.py --minutes 1 --rate 20 --report-every 10 --windows 10s,30s --check
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Awaitable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import aiohttp
from _run import (
    SIDECAR_CONF,
    add_outputs,
    free_port,
    guarded,
    proc_stats,
    record,
    spawn,
    stop,
    wait_http,
)
from _soak_clients import (
    COUNTER,
    MODEL,
    UNSEEN,
    Tally,
    body,
    exchange,
    refusal,
    request,
    silent,
)

from exporter.core.durations import parse_duration

MAX_IN_FLIGHT = 256  # the pooled load's own cap: beyond it a tick is skipped, and counted
MIX = (("voice", 0.45), ("agent", 0.20), ("whole", 0.15), ("junk", 0.12), ("hang-up", 0.08))
WARM_UP_REPORTS = 1  # the label sets appear in the first report; flat from the next on
SETTLED = 20.0  # seconds the proxy's counters and descriptors have to settle at the end


@dataclass
class Report:
    seconds: float
    sent: int
    lost: int
    refused: int
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
        self.down: list[tuple[float, float]] = []  # (stopped, up again) of each restart
        self.proc = self._spawn(0)

    def _spawn(self, seed: int) -> subprocess.Popen[bytes]:
        cmd = [sys.executable, "-m", "exporter", "sim", "--listen", f"127.0.0.1:{self.port}"]
        cmd += ["--speed", str(self.speed), "--seed", str(seed)]
        proc = spawn(cmd, self.tmp / f"sim-{seed}.log")
        wait_http(proc, f"http://127.0.0.1:{self.port}/health")
        return proc

    async def restart(self) -> None:
        stopped = time.monotonic()
        self.down.append((stopped, float("inf")))
        await asyncio.to_thread(stop, self.proc)
        self.proc = await asyncio.to_thread(self._spawn, len(self.down))
        self.down[-1] = (stopped, time.monotonic())

    def explains(self, started: float, failed: float) -> bool:
        """The request was under way or began while the engine was down."""
        return any(started < up and failed >= stopped for stopped, up in self.down)


class Load:
    """The clients of one run and what they saw."""

    def __init__(self, args: argparse.Namespace, engine: Engine, proxy_port: int) -> None:
        self.args, self.engine, self.port = args, engine, proxy_port
        self.rng = random.Random(args.seed)
        self.tally = Tally()
        self.sent = self.skipped = 0
        self.tasks: set[asyncio.Task[None]] = set()

    def spawn(self, work: Awaitable[None]) -> None:
        task = asyncio.ensure_future(work)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def pooled(self, session: aiohttp.ClientSession, kind: str, direct: bool) -> None:
        """One request of the pooled mix, through the proxy or (`direct`) to the simulator."""
        rng, started = self.rng, time.monotonic()
        base = f"http://127.0.0.1:{self.engine.port if direct else self.port}"
        path, headers = "/v1/chat/completions", {"X-Route": "voice"}
        if kind == "agent" and not direct:
            path, headers = "/agent/v1/chat/completions", {}
        elif kind == "junk":
            headers = {"X-Route": "".join(rng.choices("abcdefghijklmnopqrstuvwxyz0-", k=12))}
        stream = kind != "whole"
        data = body(rng, stream, (2000, 4000) if kind == "hang-up" else (16, 96))  # hang-up:
        # a stream long enough (~1 s) to be under way when its client, on a busy loop, leaves
        headers["Content-Type"] = "application/json"
        try:
            async with session.post(base + path, data=data, headers=headers) as resp:
                if resp.status != 200:
                    outcome = refusal(resp.status, await resp.read())
                else:
                    first = await resp.content.readany()
                    if stream:
                        self.tally.ttft["direct" if direct else "proxy"].append(
                            time.monotonic() - started
                        )
                    if kind == "hang-up":
                        resp.close()
                        outcome = "hung_up"
                    else:
                        rest = first + await resp.read()
                        done = b"data: [DONE]" in rest if stream else b'"usage"' in rest
                        outcome = "whole" if done else "cut"
        except aiohttp.ClientPayloadError as exc:  # a 200 cut after its head
            outcome, error = "cut", repr(exc)
        except (aiohttp.ClientError, TimeoutError) as exc:
            outcome, error = "lost", repr(exc)
        else:
            error = ""
        if direct:
            return  # the reference for TTFT only: not through the proxy, not in the tally
        self.count(outcome, started, f"{kind}: {error}")

    async def raw(self, data: bytes, slow: float = 0.0) -> None:
        started = time.monotonic()
        outcome = await exchange(self.port, data, stream=True, slow=slow)
        self.count(outcome, started, "slow reader" if slow else "burst")

    async def churner(self) -> None:
        outcome = await silent(self.port)
        self.tally.count(outcome, request=False, example="a connection that sent nothing")

    def count(self, outcome: str, started: float, what: str) -> None:
        if outcome == "cut" and self.engine.explains(started, time.monotonic()):
            outcome = "upstream_502"  # the proxy counts a stream the engine cut as a 502
        self.tally.count(outcome, example=what)
        self.sent += 1

    async def run(self, report: Reporter) -> None:
        """The traffic of the whole run: every source on its own clock."""
        args, rng, loop = self.args, self.rng, asyncio.get_running_loop()
        kinds, weights = [k for k, _ in MIX], [w for _, w in MIX]
        duration = args.minutes * 60
        restarts = [duration * (i + 1) / (args.restarts + 1) for i in range(args.restarts)]
        clocks = {"pooled": 1 / args.rate, "burst": args.burst_every}
        if args.churn:
            clocks["churn"] = 1 / args.churn
        if args.slow:
            clocks["slow"] = 1 / args.slow
        due = dict.fromkeys(clocks, 0.0)
        restarting: list[asyncio.Task[None]] = []
        timeout = aiohttp.ClientTimeout(total=120)
        connector = aiohttp.TCPConnector(limit=MAX_IN_FLIGHT)
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
            start = loop.time()
            while (elapsed := loop.time() - start) < duration:
                if restarts and elapsed >= restarts[0]:
                    restarts.pop(0)
                    restarting.append(asyncio.create_task(self.engine.restart()))
                source = min(due, key=lambda name: due[name])
                await asyncio.sleep(max(0.0, start + due[source] - loop.time()))
                due[source] += clocks[source]
                if source == "pooled":
                    if len(self.tasks) >= MAX_IN_FLIGHT:
                        self.skipped += 1
                        continue
                    direct = rng.random() < args.direct
                    kind = "voice" if direct else rng.choices(kinds, weights)[0]
                    self.spawn(self.pooled(session, kind, direct))
                elif source == "burst":
                    for _ in range(args.burst):
                        self.spawn(self.raw(request(body(rng, True))))
                elif source == "churn":
                    self.spawn(self.churner())
                else:
                    self.spawn(self.raw(request(body(rng, True, (200, 400))), slow=0.01))
                await report.maybe(loop.time() - start, self)
            await asyncio.gather(*restarting)
            while self.tasks:
                await asyncio.gather(*list(self.tasks))


class Reporter:
    """A line every --report-every seconds; the series seen on the sidecar's page."""

    def __init__(self, args: argparse.Namespace, pid: int, metrics: str) -> None:
        self.args, self.pid, self.metrics = args, pid, metrics
        self.reports: list[Report] = []
        self.seen: dict[str, float] = {}  # series -> minutes into the run it first appeared
        self.next = args.report_every
        self.cpu = proc_stats(pid)[2]
        print(
            f"{'min':>6} {'sent':>8} {'lost':>5} {'refused':>7} {'rss MB':>7} {'fds':>4} "
            f"{'series':>6} {'cpu':>5} {'internal':>8}",
            flush=True,
        )

    async def maybe(self, elapsed: float, load: Load) -> None:
        if elapsed < self.next:
            return
        self.next += self.args.report_every
        rss, fds, cpu = proc_stats(self.pid)
        page = await asyncio.to_thread(scrape, self.metrics)
        for name in page:
            self.seen.setdefault(name, elapsed / 60)
        refused = load.tally.refused()
        report = Report(
            round(elapsed / 60, 2), load.sent, load.tally.lost(), refused, round(rss, 1), fds,
            len(page), round((cpu - self.cpu) / self.args.report_every, 3),
            total(page, "specdec_proxy_internal_errors_total"),
            total(page, "specdec_engine_restarts_total"),
        )  # fmt: skip
        self.cpu = cpu
        self.reports.append(report)
        print(
            f"{report.seconds:6.2f} {report.sent:8d} {report.lost:5d} {report.refused:7d} "
            f"{report.rss_mb:7.1f} {report.fds:4d} {report.series:6d} "
            f"{100 * report.cpu_share:4.1f}% {report.internal_errors:8.0f}",
            flush=True,
        )


def scrape(url: str) -> dict[str, float]:
    """The sidecar's page: series -> value."""
    with urllib.request.urlopen(url, timeout=10) as resp:
        text = resp.read().decode()
    page = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            page[name] = float(value)
    return page


def total(page: dict[str, float], family: str, label: str = "", value: str = "") -> float:
    """The sum of a family's series (those with `label`=`value`, when given)."""
    want = f'{label}="{value}"'
    return sum(
        v
        for name, v in page.items()
        if name.split("{", 1)[0] == family and (not label or want in name)
    )


def counters(page: dict[str, float]) -> dict[str, float]:
    """Each outcome's proxy counter on a page (and the bound of those it cannot always see)."""
    found = {outcome: total(page, *where) for outcome, where in COUNTER.items()}
    return found | {f"{o}_bound": total(page, *where) for o, where in UNSEEN.items()}


async def settle(
    pid: int, metrics: str, fds_before: int, engine: int
) -> tuple[dict[str, float], int]:
    """Once the clients have left: the proxy's counters when two scrapes agree (a hang-up is
    counted when the proxy sees the close), and its descriptors other than the upstream pool's
    keep-alive connections to the engine, when back to `fds_before` (within SETTLED s)."""
    deadline = time.monotonic() + SETTLED
    last: dict[str, float] | None = None
    while True:
        now = counters(await asyncio.to_thread(scrape, metrics))
        fds = proc_stats(pid)[1] - pooled(pid, engine)
        if (now == last and fds <= fds_before) or time.monotonic() > deadline:
            return now, fds
        last = now
        await asyncio.sleep(0.5)


def pooled(pid: int, port: int) -> int:
    """The process's TCP connections to `port` on 127.0.0.1 (Linux's /proc/net/tcp)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = fd.readlink().name
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    remote = f"0100007F:{port:04X}"
    rows = Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]
    return sum(1 for row in rows if (f := row.split())[2] == remote and f[9] in inodes)


def matched(tally: Tally, before: dict[str, float], after: dict[str, float]) -> list[str]:
    """Outcomes whose client count differs from the proxy's counter (its change over the run);
    for those it cannot always see (`UNSEEN`), that falls outside [its counter, the bound]."""
    seen = {o: tally.requests.get(o, 0) + tally.silent.get(o, 0) for o in COUNTER}
    counted = {o: after[o] - before[o] for o in COUNTER}
    problems = []
    for o in COUNTER:
        bound = after.get(f"{o}_bound", 0) - before.get(f"{o}_bound", 0)
        ok = counted[o] <= seen[o] <= bound if o in UNSEEN else seen[o] == counted[o]
        if not ok:
            within = f" (at most {bound:.0f})" if o in UNSEEN else ""
            saw = f"{o}: clients saw {seen[o]}, the proxy counted {counted[o]:.0f}"
            problems.append(saw + within)
    return problems


def percentile(values: list[float], q: float) -> float | None:
    if len(values) < 20:
        return None
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


async def soak(args: argparse.Namespace, tmp: Path) -> tuple[list[Report], dict[str, Any]]:
    sim_port, metrics_port, proxy_port = free_port(), free_port(), free_port()
    config = tmp / "specdec.yaml"
    conf = SIDECAR_CONF.format(
        metrics=metrics_port, upstream=sim_port, port=proxy_port, model=MODEL
    )
    limit = f"  default_route: other\n  max_connections: {args.max_connections}\n"
    config.write_text(
        f"windows: [{', '.join(args.windows)}]\n" + conf.replace("  default_route: other\n", limit)
    )
    engine = Engine(sim_port, args.speed, tmp)
    sidecar = spawn(
        [sys.executable, "-m", "exporter", "serve", "--config", str(config)], tmp / "sidecar.log"
    )
    metrics = f"http://127.0.0.1:{metrics_port}/metrics"
    try:
        await asyncio.to_thread(wait_http, sidecar, f"http://127.0.0.1:{metrics_port}/-/ready")
        page = await asyncio.to_thread(scrape, metrics)
        while not total(page, "specdec_target_up"):  # its scrape connection to the engine open
            await asyncio.sleep(0.1)
            page = await asyncio.to_thread(scrape, metrics)
        rss_start, fds_start, _ = proc_stats(sidecar.pid)
        fds_start -= pooled(sidecar.pid, sim_port)
        before = counters(page)
        load, reporter = Load(args, engine, proxy_port), Reporter(args, sidecar.pid, metrics)
        await load.run(reporter)
        after, fds_end = await settle(sidecar.pid, metrics, fds_start, sim_port)
        page = await asyncio.to_thread(scrape, metrics)
        rss_end = proc_stats(sidecar.pid)[0]
    finally:
        stop(sidecar)
        stop(engine.proc)
    log = (tmp / "sidecar.log").read_text(errors="replace")
    if sidecar.returncode != 0 or "Traceback" in log:
        raise RuntimeError(
            f"the sidecar exited {sidecar.returncode}; the end of its log:\n{log[-2000:]}"
        )
    tally = load.tally
    ttft = {
        path: {"p50_ms": _ms(percentile(v, 50)), "p99_ms": _ms(percentile(v, 99)), "n": len(v)}
        for path, v in tally.ttft.items()
    }
    figures = {
        "requests": load.sent,
        "outcomes": tally.requests,
        "silent_connections": tally.silent,
        "proxy_counted": {o: after[o] - before[o] for o in after},
        "mismatches": matched(tally, before, after),
        "lost_examples": tally.examples,
        "connections_idle_closed": total(
            page, "specdec_proxy_shed_requests_total", "limit", "connections_idle_closed"
        ),
        "write_timeouts": total(page, "specdec_proxy_client_timeouts_total", "phase", "write"),
        "rss_mb": {"start": round(rss_start, 1), "end": round(rss_end, 1)},
        "fds": {"start": fds_start, "end": fds_end},
        "ttft": ttft,
        "ttft_p99_added_ms": _added(ttft),
        "engine_restarts": total(page, "specdec_engine_restarts_total"),
        "internal_errors": total(page, "specdec_proxy_internal_errors_total"),
        "skipped_ticks": load.skipped,
    }
    refused = tally.refused()
    cpu = reporter.reports[-1].cpu_share if reporter.reports else 0.0
    final = Report(
        round(args.minutes, 2), load.sent, tally.lost(), refused, round(rss_end, 1), fds_end,
        len(page), cpu, figures["internal_errors"], figures["engine_restarts"],
    )  # fmt: skip
    reporter.reports.append(final)
    SEEN.update(reporter.seen)
    return reporter.reports, figures


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 2)


def _added(ttft: dict[str, dict[str, Any]]) -> float | None:
    proxy, direct = ttft["proxy"]["p99_ms"], ttft["direct"]["p99_ms"]
    return None if proxy is None or direct is None else round(proxy - direct, 2)


SEEN: dict[str, float] = {}  # series -> minutes into the run it first appeared
# labels whose values are a fixed set in the code (an outcome, not a name from outside): a new
# value of one of them is a first occurrence, not growth
BOUNDED = re.compile(r'(?:status|finish_reason|kind|reason|stage|limit|phase)="[^"]*",?')
MODEL_NAME = re.compile(r'model_name="[^"]*",?')  # "" on a request no model answered (a 502)


def verdict(reports: list[Report], figures: dict[str, Any], args: argparse.Namespace) -> list[str]:
    """What --check refuses; empty when the run is clean."""
    problems = []
    end = reports[-1]
    if end.lost:
        problems.append(f"{end.lost} requests lost: {figures['lost_examples'][:3]}")
    problems += figures["mismatches"]
    bad_silent = {o: n for o, n in figures["silent_connections"].items() if o not in COUNTER}
    if bad_silent:
        problems.append(f"connections that sent nothing closed without an answer: {bad_silent}")
    if end.internal_errors:
        problems.append(f"{end.internal_errors:.0f} internal errors in the sidecar")
    if end.engine_restarts != args.restarts:
        problems.append(
            f"the sidecar counted {end.engine_restarts:.0f} engine restarts, not {args.restarts}"
        )
    if figures["fds"]["end"] > figures["fds"]["start"]:
        problems.append(f"descriptors {figures['fds']} did not come back once the clients left")
    problems += _growth(reports, args)
    return problems


def _growth(reports: list[Report], args: argparse.Namespace) -> list[str]:
    """Series of a new name or label set after warm-up, and RSS growth after the plateau."""
    problems = []
    end = reports[-1]
    longest = max(parse_duration(w) for w in args.windows)
    first = next(
        (i for i, r in enumerate(reports) if r.seconds * 60 >= longest + args.report_every),
        len(reports) - 1,
    )
    settled = reports[max(WARM_UP_REPORTS, first) :] or reports[-1:]
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
        reports, figures = asyncio.run(soak(args, Path(tmp)))
    print(
        f"end: {figures['requests']} requests: {figures['outcomes']}; connections that sent "
        f"nothing: {figures['silent_connections']}; the proxy counted {figures['proxy_counted']}"
    )
    print(
        f"TTFT through the proxy {figures['ttft']['proxy']}, direct {figures['ttft']['direct']}"
        f": p99 added {figures['ttft_p99_added_ms']} ms; RSS {figures['rss_mb']} MB, "
        f"descriptors {figures['fds']}"
    )
    problems = verdict(reports, figures, args)
    figures["problems"] = problems
    if args.json:
        Path(args.json).write_text(
            json.dumps({"reports": [asdict(r) for r in reports], "figures": figures}, indent=1)
        )
    if args.record:
        print("recorded:", record("soak", {**figures, "reports": [asdict(r) for r in reports]}))
    for problem in problems:
        print("soak: FAIL:", problem)
    return 1 if problems and args.check else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--rate", type=float, default=40.0, help="pooled requests per second")
    parser.add_argument("--max-connections", type=int, default=32, help="the proxy's limit")
    parser.add_argument("--burst", type=int, help="clients per burst (1.5 x the limit)")
    parser.add_argument("--burst-every", type=float, default=15.0, help="seconds")
    parser.add_argument("--churn", type=float, default=5.0, help="silent connections a second")
    parser.add_argument("--slow", type=float, default=1.0, help="slow-reader streams a second")
    parser.add_argument("--restarts", type=int, default=1, help="engine restarts, spread evenly")
    parser.add_argument("--direct", type=float, default=0.1, help="share of pooled to the sim")
    parser.add_argument("--report-every", type=float, default=60.0, help="seconds")
    parser.add_argument("--windows", type=lambda s: s.split(","), default=["1m", "5m", "15m"])
    parser.add_argument("--speed", type=float, default=50.0, help="the simulator's --speed")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rss-growth-mb", type=float, default=5.0)
    parser.add_argument("--json", help="write every report and the figures to this file")
    add_outputs(parser, json_file=False)
    parser.add_argument("--check", action="store_true", help="exit 1 on a problem")
    args = parser.parse_args(argv)
    if args.burst is None:
        args.burst = args.max_connections * 3 // 2
    return guarded("soak", run, args)


if __name__ == "__main__":
    sys.exit(main())
