"""What the route-tagging proxy adds to a streamed completion, against nginx and no proxy at all.

Three paths to the same simulator (`specdec sim --speed 1000`, 64-token streamed chat
completions), each a separate process from this script, which is the load generator
(`_stream_client.py`, lean on CPU, on uvloop when installed):

    direct  client -> simulator
    nginx   client -> Debian's nginx (plain reverse proxy: proxy_buffering off, HTTP/1.1
            keep-alive upstream) -> simulator; skipped with a message if nginx is not on PATH
    proxy   client -> `specdec serve` with a `proxy:` section (routes voice_chat by header and
            coding_agent by path prefix; scraping the simulator's /metrics) -> simulator

In one run, interleaved rounds (the order of the paths rotates each round) at 1 and 64
concurrent streams. Per path and concurrency: TTFT p50/p99 as the client sees it (request sent
-> first content token received), added TTFT p50 over direct, completed streams/s, and the CPU
time (utime + stime from /proc/PID/stat, the whole process group for nginx's master and
workers) the proxy and the simulator spent per streamed request. Then 1,000 requests with 1,000
distinct X-Route values go through our proxy and its RSS is read. Goals (the proxy's speed):
added TTFT p50 at c=1 within 0.3 ms of nginx's; at c=64 at most 2x nginx's; proxy CPU per
streamed request <= 5 ms; throughput at c=64 >= 0.9 of direct; sidecar RSS <= 80 MB.

    python bench/bench_proxy.py [--rounds 4] [--n1 300] [--n64 2000] [--pin] [--serve-from DIR]
                                [--venv DIR] [--json FILE] [--check] [--record]
                                [--request-log off|default|all]

`--request-log default` adds a fourth path, `logged`: a second `specdec serve`, the same config
with its request log on at the default sampling (every failed, low-acceptance or slow request,
1 % of the rest; `all` logs every request), in the same rounds. Its CPU per request over the
first proxy's, pooled and per round, is the log's cost; it is printed with how many lines the
log wrote and why.

The proxy runs on the interpreter of `--venv DIR` when given: the install a user gets, made
there first (if DIR does not exist) with the README's own line (`python3 -m venv DIR`, then
`pip install -e .`); else on this interpreter. The event loop and parser it ran on are read
from its `specdec_runtime_info` and printed with the figures.

By default nothing is pinned: on a 2-core machine the load generator, the simulator and the proxy
share the cores, as they would on a small host; that contention is part of what c=64 measures.
`--pin` runs the simulator alone on the last CPU and everything else on the others, every path
alike, as on a host where the inference server has cores of its own. The load generator is kept
lean (~1 ms of CPU per c=64 stream; aiohttp's client took 1.7-2.9) so that it takes as little as
it can of what the paths under test share. Load
from outside the benchmark is measured per segment ("other": /proc/stat busy time less the
benchmark's own processes); when some rounds were not quiet, the goals are judged again on the
quiet rounds only. At c=64 a sampler also records how often the simulator shared its CPU
with another runnable process of the benchmark ("crowded"): the scheduler sometimes packs the
simulator and the process it talks to onto one CPU for seconds while the other is half idle, and
such a round is slow for reasons that are not the proxy's cost (reported per round, not used to
judge). The reading and the latest figures: docs/BENCHMARKS.md §3; every recorded run:
`python3 bench/render.py --bench bench_proxy --all --notes`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from _run import (
    REPO,
    SIDECAR_CONF,
    add_outputs,
    die_with_parent,
    free_port,
    guarded,
    keep,
    revision,
)
from _stream_client import Pool, Sample

from exporter.process import loop_factory

TICKS = os.sysconf("SC_CLK_TCK")
READY_DEADLINE = 30.0
MODEL = "sim-27b"
PATHS = ("direct", "nginx", "proxy", "logged")
# the proxies' processes, as cpu_snapshot names them: `logged` is a second `specdec serve`, the
# same config with the request log on, run in the same rounds as `proxy` (--request-log)
PROXIES = {"proxy": "sidecar", "logged": "logged"}
# --request-log: the second proxy's request log on at its default sampling, or every request
# logged (the cost of a line); added to its proxy: section ("off": no second proxy)
REQUEST_LOG = {
    "off": "",
    "default": "  request_log: {enabled: true}\n",
    "all": "  request_log: {enabled: true, sample: 1}\n",
}
CONCURRENCY = (1, 64)
DISTINCT_ROUTES = 1000
# the proxy's speed goals
GOAL_C1_MARGIN_MS = 0.3
GOAL_C64_FACTOR = 2.0
GOAL_CPU_MS = 5.0
GOAL_THROUGHPUT = 0.9
GOAL_RSS_MB = 80.0
QUIET_CORES = 0.25  # a round is quiet when the machine's other load stayed below this
SAMPLE_SECONDS = 0.01  # the crowding sampler's period: ~2 % of a core, in the load generator

_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # no *_proxy for 127.0.0.1

NGINX_CONF = """\
worker_processes auto;
pid {tmp}/nginx.pid;
error_log {tmp}/nginx-error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {tmp}/client_body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    upstream sim {{
        server 127.0.0.1:{upstream};
        keepalive 128;
    }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://sim;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_buffering off;
        }}
    }}
}}
"""


# ---------------------------------------------------------------- child processes


@dataclass
class Child:
    """A child process in its own process group (nginx's workers are in it too)."""

    name: str
    proc: subprocess.Popen[bytes]
    log: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def check(self) -> None:
        if self.proc.poll() is not None:
            tail = self.log.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{tail}")

    def stop(self) -> None:
        """SIGTERM to the whole group, SIGKILL after 5 s."""
        for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)
            try:
                self.proc.wait(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                continue
        deadline = time.monotonic() + 2.0  # the group's other members (nginx workers)
        while group_pids(self.proc.pid) and time.monotonic() < deadline:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            time.sleep(0.05)


def spawn(name: str, argv: list[str], tmp: Path, cwd: Path = REPO) -> Child:
    log = tmp / f"{name}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            argv,
            cwd=cwd,  # `python -m exporter` runs the checkout it starts in
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            preexec_fn=die_with_parent,
            start_new_session=True,  # its own process group; a Ctrl-C reaches this script only
        )
    return Child(name, proc, log)


