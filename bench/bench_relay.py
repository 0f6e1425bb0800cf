#!/usr/bin/env python3
"""The proxy's Python per streamed request, in process: warm, and on a cold cache.

Why: on a small host the proxy's CPU per stream is mostly the interpreter waiting on memory at
each wake-up (docs/BENCHMARKS.md §3-4), and bench_proxy.py's TTFT moves by
milliseconds between rounds. Here the real proxy (config, routing, `stream_options` injection,
SSE tap, accounting) relays a stream recorded from the simulator through fake transports, so a
change to its Python can be judged in seconds. "Cold" writes --thrash-kb of memory before the
request and before each upstream read (the caches flushed, as the other processes' Python do
between two of the proxy's wake-ups); the CPU time of that writing is taken off. Reference,
measured in the same run the same way: a relay that only forwards bytes (one Python call per
read). Reads carry one event (a stream at a time) or --merge events (under load).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _run import add_outputs, free_port, guarded, keep
from aiohttp import web

from exporter import config
from exporter.demo import MODEL
from exporter.process import loop_factory
from exporter.proxy import upstream
from exporter.sidecar import Sidecar
from exporter.sim.decoder import SimEngine
from exporter.sim.server import build_app

PROMPT = [{"role": "user", "content": "Hello, how are you today?"}]
CONF = """\
# the sidecar is never started: nothing listens on these ports, and the proxy's pool is handed a
# fake connection (were it to dial the upstream, nothing would answer: a 502, the run refused)
listen: 127.0.0.1:1
targets: [{{name: sim, url: "http://127.0.0.1:{port}/metrics"}}]
proxy:
  listen: 127.0.0.1:2
  upstream: http://127.0.0.1:{port}
  target: sim
  routes: [{{name: voice_chat, when: {{header: {{X-Route: voice}}}}}}]
