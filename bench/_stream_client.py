"""A lean HTTP/1.1 load client for streamed completions: one keep-alive connection per worker,
asyncio's protocol API, no HTTP library.

Why not aiohttp: on a 2-core machine the load generator shares the CPUs with the simulator and the
proxy under test. aiohttp's client spent ~2.4 ms of CPU per 64-token stream at c=64, more than
the proxy it was measuring, so its CPU competed with the proxy's and the throughput ratio measured
the harness as much as the proxy. This client de-chunks the body, stamps the first content token
and checks the stream ended with `data: [DONE]`; nothing else.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

FIRST_CONTENT = re.compile(rb'"(?:content|text)":"[^"]')  # the role chunk has "content":""
DONE = b"data: [DONE]\n\n"
TIMEOUT = 60.0


@dataclass(slots=True)
class Sample:
    ok: bool
    ttft: float | None  # seconds, request sent -> first content token received
    total: float


class _Exchange(asyncio.Protocol):
    """One connection; reads one response at a time into a Sample (via `done`)."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.done: asyncio.Future[bool] | None = None
        self.closed = False
        self.reusable = True

    def start(self, request: bytes) -> asyncio.Future[bool]:
        assert self.transport is not None
        self.done = asyncio.get_running_loop().create_future()
        self.status = 0
        self.chunked = False
        self.remaining = -1  # bytes of a Content-Length body still due; -1 while in the head
        self.tail = b""
        self.ttft: float | None = None
        self.started = time.perf_counter()
        self.transport.write(request)
        return self.done

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's is not a subclass

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._finish(False)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while self.done is not None and not self.done.done() and self._step():
            pass

    def _step(self) -> bool:
        """Consume one unit (the head, a chunk, a body); False when more bytes are needed."""
        buf = self.buf
        if self.remaining == -1 and not self.chunked:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                return False
            head = bytes(buf[:end]).lower()
            del buf[: end + 4]
            self.status = int(head[9:12])
            self.chunked = b"\r\ntransfer-encoding: chunked" in head
            self.reusable = b"\r\nconnection: close" not in head  # nginx: keepalive_requests
            length = re.search(rb"\r\ncontent-length: *(\d+)", head)
            self.remaining = int(length.group(1)) if length else 0
            return True
        if not self.chunked:
            if len(buf) < self.remaining:
                return False
            self._body(bytes(buf[: self.remaining]))
            del buf[: self.remaining]
            self._finish(True)
            return True
        line = buf.find(b"\r\n")
        if line < 0:
            return False
        size = int(buf[:line].split(b";", 1)[0], 16)
        end = line + 2 + size + 2
        if len(buf) < end:
            return False
        if size:
            self._body(bytes(buf[line + 2 : end - 2]))
        del buf[:end]
        if not size:
            self._finish(True)  # no trailers: none of the measured paths sends any
        return True

    def _body(self, payload: bytes) -> None:
        seen = self.tail + payload
        if self.ttft is None and FIRST_CONTENT.search(seen):
            self.ttft = time.perf_counter() - self.started
        self.tail = seen[-32:]

    def _finish(self, complete: bool) -> None:
        if self.done is not None and not self.done.done():
            self.done.set_result(complete and self.status == 200 and self.tail.endswith(DONE))

    def sample(self, ok: bool) -> Sample:
        return Sample(ok and self.ttft is not None, self.ttft, time.perf_counter() - self.started)


def build_request(url: str, body: bytes, headers: dict[str, str]) -> bytes:
    parts = urlsplit(url)
    lines = [f"POST {parts.path} HTTP/1.1", f"Host: {parts.netloc}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


class Worker:
    """Sends streams one after another on one kept-alive connection (reconnects when it closes)."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 80
        self.conn: _Exchange | None = None

    async def stream(self, request: bytes) -> Sample:
        try:
            if self.conn is None or self.conn.closed:
                _, self.conn = await asyncio.get_running_loop().create_connection(
                    _Exchange, self.host, self.port
                )
            conn = self.conn
            ok = await asyncio.wait_for(conn.start(request), TIMEOUT)
        except (OSError, TimeoutError):
            self.close()
            return Sample(False, None, 0.0)
        if not ok or not conn.reusable:
            self.close()  # a request sent on a connection the server is closing would fail
        return conn.sample(ok)

    def close(self) -> None:
        if self.conn is not None and self.conn.transport is not None:
            self.conn.transport.close()
        self.conn = None


class Pool:
    """`concurrency` workers per URL, kept across segments (connections stay warm like a pool)."""

    def __init__(self) -> None:
        self.workers: dict[str, list[Worker]] = {}

    async def run(
        self,
        url: str,
        body: bytes,
        n: int,
        concurrency: int,
        headers: Callable[[int], dict[str, str]],
    ) -> tuple[list[Sample], float]:
        """n streams, `concurrency` at a time; headers(i) gives request i's headers."""
        idle = self.workers.setdefault(url, [])
        while len(idle) < concurrency:
            idle.append(Worker(url))
        samples: list[Sample] = []
        counter = iter(range(n))

        async def drive(worker: Worker) -> None:
            for i in counter:
                samples.append(await worker.stream(build_request(url, body, headers(i))))

        started = time.perf_counter()
        await asyncio.gather(*(drive(w) for w in idle[:concurrency]))
        return samples, time.perf_counter() - started

    def close(self) -> None:
        for workers in self.workers.values():
            for w in workers:
                w.close()