def wait_http(child: Child, url: str) -> None:
    deadline = time.monotonic() + READY_DEADLINE
    while time.monotonic() < deadline:
        child.check()
        with contextlib.suppress(OSError), _DIRECT.open(url, timeout=1.0) as resp:
            if resp.status == 200:
                return
        time.sleep(0.05)
    raise RuntimeError(f"{child.name} not ready at {url} within {READY_DEADLINE:.0f}s")


def group_pids(pgid: int) -> list[int]:
    pids = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry.name}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()  # from the 3rd field (state) on
        if int(fields[2]) == pgid:
            pids.append(int(entry.name))
    return pids


def group_cpu(pgid: int) -> float:
    """utime + stime (seconds) of every live process in the group."""
    total = 0
    for pid in group_pids(pgid):
        with contextlib.suppress(OSError):
            stat = Path(f"/proc/{pid}/stat").read_text()
            fields = stat[stat.rindex(")") + 2 :].split()
            total += int(fields[11]) + int(fields[12])
    return total / TICKS


def machine_busy() -> float:
    """CPU seconds all cores spent not idle (kernel and softirq included), from /proc/stat."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = values[3] + values[4]  # idle + iowait
    return (sum(values[:8]) - idle) / TICKS  # guest time is already in user


def rss_mib(pid: int) -> tuple[float, float]:
    """VmRSS and VmHWM (peak) in MiB."""
    status = Path(f"/proc/{pid}/status").read_text()
    kib = {k: int(v) for k, v in re.findall(r"^(VmRSS|VmHWM):\s+(\d+) kB", status, re.M)}
    return kib["VmRSS"] / 1024, kib["VmHWM"] / 1024


class Crowding(threading.Thread):
    """How often the simulator, wanting a CPU, shared its CPU with another of the benchmark's
    processes that wanted one too (both runnable, same CPU: /proc/PID/stat fields 3 and 39).
    On 2 cores the scheduler sometimes packs the simulator with the process it talks to onto
    one CPU for seconds while the other is half idle; this shows when a round did that."""

    def __init__(self, sim: int, others: list[int]) -> None:
        super().__init__(daemon=True)
        self.sim, self.others = sim, others
        self.samples = self.shared = 0
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(SAMPLE_SECONDS):
            with contextlib.suppress(OSError, ValueError):
                state, cpu = _placement(self.sim)
                if state != "R":
                    continue
                self.samples += 1
                self.shared += any(_placement(pid) == ("R", cpu) for pid in self.others)

    def stop(self) -> float:
        self.done.set()
        self.join()
        return self.shared / self.samples if self.samples else 0.0


def _placement(pid: int) -> tuple[str, int]:
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()
    return fields[0], int(fields[36])


# ---------------------------------------------------------------- segments


@dataclass
class Segment:
    """One path at one concurrency in one round."""

    path: str
    concurrency: int
    round: int
    samples: list[Sample]
    wall: float
    cpu: dict[str, float]  # CPU seconds spent during the segment, by cpu_snapshot's keys
    crowded: float = 0.0  # share of the simulator's runnable samples spent sharing its CPU

    @property
    def ok(self) -> int:
        return sum(s.ok for s in self.samples)

    @property
    def proxy_cpu(self) -> float | None:
        """The proxy process(es) of this path (sidecar's CPU when idle is its scrapes)."""
        key = PROXIES.get(self.path, "nginx" if self.path == "nginx" else None)
        return self.cpu[key] if key else None

    @property
    def unattributed(self) -> float:
        """Machine CPU not in any process of this benchmark: other load, kernel softirq."""
        ours = ("sim", "sidecar", "logged", "nginx", "client")
        return self.cpu["machine"] - sum(self.cpu[k] for k in ours)

    @property
    def ttfts(self) -> list[float]:
        return [s.ttft for s in self.samples if s.ok and s.ttft is not None]


def request_body(max_tokens: int) -> bytes:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Hello, how are you today?"}],
        "max_tokens": max_tokens,
        "stream": True,
    }
    return json.dumps(body).encode()


# ---------------------------------------------------------------- the benchmark


@dataclass
class Rig:
    sim: Child
    proxy: Child
    nginx: Child | None
    urls: dict[str, str]  # path -> chat completions URL
    metrics_url: str  # the sidecar's own /metrics
    logged: Child | None = None  # the same proxy with its request log on (--request-log)
    logged_metrics_url: str = ""


@dataclass
class Results:
    args: dict[str, Any]
    segments: list[Segment] = field(default_factory=list)
    rss: dict[str, float] = field(default_factory=dict)
    sanity: dict[str, Any] = field(default_factory=dict)