"""


class Transport:
    """What a protocol writes to: counts the bytes (a client, or the upstream)."""

    def __init__(self) -> None:
        self.written = 0

    def write(self, data: bytes) -> None:
        self.written += len(data)

    def is_closing(self) -> bool:
        return False

    def get_extra_info(self, name: str, default: object = None) -> object:
        return default  # no socket: the pool's idle check has nothing to poll

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def is_reading(self) -> bool:
        return True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def close(self) -> None:
        pass

    def abort(self) -> None:
        pass


async def record(tokens: int) -> list[bytes]:
    """The simulator's response to one stream request as the proxy forwards it (usage asked for),
    one HTTP chunk per read, the head first."""
    runner = web.AppRunner(build_app(SimEngine(MODEL, speed=1000.0)), access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        options = {"include_usage": True, "continuous_usage_stats": False}
        body = json.dumps(
            {"model": MODEL, "messages": PROMPT, "max_tokens": tokens, "stream": True}
            | {"stream_options": options}
        ).encode()
        writer.write(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: sim\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%b" % (len(body), body)
        )
        data = b""
        while not data.endswith(b"\r\n0\r\n\r\n"):
            data += await reader.read(65536)
        writer.close()
    finally:
        await runner.cleanup()
    head, _, rest = data.partition(b"\r\n\r\n")
    reads, pos = [head + b"\r\n\r\n"], 0
    while pos < len(rest):
        line = rest.index(b"\r\n", pos)
        end = line + 2 + int(rest[pos:line], 16) + 2
        reads.append(rest[pos:end])
        pos = end
    return reads


def merged(reads: list[bytes], k: int) -> list[bytes]:
    """The head alone, then k chunks per read."""
    return [reads[0]] + [b"".join(reads[i : i + k]) for i in range(1, len(reads), k)]


def request(tokens: int) -> bytes:
    """The client's request: a stream that did not ask for usage (the proxy injects it)."""
    body = json.dumps(
        {"model": MODEL, "messages": PROMPT, "max_tokens": tokens, "stream": True}
    ).encode()
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:8001\r\nAccept: */*\r\n"
        b"Content-Type: application/json\r\nX-Route: voice\r\nContent-Length: %d\r\n\r\n%b"
        % (len(body), body)
    )


Stream = Callable[[Callable[[], None]], None]  # one stream; calls its argument before each read
# a path: its stream, the client's transport, and how many streams it accounted (None: it does not)
Setup = tuple[Stream, Transport, Callable[[], int] | None]


def proxied(reads: list[bytes], tokens: int) -> Setup:
    """One stream through the real proxy: a client connection and a pooled upstream one."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "specdec.yaml"
        path.write_text(CONF.format(port=free_port()))
        proxy = Sidecar(config.load(path)).proxy
    assert proxy is not None
    pool, loop = proxy.settings.pool, asyncio.get_running_loop()
    conn = upstream._Connection(pool)
    conn.connection_made(Transport())  # type: ignore[arg-type]
    client, out = proxy.accept("127.0.0.1"), Transport()
    client.connection_made(out)  # type: ignore[arg-type]
    raw = request(tokens)

    def stream(before: Callable[[], None]) -> None:
        conn.idle_since = loop.time()  # the pool's one connection, fresh for each stream
        pool._idle[:] = [conn]
        before()
        client.data_received(raw)
        for data in reads:
            before()
            conn.data_received(data)

    def accounted() -> int:  # streams that ended well: a 200 accounted to its route
        requests = proxy.accounting.read(loop.time()).requests.items()
        return sum(n for (_, _, status, _), n in requests if status == "200")

    return stream, out, accounted


def forwarded(reads: list[bytes], tokens: int) -> Setup:
    """The reference: bytes passed on, one Python call per read."""
    up, out = Transport(), Transport()

    class Forward(asyncio.Protocol):
        def __init__(self, to: Transport) -> None:
            self.to = to

        def data_received(self, data: bytes) -> None:
            self.to.write(data)

    client, server, raw = Forward(up), Forward(out), request(tokens)

    def stream(before: Callable[[], None]) -> None:
        before()
        client.data_received(raw)
        for data in reads:
            before()
            server.data_received(data)

    return stream, out, None


class Cache:
    """What runs before each read: nothing (warm), or a write over `kb` of memory (cold), its
    CPU time kept to be taken off."""

    def __init__(self, kb: int) -> None:
        self.scratch = bytearray(kb * 1024)
        self.zeros = bytes(len(self.scratch))
        self.spent = 0.0

    def warm(self) -> None:
        pass

    def cold(self) -> None:
        start = time.process_time()
        self.scratch[:] = self.zeros
        self.spent += time.process_time() - start


async def per_stream(
    stream: Stream, before: Callable[[], None], cache: Cache, n: int, repeats: int
) -> float:
    """Best of `repeats` of n streams: process CPU seconds per stream, the cache thrashing's
    taken off (the loop turns between streams, as the proxy's timers and callbacks would)."""
    best = float("inf")
    for _ in range(repeats):
        cache.spent = 0.0
        start = time.process_time()
        for _ in range(n):
            stream(before)
            await asyncio.sleep(0)
        best = min(best, (time.process_time() - start - cache.spent) / n)
    return best


async def main(args: argparse.Namespace) -> int:
    recorded = await record(args.tokens)
    cache = Cache(args.thrash_kb)

    results: dict[str, Any] = {"reads": {}, "us_per_stream": {}, "per_stream": []}
    print(
        f"stream: {len(recorded) - 1} chunks of {args.tokens} tokens; n={args.n} x {args.repeats}"
    )
    print(f"{'events/read':>11} {'path':<9} {'warm us':>8} {'cold us':>8}")
    for k in (1, args.merge):
        reads = merged(recorded, k)
        results["reads"][k] = len(reads)
        rows: dict[str, tuple[float, float]] = {}
        for name, make in (("reference", forwarded), ("proxy", proxied)):
            stream, out, accounted = make(reads, args.tokens)
            await per_stream(stream, cache.warm, cache, 50, 1)  # specialisation, the pool's state
            sent = out.written
            w = await per_stream(stream, cache.warm, cache, args.n, args.repeats)
            c = await per_stream(stream, cache.cold, cache, args.n, args.repeats)
            if out.written == sent:
                raise RuntimeError(f"{name}: nothing reached the client")
            runs = 50 + 2 * args.n * args.repeats
            if accounted is not None and accounted() != runs:  # each stream went the whole way
                raise RuntimeError(f"{name}: {accounted()} of {runs} streams accounted")
            rows[name] = (w, c)
            results["us_per_stream"][f"{name}/{k}"] = {"warm": w * 1e6, "cold": c * 1e6}
            print(f"{k:>11} {name:<9} {w * 1e6:8.1f} {c * 1e6:8.1f}")
        (rw, rc), (pw, pc) = rows["reference"], rows["proxy"]
        results["per_stream"].append({
            "events_per_read": k,
            "reference_warm_us": round(rw * 1e6, 1), "reference_cold_us": round(rc * 1e6, 1),
            "proxy_warm_us": round(pw * 1e6, 1), "proxy_cold_us": round(pc * 1e6, 1),
            "warm_ratio": round(pw / rw, 2), "cold_ratio": round(pc / rc, 2),
        })  # fmt: skip
        print(
            f"{k:>11} proxy / reference: warm {pw / rw:5.1f}x, cold {pc / rc:5.1f}x;"
            f" proxy cold / warm {pc / pw:4.1f}x"
        )
    keep(args, "bench_relay", results)
    return 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=500, help="streams per measurement (500)")
    parser.add_argument("--repeats", type=int, default=5, help="best of this many (5)")
    parser.add_argument("--tokens", type=int, default=64, help="max_tokens of the stream (64)")
    parser.add_argument("--merge", type=int, default=3, help="events per read under load (3)")
    parser.add_argument(
        "--thrash-kb",
        type=int,
        default=8192,
        help="memory written before each read when cold (8192: the cold figure at 3 events per"
        " read then matches the live proxy's user CPU per c=64 stream on a 2-core VM)",
    )
    add_outputs(parser)
    return parser.parse_args(argv)


if __name__ == "__main__":
    options = parse_args()

    def run(args: argparse.Namespace) -> int:
        with asyncio.Runner(loop_factory=loop_factory()) as runner:  # the sidecar's loop
            return runner.run(main(args))

    sys.exit(guarded("bench_relay", run, options))
