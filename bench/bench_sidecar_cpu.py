"""CPU and memory of `specdec serve` scraping a 1-engine vLLM page every second.

A fake vLLM (http.server, in this process) serves the 1-engine fixture with its spec-decode
counters advancing on every request, gzip-compressed when the client accepts it, as vLLM's
prometheus_client endpoint does. `python -m exporter serve --interval 1` scrapes it; this
script scrapes the sidecar's own /metrics every 15 s, as Prometheus would. Over --seconds
(after --warmup) it reads the sidecar's utime+stime from /proc/PID/stat and reports CPU as a
percentage of one core, and RSS. The same-run reference is an idle Python process that has
imported aiohttp and prometheus_client and sleeps in asyncio: the difference is what scraping
and serving cost. Goal: <= 1 % of one core at a 1 s interval.

    python bench/bench_sidecar_cpu.py [--seconds 60] [--warmup 5] [--no-gzip] [--record]
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import os
import re
import select
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import IO, Any

from _pages import PAGE_1ENGINE, CounterPage
from _run import add_outputs, die_with_parent, free_port, guarded, keep

REPO = Path(__file__).resolve().parent.parent
TICKS = os.sysconf("SC_CLK_TCK")
READY_DEADLINE = 30.0
PROMETHEUS_EVERY = 15.0
PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0;q=0.5,"
    "application/openmetrics-text;version=0.0.1;q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2"
)
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # no *_proxy for 127.0.0.1
IDLE_CODE = (
    "import asyncio, aiohttp, prometheus_client\n"
    "print('ready', flush=True)\n"
    "asyncio.run(asyncio.sleep(1e9))\n"
)


class FakeVllm(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, page: CounterPage, use_gzip: bool) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.page = page
        self.use_gzip = use_gzip
        self.requests = 0
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/metrics"


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, like vLLM's uvicorn
    server: FakeVllm

    def do_GET(self) -> None:
        if self.path != "/metrics":
            self.send_error(404)
            return
        with self.server.lock:
            self.server.requests += 1
            step = self.server.requests
        body = self.server.page.render(step).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        if self.server.use_gzip and "gzip" in self.headers.get("Accept-Encoding", ""):
            body = gzip.compress(body)
            self.send_header("Content-Encoding", "gzip")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@dataclass(frozen=True)
class ProcStat:
    cpu_seconds: float
    rss_kib: int
    peak_rss_kib: int


def proc_stat(pid: int) -> ProcStat:
    """utime + stime (seconds) from /proc/PID/stat; VmRSS and VmHWM from /proc/PID/status."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()  # fields from the 3rd (state) on
    utime, stime = int(fields[11]), int(fields[12])
    status = Path(f"/proc/{pid}/status").read_text()
    kib = {k: int(v) for k, v in re.findall(r"^(VmRSS|VmHWM):\s+(\d+) kB", status, re.M)}
    return ProcStat((utime + stime) / TICKS, kib["VmRSS"], kib["VmHWM"])


def fetch(url: str, timeout: float = 5.0) -> str:
    request = urllib.request.Request(url, headers={"Accept": PROMETHEUS_ACCEPT})
    with _DIRECT.open(request, timeout=timeout) as resp:
        body: bytes = resp.read()
        return body.decode()


def wait_sidecar(proc: subprocess.Popen[bytes], url: str, target: str, log: Path) -> None:
    """Poll the sidecar's /metrics until it reports its target up, or fail at the deadline."""
    deadline = time.monotonic() + READY_DEADLINE
    up = re.compile(rf'^specdec_target_up\{{target="{re.escape(target)}"\}} 1\.0$', re.M)
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"sidecar exited with {proc.returncode}:\n{log.read_text()[-2000:]}")
        with contextlib.suppress(OSError):
            if up.search(fetch(url, timeout=1.0)):
                return
        time.sleep(0.05)
    raise RuntimeError(f"sidecar not up within {READY_DEADLINE:.0f}s:\n{log.read_text()[-2000:]}")


def wait_line(stream: IO[bytes], expected: bytes) -> None:
    if not select.select([stream], [], [], READY_DEADLINE)[0] or stream.readline() != expected:
        raise RuntimeError("the idle reference process did not start")


def sample_value(page: str, name: str, **labels: str) -> float | None:
    wanted = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in page.splitlines():
        if line.startswith(name + "{"):
            head, _, value = line.rpartition(" ")
            got = ",".join(sorted(head[len(name) + 1 : -1].split(",")))
            if got == wanted:
                return float(value)
    return None


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def run(args: argparse.Namespace) -> int:
    page = CounterPage(PAGE_1ENGINE.read_text(encoding="utf-8"))
    server = FakeVllm(page, use_gzip=not args.no_gzip)  # bound and listening already
    port = free_port()
    sidecar_url = f"http://127.0.0.1:{port}/metrics"
    target = f"127.0.0.1:{server.server_address[1]}"
    procs: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory(prefix="specdec-bench-") as tmp:
        log = Path(tmp) / "sidecar.log"
        flags = ["--interval", "1", "--listen", f"127.0.0.1:{port}"]
        try:
            with log.open("wb") as out:
                # children first, threads later: preexec_fn and fork are safe without threads
                idle = subprocess.Popen(
                    [sys.executable, "-c", IDLE_CODE],
                    stdout=subprocess.PIPE,
                    preexec_fn=die_with_parent,
                    start_new_session=True,  # a Ctrl-C reaches this script only
                )
                procs.append(idle)
                sidecar = subprocess.Popen(
                    [sys.executable, "-m", "exporter", "serve", "--target", server.url, *flags],
                    cwd=REPO,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    preexec_fn=die_with_parent,
                    start_new_session=True,  # a Ctrl-C reaches this script only
                )
                procs.append(sidecar)
            threading.Thread(target=server.serve_forever, daemon=True).start()
            assert idle.stdout is not None
            wait_line(idle.stdout, b"ready\n")
            wait_sidecar(sidecar, sidecar_url, target, log)
            return measure(args, server, sidecar, idle, sidecar_url, target)
        finally:
            for proc in procs:
                stop(proc)
            server.shutdown()
            server.server_close()