def python(args: argparse.Namespace) -> str:
    """The interpreter the proxy runs on: --venv's (made with the README's install line if it
    does not exist yet), or this one."""
    if args.venv is None:
        return sys.executable
    venv = Path(args.venv)
    if not (venv / "bin" / "python").exists():
        print(f"making {venv} with the README's install line (python3 -m venv; pip install -e .)")
        subprocess.run(["python3", "-m", "venv", str(venv)], check=True)
        pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "-e", str(REPO)]
        subprocess.run(pip, check=True)
    return str(venv / "bin" / "python")


def runtime(metrics_url: str) -> str:
    """What the proxy says it runs on (its `specdec_runtime_info`)."""
    with _DIRECT.open(metrics_url, timeout=5.0) as resp:
        page = resp.read().decode()
    line = next((ln for ln in page.splitlines() if ln.startswith("specdec_runtime_info")), "")
    labels = dict(re.findall(r'(\w+)="([^"]*)"', line))
    if not labels:
        return "unknown (no specdec_runtime_info: a proxy older than the metric)"
    return (
        f"{labels['event_loop']} {labels['event_loop_version']}, "
        f"{labels['http_parser']} {labels['http_parser_version']}, Python {labels['python']}"
    )


def start(tmp: Path, args: argparse.Namespace, children: list[Child]) -> Rig:
    sim_port = free_port()
    sim = spawn(
        "sim",
        [
            sys.executable,
            "-m",
            "exporter",
            "sim",
            "--listen",
            f"127.0.0.1:{sim_port}",
            "--speed",
            str(args.speed),
            "--model",
            MODEL,
            "--seed",
            "0",
        ],
        tmp,
    )
    children.append(sim)
    wait_http(sim, f"http://127.0.0.1:{sim_port}/health")
    urls = {"direct": f"http://127.0.0.1:{sim_port}/v1/chat/completions"}

    nginx: Child | None = None
    binary = shutil.which("nginx")
    if args.no_nginx:
        print("nginx: skipped (--no-nginx)")
    elif binary is None:
        print(
            "nginx: NOT FOUND on PATH, skipping the nginx path "
            "(install: apt-get install -y nginx; it lives in /usr/sbin)"
        )
    else:
        nginx_port = free_port()
        conf = tmp / "nginx.conf"
        conf.write_text(NGINX_CONF.format(tmp=tmp, upstream=sim_port, port=nginx_port))
        nginx = spawn(
            "nginx",
            [
                binary,
                "-p",
                str(tmp),
                "-c",
                str(conf),
                "-e",
                str(tmp / "nginx.stderr"),
                "-g",
                "daemon off;",
            ],
            tmp,
        )
        children.append(nginx)
        wait_http(nginx, f"http://127.0.0.1:{nginx_port}/health")
        urls["nginx"] = f"http://127.0.0.1:{nginx_port}/v1/chat/completions"

    proxy, proxy_url, metrics_url = serve(tmp, args, sim_port, "proxy", "")
    children.append(proxy)
    urls["proxy"] = proxy_url
    logged, logged_metrics = None, ""
    if args.request_log != "off":
        logged, urls["logged"], logged_metrics = serve(
            tmp, args, sim_port, "logged", REQUEST_LOG[args.request_log]
        )
        children.append(logged)
    return Rig(sim, proxy, nginx, urls, metrics_url, logged, logged_metrics)


def serve(
    tmp: Path, args: argparse.Namespace, sim_port: int, name: str, extra: str
) -> tuple[Child, str, str]:
    """A `specdec serve` proxying to the simulator (`extra` added to its proxy: section): the
    child, its chat completions URL and its /metrics."""
    proxy_port, metrics_port = free_port(), free_port()
    config = tmp / f"{name}.yaml"
    config.write_text(
        SIDECAR_CONF.format(
            metrics=metrics_port, upstream=sim_port, port=proxy_port, model=MODEL
        ).replace("  default_route: other\n", "  default_route: other\n" + extra)
    )
    proxy = spawn(
        name,
        [
            python(args),
            "-m",
            "exporter",
            "serve",
            "--config",
            str(config),
            "--log-level",
            "warning",
        ],
        tmp,
        args.serve_from,
    )
    wait_http(proxy, f"http://127.0.0.1:{metrics_port}/-/healthy")
    wait_http(proxy, f"http://127.0.0.1:{proxy_port}/health")
    return (
        proxy,
        f"http://127.0.0.1:{proxy_port}/v1/chat/completions",
        f"http://127.0.0.1:{metrics_port}/metrics",
    )


async def measure(rig: Rig, args: argparse.Namespace, results: Results) -> None:
    body = request_body(args.tokens)
    voice = {"Content-Type": "application/json", "X-Route": "voice"}
    paths = [p for p in PATHS if p in rig.urls]
    pool = Pool()
    try:
        # warm-up, not recorded: connections pooled, code paths and allocators warm
        warmup_proxied = 0
        for p in paths:
            for n, c in ((20, 1), (128, 64)):
                warm, _ = await pool.run(rig.urls[p], body, n, c, lambda _: voice)
                warmup_proxied += sum(s.ok for s in warm) if p == "proxy" else 0
        others = [os.getpid()] + [
            pid
            for child in (rig.proxy, rig.logged, rig.nginx)
            if child
            for pid in group_pids(child.pid)
        ]
        started = time.monotonic()
        for r in range(args.rounds):
            for c in CONCURRENCY:
                n = args.n1 if c == 1 else args.n64
                order = paths[r % len(paths) :] + paths[: r % len(paths)]
                for p in order:
                    for child in (rig.sim, rig.proxy, rig.logged):
                        if child is not None:
                            child.check()
                    crowding = Crowding(rig.sim.pid, others) if c > 1 else None
                    if crowding is not None:
                        crowding.start()
                    before = cpu_snapshot(rig)
                    samples, wall = await pool.run(rig.urls[p], body, n, c, lambda _: voice)
                    after = cpu_snapshot(rig)
                    cpu = {k: after[k] - before[k] for k in before}
                    crowded = crowding.stop() if crowding is not None else 0.0
                    seg = Segment(p, c, r, samples, wall, cpu, crowded)
                    results.segments.append(seg)
                    print(
                        f"  round {r + 1}/{args.rounds} c={c:<2} {p:<6} {seg.ok:>5}/{n} ok "
                        f"in {wall:6.2f} s, TTFT p50 {median_ms(seg.ttfts):7.3f} ms, "
                        f"other load {seg.unattributed / wall:.2f} cores"
                        + (f", sim crowded {crowded:.0%}" if crowding is not None else ""),
                        flush=True,
                    )
        results.sanity["rounds_seconds"] = time.monotonic() - started
        await rss_phase(rig, pool, body, results, warmup_proxied)
    finally:
        pool.close()


