"""The proxy's memory and framing cost under hostile peers, through a real `specdec serve`.

1. Memory: `specdec serve` (the shipped defaults: max_body_bytes 16 MiB, max_buffered_bytes
   64 MiB) in front of a local upstream. Baseline RSS after a warm-up; then 50 uploads of
   max_body_bytes that send all but one byte and stall, plus 50 live streams read normally;
   the peak RSS against the budget formula of docs/operations.md
       RSS <= baseline + 1.2 x max_buffered_bytes + 3 x max_body_bytes + connections x c
   (c, the cost of one open connection, measured here too: 1,000 idle connections); then all
   of them closed, and RSS again, against the baseline (goal: within 10 %).
2. Framing: a 40 MiB SSE stream framed with LF, then the same with CRLF, through the proxy,
   alternated (LF, CRLF, LF, CRLF, ...): CPU seconds of the serve process per stream, and the
   ratio CRLF / LF (goal: <= 2).

    python bench/bench_memory.py [--rounds 3] [--json FILE] [--record] [--check]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import socket
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from _run import (
    SIDECAR_CONF,
    add_outputs,
    free_port,
    guarded,
    keep,
    proc_stats,
    spawn,
    stop,
    wait_http,
)

MIB = 1 << 20
MAX_BODY = 16 * MIB
BUDGET = 64 * MIB
UPLOADS = STREAMS = 50
IDLE = 1000
STREAM_MIB = 40
EVENT = b'data: {"choices":[{"index":0,"delta":{"content":"' + b"x" * 960 + b'"}}]}'


class Upstream:
    """An HTTP/1.1 upstream: /metrics empty, /slow a stream of an event per 50 ms for 30 s,
    /bulk?lf or ?crlf 40 MiB of events as fast as the proxy takes them, anything else {}."""

    async def start(self) -> int:
        self.server = await asyncio.start_server(self.handle, "127.0.0.1", 0)
        return int(self.server.sockets[0].getsockname()[1])

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        ended = (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError)
        with contextlib.suppress(*ended):
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                await reader.readexactly(length)
                target = head.split(b" ", 2)[1]
                if target.startswith((b"/slow", b"/bulk")):
                    await self.stream(writer, target)
                else:
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
                await writer.drain()
        writer.close()

    async def stream(self, writer: asyncio.StreamWriter, target: bytes) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n")  # fmt: skip
        ending = b"\r\n\r\n" if target.endswith(b"crlf") else b"\n\n"
        event = EVENT + ending
        if target.startswith(b"/slow"):
            for _ in range(600):
                writer.write(b"%x\r\n%b\r\n" % (len(event), event))
                await writer.drain()
                await asyncio.sleep(0.05)
        else:
            chunk = b"%x\r\n%b\r\n" % (len(event), event)
            for _ in range(STREAM_MIB * MIB // len(event)):
                writer.write(chunk)
                if writer.transport.get_write_buffer_size() > 256 * 1024:
                    await writer.drain()
        writer.write(b"0\r\n\r\n")


def rss_mib(pid: int) -> float:
    return proc_stats(pid)[0] * 1e6 / MIB


async def sample_peak(pid: int, seconds: float) -> float:
    peak, end = 0.0, time.monotonic() + seconds
    while time.monotonic() < end:
        peak = max(peak, rss_mib(pid))
        await asyncio.sleep(0.02)
    return peak


async def request(port: int, data: bytes) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    return reader, writer


async def upload(port: int) -> asyncio.StreamWriter:
    """A max-size upload that stalls one byte short (or is shed at its head: then closed)."""
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n"
    _, writer = await request(port, head % MAX_BODY)
    piece = b"x" * MIB
    with contextlib.suppress(ConnectionError):
        for sent in range(0, MAX_BODY - 1, MIB):
            writer.write(piece[: min(MIB, MAX_BODY - 1 - sent)])
            await writer.drain()
    return writer


async def live_stream(port: int, stop_reading: asyncio.Event) -> None:
    reader, writer = await request(port, b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
    with contextlib.suppress(ConnectionError):
        while not stop_reading.is_set() and await reader.read(65536):
            pass
    writer.close()


def metric(url: str, name: str) -> float:
    with urllib.request.urlopen(url, timeout=5) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.rsplit(" ", 1)[1])
    raise RuntimeError(f"{name} not on {url}")


async def settle(metrics: str, pid: int) -> float:
    """Once nothing is held or open: RSS, the lowest of 2 s of samples."""
    deadline = time.monotonic() + 30
    while (
        metric(metrics, "specdec_proxy_buffered_bytes")
        or metric(metrics, "specdec_proxy_client_connections")
    ) and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    low, end = float("inf"), time.monotonic() + 2
    while time.monotonic() < end:
        low = min(low, rss_mib(pid))
        await asyncio.sleep(0.05)
    return low


async def memory(port: int, metrics: str, pid: int) -> dict[str, float]:
    for _ in range(20):  # warm-up: pools, caches, first allocations
        reader, writer = await request(port, b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
        await reader.readuntil(b"{}")
        writer.close()
    baseline = await settle(metrics, pid)
    idle = [await request(port, b"") for _ in range(IDLE)]
    await asyncio.sleep(1)
    per_connection = (rss_mib(pid) - baseline) / IDLE * 1024  # KiB
    for _, w in idle:
        w.close()
    await settle(metrics, pid)
    stop_reading = asyncio.Event()
    streams = [asyncio.create_task(live_stream(port, stop_reading)) for _ in range(STREAMS)]
    uploads = [asyncio.create_task(upload(port)) for _ in range(UPLOADS)]
    peak = await sample_peak(pid, 8)
    held = metric(metrics, "specdec_proxy_buffered_bytes") / MIB
    shed = metric(metrics, 'specdec_proxy_shed_requests_total{limit="buffered_bytes"}')
    stop_reading.set()
    for task in uploads:
        if task.done():
            task.result().close()
        else:
            task.cancel()
    await asyncio.gather(*streams, return_exceptions=True)
    after = await settle(metrics, pid)
    whole_peak, whole_after = await whole_uploads(port, metrics, pid)
    per_stalled = await stalled_readers(port, metrics, pid, after)
    bound = baseline + (1.2 * BUDGET + 3 * MAX_BODY) / MIB
    bound += (UPLOADS + STREAMS) * per_connection / 1024
    return {
        "baseline_mib": baseline,
        "per_connection_kib": per_connection,
        "peak_mib": peak,
        "held_mib": held,
        "shed_uploads": shed,
        "bound_mib": bound,
        "after_mib": after,
        "after_over_baseline": after / baseline,
        "per_stalled_stream_kib": per_stalled,
        "whole_peak_mib": whole_peak,
        "whole_after_mib": whole_after,
        "whole_after_over_baseline": whole_after / baseline,
    }


async def stalled_readers(port: int, metrics: str, pid: int, baseline: float) -> float:
    """50 streams whose clients read nothing (a 4 KiB receive buffer): what each pins, in KiB,
    until write_timeout cuts it."""
    clients = []
    for _ in range(STREAMS):
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
        _, writer = await asyncio.open_connection(sock=sock)
        writer.write(b"GET /bulk?lf HTTP/1.1\r\nHost: x\r\n\r\n")
        clients.append(writer)
    peak = await sample_peak(pid, 3)
    for writer in clients:
        writer.close()
    await settle(metrics, pid)
    return (peak - baseline) / STREAMS * 1024


async def whole_uploads(port: int, metrics: str, pid: int) -> tuple[float, float]:
    """6 concurrent 15 MiB stream requests sent whole (routed, spliced, forwarded): peak RSS,
    and RSS once they are over."""
    prompt = "x" * (15 * MIB)
    body = json.dumps({"model": "m", "stream": True, "messages": [{"content": prompt}]}).encode()
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n"

    async def one() -> None:
        reader, writer = await request(port, head % len(body) + body)
        with contextlib.suppress(ConnectionError):
            await reader.readuntil(b"\r\n\r\n")
        writer.close()

    peak = asyncio.create_task(sample_peak(pid, 6))
    await asyncio.gather(*(one() for _ in range(6)))
    return await peak, await settle(metrics, pid)


async def framing(port: int, pid: int, rounds: int) -> dict[str, float]:
    cpu: dict[str, list[float]] = {"lf": [], "crlf": []}
    for _ in range(rounds):
        for kind in ("lf", "crlf"):
            before = proc_stats(pid)[2]
            reader, writer = await request(
                port, b"GET /bulk?%b HTTP/1.1\r\nHost: x\r\n\r\n" % kind.encode()
            )
            while not (await reader.read(1 << 20)).endswith(b"0\r\n\r\n"):
                pass
            writer.close()
            cpu[kind].append(proc_stats(pid)[2] - before)
    lf, crlf = statistics.median(cpu["lf"]), statistics.median(cpu["crlf"])
    return {"lf_cpu_s": lf, "crlf_cpu_s": crlf, "crlf_over_lf": crlf / lf}


async def bench(args: argparse.Namespace, tmp: Path) -> dict[str, float]:
    upstream = Upstream()
    upstream_port = await upstream.start()
    metrics_port, port = free_port(), free_port()
    conf = tmp / "specdec.yaml"
    conf.write_text(
        SIDECAR_CONF.format(metrics=metrics_port, upstream=upstream_port, port=port, model="m")
    )
    serve = spawn([sys.executable, "-m", "exporter", "serve", "--config", str(conf)],
                  tmp / "serve.log")  # fmt: skip
    metrics = f"http://127.0.0.1:{metrics_port}/metrics"
    try:
        await asyncio.to_thread(wait_http, serve, f"http://127.0.0.1:{metrics_port}/-/ready")
        figures = await memory(port, metrics, serve.pid)
        figures |= await framing(port, serve.pid, args.rounds)
    finally:
        stop(serve)
        upstream.server.close()
    return figures


def run(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="specdec-bench-memory-") as tmp:
        figures = asyncio.run(bench(args, Path(tmp)))
    print(f"baseline RSS {figures['baseline_mib']:.1f} MiB; an open connection "
          f"{figures['per_connection_kib']:.1f} KiB")  # fmt: skip
    print(f"{UPLOADS} stalled {MAX_BODY // MIB} MiB uploads + {STREAMS} live streams: peak "
          f"{figures['peak_mib']:.1f} MiB (held {figures['held_mib']:.1f} MiB, "
          f"{figures['shed_uploads']:.0f} uploads shed 503) vs the formula's "
          f"{figures['bound_mib']:.1f} MiB")  # fmt: skip
    print(f"a stream whose client reads nothing pins {figures['per_stalled_stream_kib']:.0f} KiB"
          " until write_timeout")  # fmt: skip
    print(f"after they closed: {figures['after_mib']:.1f} MiB = "
          f"{figures['after_over_baseline']:.3f} x baseline")  # fmt: skip
    print(f"6 concurrent 15 MiB stream requests: peak {figures['whole_peak_mib']:.1f} MiB, "
          f"after {figures['whole_after_mib']:.1f} MiB = "
          f"{figures['whole_after_over_baseline']:.3f} x baseline")  # fmt: skip
    print(f"{STREAM_MIB} MiB stream, CPU of serve: LF {figures['lf_cpu_s']:.2f} s, CRLF "
          f"{figures['crlf_cpu_s']:.2f} s: CRLF / LF = {figures['crlf_over_lf']:.2f}")  # fmt: skip
    keep(args, "bench_memory", figures)
    missed = []
    if figures["peak_mib"] > figures["bound_mib"]:
        missed.append("peak RSS above the budget formula")
    if max(figures["after_over_baseline"], figures["whole_after_over_baseline"]) > 1.10:
        missed.append("RSS not back within 10 % of the baseline")
    if figures["crlf_over_lf"] > 2.0:
        missed.append("CRLF framing costs more than 2x LF")
    for what in missed:
        print(f"missed: {what}", file=sys.stderr)
    return 1 if missed and args.check else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="LF/CRLF alternations (3)")
    add_outputs(parser)
    parser.add_argument("--check", action="store_true", help="exit 1 when a goal is missed")
    return guarded("bench_memory", run, parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