def measure(
    args: argparse.Namespace,
    server: FakeVllm,
    sidecar: subprocess.Popen[bytes],
    idle: subprocess.Popen[bytes],
    sidecar_url: str,
    target: str,
) -> int:
    time.sleep(args.warmup)  # measurement design (skip first-scrape costs), not synchronisation
    labels = {"target": target, "model_name": "Qwen/Qwen3-32B", "engine": "0"}
    first = fetch(sidecar_url)
    drafts0 = sample_value(first, "specdec_drafts_total", **labels)
    requests0 = server.requests
    t0 = time.monotonic()
    cpu0 = {p.pid: proc_stat(p.pid) for p in (sidecar, idle)}
    prometheus_scrapes = 0
    next_scrape = t0 + PROMETHEUS_EVERY / 2  # 4 scrapes in 60 s, spread through the period
    while (now := time.monotonic()) < t0 + args.seconds:
        if now >= next_scrape:
            fetch(sidecar_url)
            prometheus_scrapes += 1
            next_scrape += PROMETHEUS_EVERY
        time.sleep(max(0.0, min(next_scrape, t0 + args.seconds) - time.monotonic()))
    cpu1 = {p.pid: proc_stat(p.pid) for p in (sidecar, idle)}
    wall = time.monotonic() - t0
    requests = server.requests - requests0
    last = fetch(sidecar_url)
    if sidecar.poll() is not None or idle.poll() is not None:
        raise RuntimeError("a measured process exited during the measurement")

    def pct(pid: int) -> float:
        return 100.0 * (cpu1[pid].cpu_seconds - cpu0[pid].cpu_seconds) / wall

    side, ref = pct(sidecar.pid), pct(idle.pid)
    drafts1 = sample_value(last, "specdec_drafts_total", **labels)
    acceptance = sample_value(last, "specdec_acceptance_ratio", window="1m", **labels)
    errors = sum(
        float(line.rpartition(" ")[2])
        for line in last.splitlines()
        if line.startswith("specdec_scrape_errors_total{")
    )
    print(
        f"{wall:.1f} s measured after {args.warmup:g} s warm-up; sidecar --interval 1 on a "
        f"1-engine page ({'gzip' if not args.no_gzip else 'identity'}), "
        f"{requests} target scrapes, {prometheus_scrapes} scrapes of the sidecar's /metrics"
    )
    header = f"{'process':<44} {'CPU s':>6} {'% of one core':>14} {'RSS MiB':>8} {'peak':>6}"
    print(header)
    print("-" * len(header))
    for name, proc, share in (
        (f"specdec serve (pid {sidecar.pid})", sidecar, side),
        ("idle asyncio + aiohttp, prometheus_client", idle, ref),
    ):
        a, b = cpu0[proc.pid], cpu1[proc.pid]
        print(
            f"{name:<44} {b.cpu_seconds - a.cpu_seconds:>6.2f} {share:>13.2f}% "
            f"{b.rss_kib / 1024:>8.1f} {b.peak_rss_kib / 1024:>6.1f}"
        )
    ratio = f"{side / ref:.0f}x the idle process" if ref > 0 else "idle process used 0 ticks"
    print(f"{'scraping and serving add':<44} {'':>6} {side - ref:>13.2f}%   ({ratio})")
    print(f"CPU resolution: 1/{TICKS} s = {100 / TICKS / wall:.3f} % over the period")
    ok_work = (
        drafts0 is not None
        and drafts1 is not None
        and drafts1 > drafts0
        and acceptance is not None
        and errors == 0
        and requests >= 0.9 * wall
    )
    print(
        f"sanity: specdec_drafts_total {drafts0} -> {drafts1}, 1m acceptance {acceptance}, "
        f"scrape errors {errors:g}: {'ok' if ok_work else 'NOT OK'}"
    )
    verdict = "met" if side <= 1.0 else "NOT met"
    print(f"goal: <= 1 % of one core at a 1 s interval: {side:.2f} % -> {verdict}")
    s0, s1 = cpu0[sidecar.pid], cpu1[sidecar.pid]
    figures = {
        "seconds": round(wall, 1),
        "gzip": not args.no_gzip,
        "warmup_s": args.warmup,
        "target_scrapes": requests,
        "sidecar_cpu_s": round(s1.cpu_seconds - s0.cpu_seconds, 2),
        "sidecar_pct_of_one_core": round(side, 3),
        "idle_reference_pct": round(ref, 3),
        "rss_mib": round(s1.rss_kib / 1024, 1),
        "peak_rss_mib": round(s1.peak_rss_kib / 1024, 1),
        "real_work": ok_work,
    }
    keep(args, "bench_sidecar_cpu", figures)
    return 0 if ok_work else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="measured period (default 60)")
    parser.add_argument(
        "--warmup",
        type=float,
        default=5.0,
        help="seconds of scraping before the period starts (default 5)",
    )
    parser.add_argument(
        "--no-gzip", action="store_true", help="serve the page uncompressed even when accepted"
    )
    add_outputs(parser)
    return guarded("bench_sidecar_cpu", run, parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