def pin(rig: Rig) -> None:
    """--pin: the simulator alone on the last CPU, everything else (this load generator,
    nginx, the sidecar) on the others, the same for every path. It models a host where the
    inference server has its own cores, and shows how much of a path's cost at c=64 is the
    scheduler running the proxy on the simulator's CPU."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise RuntimeError("--pin needs at least 2 CPUs")
    rest = set(cpus[:-1])
    places = [([os.getpid()], rest), (group_pids(rig.sim.pid), {cpus[-1]})]
    places += [(group_pids(c.pid), rest) for c in (rig.proxy, rig.logged, rig.nginx) if c]
    for pids, where in places:
        for pid in pids:
            for task in os.listdir(f"/proc/{pid}/task"):  # every thread; new ones inherit
                os.sched_setaffinity(int(task), where)
    print(f"pinned: simulator on CPU {cpus[-1]}; load generator, nginx, sidecar on {sorted(rest)}")


def cpu_snapshot(rig: Rig) -> dict[str, float]:
    return {
        "sim": group_cpu(rig.sim.pid),
        "sidecar": group_cpu(rig.proxy.pid),
        "logged": group_cpu(rig.logged.pid) if rig.logged else 0.0,
        "nginx": group_cpu(rig.nginx.pid) if rig.nginx else 0.0,
        "client": time.process_time(),
        "machine": machine_busy(),
    }


async def rss_phase(
    rig: Rig, pool: Pool, body: bytes, results: Results, warmup_proxied: int
) -> None:
    """1,000 distinct X-Route values through our proxy; then its RSS and its route labels."""
    before, _ = rss_mib(rig.proxy.pid)
    samples, wall = await pool.run(
        rig.urls["proxy"],
        body,
        DISTINCT_ROUTES,
        64,
        lambda i: {"Content-Type": "application/json", "X-Route": f"bench-{i:04d}-{os.getpid()}"},
    )
    agent_url = rig.urls["proxy"].replace("/v1/", "/agent/v1/", 1)
    plain = {"Content-Type": "application/json"}
    agent, _ = await pool.run(agent_url, body, 20, 4, lambda _: plain)
    await asyncio.sleep(1.5)  # one accounting tick and one scrape of the simulator
    after, peak = rss_mib(rig.proxy.pid)
    results.rss = {"before_mib": before, "after_mib": after, "peak_mib": peak}
    with _DIRECT.open(rig.metrics_url, timeout=5.0) as resp:
        page = resp.read().decode()
    routes = _by_label(page, "specdec_route_requests_total", "route", status="200")
    if rig.logged is not None:  # what its request log wrote, by why each line was kept
        with _DIRECT.open(rig.logged_metrics_url, timeout=5.0) as resp:
            logged = resp.read().decode()
        results.sanity["request_log_lines"] = _by_label(
            logged, "specdec_proxy_request_log_lines_total", "reason"
        )
        results.sanity["logged_requests"] = sum(
            _by_label(logged, "specdec_route_requests_total", "route").values()
        )
    proxied = sum(s.ok for seg in results.segments if seg.path == "proxy" for s in seg.samples)
    results.sanity.update(
        distinct_ok=sum(s.ok for s in samples),
        distinct_wall=wall,
        agent_ok=sum(s.ok for s in agent),
        route_requests_200=routes,
        voice_expected=proxied + warmup_proxied,
    )


def _by_label(page: str, family: str, label: str, **only: str) -> dict[str, float]:
    """`family`'s samples on a /metrics page summed by `label`, of those with `only`'s values."""
    out: dict[str, float] = {}
    for line in page.splitlines():
        if not line.startswith(family + "{"):
            continue
        head, _, value = line.rpartition(" ")
        labels = dict(re.findall(r'(\w+)="([^"]*)"', head))
        if label in labels and all(labels.get(k) == v for k, v in only.items()):
            out[labels[label]] = out.get(labels[label], 0.0) + float(value)
    return out


# ---------------------------------------------------------------- report


def median_ms(values: list[float]) -> float:
    return 1000 * statistics.median(values) if values else float("nan")


def pct_ms(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return 1000 * ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


@dataclass
class Summary:
    path: str
    concurrency: int
    requests: int
    failed: int
    p50: float  # ms, pooled over rounds
    p99: float
    round_p50s: list[float]
    throughput: float  # completed streams/s, all rounds
    round_throughputs: list[float]
    proxy_cpu_ms: float | None  # per streamed request
    proxy_cpu_net_ms: float | None  # ours only: less the sidecar's idle CPU rate x wall time
    sim_cpu_ms: float
    client_cpu_ms: float
    busy_cores: float  # machine-wide, averaged over the rounds' wall time
    unattributed_cores: float  # of which not in this benchmark's processes


def summarise(segments: list[Segment], path: str, c: int) -> Summary | None:
    mine = [s for s in segments if s.path == path and s.concurrency == c]
    if not mine:
        return None
    ttfts = [t for s in mine for t in s.ttfts]
    requests = sum(len(s.samples) for s in mine)
    ok = sum(s.ok for s in mine)
    cpu = [s.proxy_cpu for s in mine if s.proxy_cpu is not None]
    key = PROXIES.get(path, "sidecar")
    idle = [s for s in segments if s.path != path]
    idle_rate = sum(s.cpu[key] for s in idle) / sum(s.wall for s in idle) if idle else 0.0
    net = sum(s.cpu[key] - idle_rate * s.wall for s in mine)
    wall = sum(s.wall for s in mine)
    return Summary(
        path,
        c,
        requests,
        requests - ok,
        median_ms(ttfts),
        pct_ms(ttfts, 0.99),
        [median_ms(s.ttfts) for s in mine],
        ok / sum(s.wall for s in mine),
        [s.ok / s.wall for s in mine],
        1000 * sum(cpu) / ok if cpu and ok else None,
        1000 * net / ok if path in PROXIES and idle and ok else None,
        1000 * sum(s.cpu["sim"] for s in mine) / max(ok, 1),
        1000 * sum(s.cpu["client"] for s in mine) / max(ok, 1),
        sum(s.cpu["machine"] for s in mine) / wall,
        sum(s.unattributed for s in mine) / wall,
    )


def paired_added(segments: list[Segment], path: str, c: int) -> list[float]:
    """Per round: p50 of the path minus p50 of direct in the same round (ms)."""
    out = []
    for seg in segments:
        if seg.path == path and seg.concurrency == c:
            direct = next(
                s
                for s in segments
                if s.path == "direct" and s.concurrency == c and s.round == seg.round
            )
            out.append(median_ms(seg.ttfts) - median_ms(direct.ttfts))
    return out


Goal = tuple[str, bool | None, str]  # (goal, met; None when it could not be judged, detail)
Sums = dict[tuple[str, int], Summary | None]


def quiet_segments(segments: list[Segment]) -> list[Segment]:
    """The (round, concurrency) groups in which no path saw other load on the machine."""
    groups: dict[tuple[int, int], list[Segment]] = {}
    for seg in segments:
        groups.setdefault((seg.round, seg.concurrency), []).append(seg)
    return [
        seg
        for group in groups.values()
        if all(s.unattributed / s.wall < QUIET_CORES for s in group)
        for seg in group
    ]


def report(results: Results) -> tuple[list[Goal], list[Goal] | None]:
    """Table and goals over all rounds; again over the quiet rounds only if some were not."""
    segs = results.segments
    sums, added = table(segs)
    goals = evaluate(sums, added, results.rss)
    print_goals("Goals, all rounds:", goals)
    crowding_note(segs)
    quiet = quiet_segments(segs)
    if len(quiet) == len(segs):
        print(f"(every round was quiet: other load < {QUIET_CORES} cores in every segment)")
        return goals, None
    counts = {c: len({s.round for s in quiet if s.concurrency == c}) for c in CONCURRENCY}
    print()
    print(
        f"Quiet rounds only (other load < {QUIET_CORES} cores in every path of the round): "
        + ", ".join(f"{counts[c]} of {results.args['rounds']} at c={c}" for c in CONCURRENCY)
    )
    if not any(counts.values()):
        print("  no quiet round to judge on")
        return goals, None
    sums, added = table(quiet, notes=False)
    quiet_goals = evaluate(sums, added, results.rss)
    print_goals("Goals, quiet rounds only:", quiet_goals)
    return goals, quiet_goals


def crowding_note(segments: list[Segment]) -> None:
    """Per c=64 round: each path's throughput over direct's, and how crowded the simulator was.
    Informative only: the goals are judged on every round, as the issue asks."""
    rounds: dict[int, dict[str, Segment]] = {}
    for seg in segments:
        if seg.concurrency > 1:
            rounds.setdefault(seg.round, {})[seg.path] = seg
    print()
    print("c=64 per round: throughput / direct's (simulator crowded: share of its runnable time")
    print("spent sharing its CPU with another runnable process of the benchmark)")
    for r, segs in sorted(rounds.items()):
        direct = segs["direct"].ok / segs["direct"].wall
        cells = [
            f"{p} {segs[p].ok / segs[p].wall / direct:.2f} ({segs[p].crowded:.0%})"
            if p != "direct"
            else f"direct ({segs[p].crowded:.0%})"
            for p in PATHS
            if p in segs
        ]
        print(f"  round {r + 1}: " + ", ".join(cells))


# a line's CPU in the proxy's own code, in process: RequestLog fed a request that is kept, its
# writer thread formatting and writing to /dev/null; printed in microseconds per line
LINE_CPU = """
import os, resource, sys, time
sys.stdout = open(os.devnull, "w")
from exporter import logs
from exporter.accounting.ledger import RequestOutcome
from exporter.config import RequestLogConfig
from exporter.proxy.requestlog import RequestLog
logs.setup("info")
outcome = RequestOutcome(
    "voice_chat", "sim-27b", "200", 64, 20, "length", 0.01, 0.05, None, (60, 30),
    slices=(("input", "short"), ("output", "short")), trace_id="0af7651916cd43dd8448eb211c80319c",
    request_id="chatcmpl-abc123", at=time.time(), seconds=0.06,
)
log, every = RequestLog(capacity=1 << 16), RequestLogConfig(enabled=True, sample=1.0)
for _ in range(2000):  # warm
    log.offer(outcome, every)
log.flush()
usage = lambda: sum(resource.getrusage(resource.RUSAGE_SELF)[:2])
before = usage()
for _ in range(20000):
    log.offer(outcome, every)
log.flush()
print(1e6 * (usage() - before) / 20000, file=sys.stderr)
"""


def line_cpu_us(args: argparse.Namespace) -> float:
    """A request log line's CPU in microseconds (LINE_CPU, on the proxy's interpreter)."""
    done = subprocess.run(
        [python(args), "-c", LINE_CPU],
        cwd=args.serve_from,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return float(done.stderr.strip().splitlines()[-1])


def request_log_cost(results: Results, line_us: float | None) -> dict[str, Any] | None:
    """With --request-log: the logged proxy's CPU per request over the same proxy's without
    the log, per concurrency pooled over the rounds and per round (each round runs both)."""
    lines = results.sanity.get("request_log_lines")
    if lines is None:
        return None
    cost: dict[str, Any] = {"sampling": results.args["request_log"], "lines": lines}
    print()
    for c in CONCURRENCY:
        pairs = []
        for seg in results.segments:
            if seg.path == "logged" and seg.concurrency == c:
                plain = next(
                    s
                    for s in results.segments
                    if s.path == "proxy" and s.concurrency == c and s.round == seg.round
                )
                pairs.append((seg.cpu["logged"], seg.ok, plain.cpu["sidecar"], plain.ok))
        pooled = (sum(p[0] for p in pairs) / sum(p[1] for p in pairs)) / (
            sum(p[2] for p in pairs) / sum(p[3] for p in pairs)
        )
        rounds = [(a / n) / (b / m) for a, n, b, m in pairs]
        cost[f"c{c}"] = {"ratio": pooled, "rounds": rounds}
        print(
            f"request log ({results.args['request_log']}): at c={c} the proxy with it spent "
            f"x{pooled:.3f} the CPU per request of the proxy without it "
            f"(per round {min(rounds):.3f}..{max(rounds):.3f})"
        )
    written, served = sum(lines.values()), results.sanity["logged_requests"]
    print(
        f"  it wrote {written:.0f} lines for {served:.0f} requests ({written / max(served, 1):.1%}"
        "), by why: " + ", ".join(f"{k} {v:.0f}" for k, v in sorted(lines.items()) if v)
    )
    plain = summarise(results.segments, "proxy", 1)
    if line_us is not None and plain is not None and plain.proxy_cpu_ms:
        # finer than the rounds resolve: a line's own CPU times the share written
        share = written / max(served, 1)
        cost["line_us"] = line_us
        cost["c1_share_of_proxy_cpu"] = share * line_us / 1000 / plain.proxy_cpu_ms
        print(
            f"  a line costs {line_us:.0f} us of CPU in process (its writer thread included): at "
            f"{share:.1%} of requests {share * line_us:.1f} us a request, "
            f"{cost['c1_share_of_proxy_cpu']:.1%} of the proxy's {plain.proxy_cpu_ms:.2f} ms "
            "a request at c=1 in these rounds"
        )
    return cost


def print_goals(title: str, goals: list[Goal]) -> None:
    print()
    print(title)
    for name, met, detail in goals:
        verdict = "n/a" if met is None else "met" if met else "MISSED"
        print(f"  {verdict:<7} {name}: {detail}")


def table(segs: list[Segment], notes: bool = True) -> tuple[Sums, dict[tuple[str, int], float]]:
    sums = {(p, c): summarise(segs, p, c) for p in PATHS for c in CONCURRENCY}
    print()
    header = (
        f"{'path':<7} {'c':>3} {'streams':>7} {'fail':>4} {'TTFT p50':>9} {'p99':>8} "
        f"{'added p50':>10} {'per-round added':>17} {'streams/s':>10} {'proxy CPU':>10} "
        f"{'net':>6} {'sim CPU':>8} {'client CPU':>10} {'busy':>5} {'other':>5}"
    )
    print(header)
    units = (
        f"{'':<7} {'':>3} {'':>7} {'':>4} {'ms':>9} {'ms':>8} {'ms':>10} {'ms (min..max)':>17} "
        f"{'':>10} {'ms/req':>10} {'ms/req':>6} {'ms/req':>8} {'ms/req':>10} "
        f"{'cores':>5} {'cores':>5}"
    )
    print(units)
    print("-" * len(header))
    added: dict[tuple[str, int], float] = {}
    for c in CONCURRENCY:
        direct = sums[("direct", c)]
        if direct is None:
            continue
        for p in PATHS:
            s = sums[(p, c)]
            if s is None:
                continue
            add = s.p50 - direct.p50
            added[(p, c)] = add
            rounds = paired_added(segs, p, c)
            spread = f"{min(rounds):.3f}..{max(rounds):.3f}" if p != "direct" else ""
            cpu = f"{s.proxy_cpu_ms:.2f}" if s.proxy_cpu_ms is not None else "-"
            net = f"{s.proxy_cpu_net_ms:.2f}" if s.proxy_cpu_net_ms is not None else "-"
            print(
                f"{p:<7} {c:>3} {s.requests:>7} {s.failed:>4} {s.p50:>9.3f} {s.p99:>8.3f} "
                f"{(f'{add:+.3f}' if p != 'direct' else '-'):>10} {spread:>17} "
                f"{s.throughput:>10.1f} {cpu:>10} {net:>6} {s.sim_cpu_ms:>8.2f} "
                f"{s.client_cpu_ms:>10.2f} {s.busy_cores:>5.2f} {s.unattributed_cores:>5.2f}"
            )
        print()
    if not notes:
        return sums, added
    print(
        "TTFT: request sent -> first content token received by the client, pooled over rounds; "
        "added = path p50 - direct p50; per-round added pairs each round with its own direct run."
    )
    print(
        "CPU: utime+stime per completed stream (nginx: master + workers; proxy: the whole "
        f"`specdec serve` process, its 1 s scrape included); /proc resolution 1/{TICKS} s."
    )
    print(
        "net: ours less the sidecar's idle CPU rate (scrapes, ticks; measured while the other "
        "paths ran) times the round's wall time. busy: the whole machine's non-idle CPU "
        f"(/proc/stat, kernel included) over wall time, of {os.cpu_count()} cores; other: the "
        "part of it not in the benchmark's processes (other load on the machine, softirq)."
    )
    return sums, added


def evaluate(sums: Sums, added: dict[tuple[str, int], float], rss: dict[str, float]) -> list[Goal]:
    goals: list[Goal] = []
    ours1, ours64 = added.get(("proxy", 1)), added.get(("proxy", 64))
    ng1, ng64 = added.get(("nginx", 1)), added.get(("nginx", 64))
    if ours1 is not None and ng1 is not None:
        diff = ours1 - ng1
        goals.append(
            (
                f"added TTFT p50 at c=1 within {GOAL_C1_MARGIN_MS} ms of nginx's",
                diff <= GOAL_C1_MARGIN_MS,
                f"ours {ours1:+.3f} ms, nginx {ng1:+.3f} ms: {diff:+.3f} ms over nginx",
            )
        )
    else:
        goals.append(("added TTFT p50 at c=1 vs nginx", None, "no nginx run or no data"))
    if ours64 is not None and ng64 is not None:
        ratio = f"{ours64 / ng64:.2f}x nginx's" if ng64 > 0 else "nginx added nothing measurable"
        goals.append(
            (
                f"added TTFT p50 at c=64 <= {GOAL_C64_FACTOR:g}x nginx's",
                ours64 <= GOAL_C64_FACTOR * max(ng64, 0.0),
                f"ours {ours64:+.3f} ms, nginx {ng64:+.3f} ms: {ratio}",
            )
        )
    else:
        goals.append(("added TTFT p50 at c=64 vs nginx", None, "no nginx run or no data"))
    cpus = {
        c: s.proxy_cpu_ms
        for c in CONCURRENCY
        if (s := sums[("proxy", c)]) is not None and s.proxy_cpu_ms is not None
    }
    nets = {
        c: f" (net {s.proxy_cpu_net_ms:.2f})"
        if (s := sums[("proxy", c)]) is not None and s.proxy_cpu_net_ms is not None
        else ""
        for c in cpus
    }
    goals.append(
        (
            f"proxy CPU per streamed request <= {GOAL_CPU_MS:g} ms",
            max(cpus.values()) <= GOAL_CPU_MS if cpus else None,
            ", ".join(f"c={c}: {v:.2f} ms{nets[c]}" for c, v in cpus.items()),
        )
    )
    ours_t, direct_t = sums[("proxy", 64)], sums[("direct", 64)]
    if ours_t is not None and direct_t is not None:
        share = ours_t.throughput / direct_t.throughput
        nginx_t = sums[("nginx", 64)]
        nginx_note = f"; nginx {nginx_t.throughput / direct_t.throughput:.2f}" if nginx_t else ""
        pairs = zip(ours_t.round_throughputs, direct_t.round_throughputs, strict=True)
        rounds = [o / d for o, d in pairs]  # same rounds: segments are judged by round
        goals.append(
            (
                f"throughput at c=64 >= {GOAL_THROUGHPUT:g} of direct",
                share >= GOAL_THROUGHPUT,
                f"{ours_t.throughput:.1f} / {direct_t.throughput:.1f} streams/s = {share:.2f}"
                + nginx_note
                + f" (per round {min(rounds):.2f}..{max(rounds):.2f})",
            )
        )
    else:
        goals.append((f"throughput at c=64 >= {GOAL_THROUGHPUT:g} of direct", None, "no data"))
    rss_mb = rss["after_mib"] * 1024 * 1024 / 1e6
    goals.append(
        (
            f"sidecar RSS <= {GOAL_RSS_MB:g} MB after {DISTINCT_ROUTES} distinct X-Route values",
            rss_mb <= GOAL_RSS_MB,
            f"{rss['after_mib']:.1f} MiB = {rss_mb:.1f} MB (before the 1,000: "
            f"{rss['before_mib']:.1f} MiB, peak {rss['peak_mib']:.1f} MiB)",
        )
    )
    return goals


def sanity(results: Results) -> bool:
    s = results.sanity
    routes = s["route_requests_200"]
    bounded = set(routes) <= {"voice_chat", "coding_agent", "other"}
    exact = (
        routes.get("voice_chat") == s["voice_expected"]
        and routes.get("other") == s["distinct_ok"]
        and routes.get("coding_agent") == s["agent_ok"]
    )
    failed = sum(len(seg.samples) - seg.ok for seg in results.segments)
    ok = bounded and exact and failed == 0 and s["distinct_ok"] == DISTINCT_ROUTES
    print()
    print(
        f"sanity: {failed} failed streams in the rounds; {s['distinct_ok']}/{DISTINCT_ROUTES} "
        f"distinct-route streams ok in {s['distinct_wall']:.1f} s; proxy counted 200s by route "
        f"{ {k: int(v) for k, v in sorted(routes.items())} } (expected voice_chat "
        f"{s['voice_expected']}, other {s['distinct_ok']}, coding_agent {s['agent_ok']}); "
        f"route labels bounded: {bounded} -> {'ok' if ok else 'NOT OK'}"
    )
    return ok


# ---------------------------------------------------------------- main


def background_load(seconds: float = 2.0) -> float:
    """Cores busy on the machine before anything of ours runs (other users, other jobs)."""
    before = machine_busy()
    time.sleep(seconds)
    return (machine_busy() - before) / seconds


def run(args: argparse.Namespace) -> int:
    children: list[Child] = []
    results = Results(args={k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()})
    results.sanity["revision"] = revision(REPO)
    print(f"specdec at {results.sanity['revision']}")
    if args.serve_from != REPO:
        results.sanity["proxy_revision"] = revision(args.serve_from)
        print(f"the proxy (`specdec serve`) from {args.serve_from} at {revision(args.serve_from)}")
    load = background_load()
    results.sanity["background_cores"] = load
    print(
        f"background load before start: {load:.2f} of {os.cpu_count()} cores busy"
        + (" -- NOT QUIET: figures will be noisy (see the 'other' column)" if load > 0.2 else "")
    )
    with tempfile.TemporaryDirectory(prefix="specdec-bench-proxy-") as name:
        tmp = Path(name)
        try:
            rig = start(tmp, args, children)
            results.sanity["runtime"] = runtime(rig.metrics_url)
            print(f"the proxy runs on {results.sanity['runtime']} ({python(args)})")
            if args.pin:
                pin(rig)
            print(
                f"{os.cpu_count()} CPUs; sim pid {rig.sim.pid} (--speed {args.speed:g}), "
                f"proxy pid {rig.proxy.pid}, nginx pid {rig.nginx.pid if rig.nginx else '-'}; "
                f"{args.rounds} rounds x ({args.n1} streams at c=1, {args.n64} at c=64) per path, "
                f"max_tokens={args.tokens}, streamed chat completions"
            )
            with asyncio.Runner(loop_factory=loop_factory()) as runner:  # as the sidecar's
                runner.run(measure(rig, args, results))
        finally:
            for child in reversed(children):
                child.stop()
    goals, quiet_goals = report(results)
    logged = request_log_cost(results, line_cpu_us(args) if args.request_log != "off" else None)
    ok = sanity(results)
    print(f"rounds took {results.sanity['rounds_seconds']:.0f} s")
    if args.json or args.record:
        out = {
            "args": results.args,
            "rss": results.rss,
            "sanity": results.sanity,
            "goals": [{"goal": g, "met": m, "detail": d} for g, m, d in goals],
            "request_log": logged,
            "goals_quiet_rounds": None
            if quiet_goals is None
            else [{"goal": g, "met": m, "detail": d} for g, m, d in quiet_goals],
            "segments": [
                {
                    "path": seg.path,
                    "concurrency": seg.concurrency,
                    "round": seg.round,
                    "ok": seg.ok,
                    "requests": len(seg.samples),
                    "wall": seg.wall,
                    "ttft_p50_ms": median_ms(seg.ttfts),
                    "cpu_seconds": seg.cpu,
                    "other_load_cores": seg.unattributed / seg.wall,
                    "sim_crowded": seg.crowded,
                }
                for seg in results.segments
            ],
            "summaries": [
                vars(s)
                for p in PATHS
                for c in CONCURRENCY
                if (s := summarise(results.segments, p, c)) is not None
            ],
        }
        keep(args, "bench_proxy", out)
    if not ok:
        return 1
    return 1 if args.check and any(m is False for _, m, _ in goals) else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=4, help="interleaved rounds (default 4)")
    parser.add_argument("--n1", type=int, default=300, help="streams per round at c=1 (300)")
    parser.add_argument("--n64", type=int, default=2000, help="streams per round at c=64 (2000)")
    parser.add_argument("--tokens", type=int, default=64, help="max_tokens per stream (64)")
    parser.add_argument("--speed", type=float, default=1000.0, help="simulator --speed (1000)")
    parser.add_argument("--no-nginx", action="store_true", help="skip the nginx path")
    parser.add_argument(
        "--pin",
        action="store_true",
        help="simulator alone on the last CPU, all else on the others (default: unpinned)",
    )
    parser.add_argument(
        "--serve-from",
        type=Path,
        default=REPO,
        metavar="DIR",
        help="run the proxy from this checkout (e.g. a git worktree of an older revision), "
        "the simulator and load from this one: before and after against the same simulator",
    )
    parser.add_argument(
        "--venv",
        metavar="DIR",
        help="run the proxy on this venv's interpreter, made with the README's install line "
        "if it does not exist (the install a user gets)",
    )
    parser.add_argument(
        "--request-log",
        choices=("off", "default", "all"),
        default="off",
        help="the proxy's request log: off (default), on at its default sampling, or every "
        "request logged (its lines go to the proxy's log file)",
    )
    add_outputs(parser)
    parser.add_argument("--check", action="store_true", help="exit 1 when a goal is missed")
    return guarded("bench_proxy", run, parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
