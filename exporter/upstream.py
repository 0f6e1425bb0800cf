"""Keep-alive HTTP/1.1 connections to the proxy's one upstream, at the protocol level.

Why not aiohttp's client: relaying an SSE stream through its StreamReader costs a task
wake-up, a coroutine and a timer reschedule per event, and the proxy relays tens of events per
request. Here each upstream read is de-framed in `data_received` and handed straight to a sink
(the client's transport): one loop iteration per read, no task switch. The upstream is one
known HTTP/1.1 server (vLLM's uvicorn), so the client needed is small: one request per
connection at a time, Content-Length / chunked / until-close bodies, an idle timeout.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import cast
from urllib.parse import urlsplit

MAX_HEAD = 64 * 1024  # bytes of status line and headers
KEEPALIVE = 4.0  # s: reuse an idle connection only this long; uvicorn closes them after 5 s
MAX_IDLE = 256  # idle connections kept


class Broken(Exception):
    """The upstream connection failed before the response ended."""


@dataclass(frozen=True, slots=True)
class Head:
    status: int
    reason: str
    headers: list[tuple[str, str]]

    def get(self, name: str) -> str | None:
        name = name.lower()
        return next((v for k, v in self.headers if k.lower() == name), None)


class Upstream:
    """A pool of connections to one `http(s)://host:port`."""

    def __init__(self, url: str, connect_timeout: float, read_timeout: float) -> None:
        parts = urlsplit(url)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.authority = parts.netloc
        self.ssl = ssl.create_default_context() if parts.scheme == "https" else None
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self._idle: list[_Connection] = []
        self._busy: set[_Connection] = set()

    async def request(
        self, method: str, target: str, headers: Iterable[tuple[str, str]], body: bytes
    ) -> Exchange:
        """Send the request and wait for the response head.

        Raises OSError (connection refused or dropped before a response: 502), TimeoutError
        (connect or head timed out: 504). A reused connection that the upstream closed while
        idle is retried once on a fresh one (nothing was processed on it)."""
        data = self._serialize(method, target, headers, body)
        while True:
            conn, reused = await self._acquire()
            exchange = Exchange(conn, method, self.read_timeout)
            conn.start(exchange, data)
            try:
                await exchange.head_received()
            except Broken as exc:
                exchange.close()
                if reused and not exchange.received:
                    continue
                raise ConnectionResetError("upstream closed the connection") from exc
            except BaseException:
                exchange.close()
                raise
            return exchange

    def close(self) -> None:
        for conn in (*self._idle, *self._busy):
            conn.close()
        self._idle.clear()
        self._busy.clear()

    def _serialize(
        self, method: str, target: str, headers: Iterable[tuple[str, str]], body: bytes
    ) -> bytes:
        lines = [f"{method} {target} HTTP/1.1", f"Host: {self.authority}"]
        lines += (f"{k}: {v}" for k, v in headers)
        if body or method in ("POST", "PUT", "PATCH"):
            lines.append(f"Content-Length: {len(body)}")
        return "\r\n".join(lines).encode("utf-8", "surrogateescape") + b"\r\n\r\n" + body

    async def _acquire(self) -> tuple[_Connection, bool]:
        loop = asyncio.get_running_loop()
        while self._idle:
            conn = self._idle.pop()
            if conn.usable(loop.time()):
                self._busy.add(conn)
                return conn, True
            conn.close()
        async with asyncio.timeout(self.connect_timeout):
            _, conn = await loop.create_connection(
                lambda: _Connection(self), self.host, self.port, ssl=self.ssl
            )
        self._busy.add(conn)
        return conn, False

    def _release(self, conn: _Connection, reusable: bool) -> None:
        self._busy.discard(conn)
        if reusable and len(self._idle) < MAX_IDLE:
            conn.idle_since = asyncio.get_running_loop().time()
            self._idle.append(conn)
        else:
            conn.close()

    def _lost(self, conn: _Connection) -> None:
        self._busy.discard(conn)
        if conn in self._idle:
            self._idle.remove(conn)


class _Connection(asyncio.Protocol):
    def __init__(self, pool: Upstream) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.exchange: Exchange | None = None
        self.idle_since = 0.0

    def usable(self, now: float) -> bool:
        return (
            self.transport is not None
            and not self.transport.is_closing()
            and now - self.idle_since < KEEPALIVE
        )

    def start(self, exchange: Exchange, data: bytes) -> None:
        assert self.transport is not None
        self.exchange = exchange
        self.transport.write(data)

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def data_received(self, data: bytes) -> None:
        if self.exchange is None:
            self.close()  # bytes nobody asked for: the connection is out of step
        else:
            self.exchange.feed(data)

    def eof_received(self) -> bool:
        return False  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.pool._lost(self)
        if self.exchange is not None:
            self.exchange.lost()

    def finished(self, reusable: bool) -> None:
        self.exchange = None
        self.pool._release(self, reusable and self.transport is not None)


Sink = Callable[[bytes], bool]  # body bytes -> False to pause reading (back-pressure)

_HEAD, _LENGTH, _CHUNK_SIZE, _CHUNK_DATA, _CHUNK_END, _TRAILER, _UNTIL_CLOSE, _DONE = range(8)


class Exchange:
    """One request's response: its head, then its body handed to a sink as it arrives."""

    def __init__(self, conn: _Connection, method: str, read_timeout: float) -> None:
        loop = asyncio.get_running_loop()
        self._conn = conn
        self._method = method
        self._loop = loop
        self._timeout = read_timeout
        self._last = loop.time()
        self._timer = loop.call_at(self._last + read_timeout, self._check_idle)
        self._head: asyncio.Future[Head] = loop.create_future()
        self._waiter: asyncio.Future[bool] | None = None
        self._state = _HEAD
        self._buffer = b""
        self._left = 0  # body bytes left: Content-Length or the current chunk
        self._keep_alive = False
        self._held: list[bytes] = []  # body before a sink was given
        self._sink: Sink | None = None
        self._paused = False
        self._error: BaseException | None = None
        self.received = 0  # bytes from upstream

    @property
    def complete(self) -> bool:
        return self._state == _DONE

    @property
    def head(self) -> Head:
        return self._head.result()

    async def head_received(self) -> Head:
        return await self._head

    async def read(self) -> bytes:
        """The whole body."""
        parts: list[bytes] = []

        def keep(data: bytes) -> bool:
            parts.append(data)
            return True

        self.start(keep)
        while not await self.relayed():
            self.resume()
        return b"".join(parts)

    def start(self, sink: Sink) -> None:
        """Hand body bytes to `sink` from now on (what arrived with the head first)."""
        self._sink = sink
        held, self._held = self._held, []
        for data in held:
            self._deliver(data)

    async def relayed(self) -> bool:
        """Wait until the body has all gone to the sink (True) or the sink asked for a pause
        (False: drain the client, then resume()). Raises Broken or TimeoutError."""
        if self._error is not None:
            raise self._error
        if self._state == _DONE:
            return True
        if self._paused:
            return False
        self._waiter = self._loop.create_future()
        try:
            return await self._waiter
        finally:
            self._waiter = None

    def resume(self) -> None:
        if self._paused and self._conn.transport is not None:
            self._paused = False
            self._last = self._loop.time()
            self._conn.transport.resume_reading()

    def abort(self, error: BaseException) -> None:
        """Stop relaying (the client is gone): close the connection, so vLLM aborts."""
        self._fail(error)

    def close(self) -> None:
        """Done with it: back to the pool if the response ended cleanly, else dropped."""
        self._timer.cancel()
        if self._state != _DONE:
            self._state = _DONE
            self._error = self._error or Broken("closed before the response ended")
            self._conn.exchange = None
            self._conn.close()

    # ------------------------------------------------------------ the connection's side

    def feed(self, data: bytes) -> None:
        self.received += len(data)
        self._last = self._loop.time()
        try:
            body = self._parse(data)
        except ValueError as exc:
            self._fail(Broken(f"malformed response: {exc}"))
            return
        if body:
            self._deliver(body)
        if self._state == _DONE and self._error is None:
            self._end()

    def lost(self) -> None:
        if self._state == _UNTIL_CLOSE:
            self._keep_alive = False
            self._state = _DONE
            self._end()
        elif self._state != _DONE:
            self._fail(Broken("upstream closed the connection"))

    # ------------------------------------------------------------ internals

    def _deliver(self, data: bytes) -> None:
        if self._sink is None:
            self._held.append(data)
        elif not self._sink(data) and not self._paused and self._conn.transport is not None:
            self._paused = True
            self._conn.transport.pause_reading()
            self._wake(False)

    def _end(self) -> None:
        self._timer.cancel()
        if self._paused:  # the connection goes back to the pool reading
            self._paused = False
            if self._conn.transport is not None:
                self._conn.transport.resume_reading()
        self._conn.finished(self._keep_alive and not self._buffer)
        self._wake(True)

    def _fail(self, error: BaseException) -> None:
        if self._error is None:
            self._error = error
        self._timer.cancel()
        if not self._head.done():
            self._head.set_exception(self._error)
        self._state = _DONE
        self._conn.exchange = None
        self._conn.close()
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(self._error)

    def _wake(self, result: bool) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(result)

    def _check_idle(self) -> None:
        """One timer per exchange, re-armed lazily: reads only stamp the time."""
        if self._paused:  # the client is slow, not the upstream
            self._last = self._loop.time()
        deadline = self._last + self._timeout
        if self._loop.time() >= deadline:
            late = Broken("upstream read timed out") if self._head.done() else TimeoutError()
            self._fail(late)
        else:
            self._timer = self._loop.call_at(deadline, self._check_idle)

    def _parse(self, data: bytes) -> bytes:
        """Consume `data`; return the body bytes it completes (de-chunked)."""
        buffer = self._buffer + data if self._buffer else data
        out: list[bytes] = []
        pos = 0
        while pos < len(buffer):
            state = self._state
            if state in (_CHUNK_DATA, _LENGTH):
                end = min(len(buffer), pos + self._left)
                out.append(buffer[pos:end])
                self._left -= end - pos
                pos = end
                if self._left == 0:
                    self._state = _CHUNK_END if state == _CHUNK_DATA else _DONE
            elif state == _UNTIL_CLOSE:
                out.append(buffer[pos:])
                pos = len(buffer)
            elif state == _DONE:
                break  # bytes after the response: left in the buffer, the connection is dropped
            else:
                end = buffer.find(b"\r\n\r\n" if state == _HEAD else b"\r\n", pos)
                if end == -1:
                    if len(buffer) - pos > MAX_HEAD:
                        raise ValueError("header or chunk line too long")
                    break
                if state == _HEAD:
                    self._on_head(buffer[pos:end])
                    pos = end + 4
                elif state == _CHUNK_SIZE:
                    self._left = int(buffer[pos:end].split(b";", 1)[0], 16)
                    self._state = _CHUNK_DATA if self._left else _TRAILER
                    pos = end + 2
                elif state == _CHUNK_END:
                    if end != pos:
                        raise ValueError("chunk longer than its size")
                    self._state = _CHUNK_SIZE
                    pos = end + 2
                else:  # _TRAILER: lines until an empty one
                    self._state = _DONE if end == pos else _TRAILER
                    pos = end + 2
        self._buffer = buffer[pos:]
        return b"".join(out) if len(out) != 1 else out[0]

    def _on_head(self, raw: bytes) -> None:
        lines = raw.decode("latin-1").split("\r\n")
        version, _, rest = lines[0].partition(" ")
        code, _, reason = rest.partition(" ")
        if not version.startswith("HTTP/1.") or not code.isdigit():
            raise ValueError(f"bad status line {lines[0][:80]!r}")
        status = int(code)
        headers = []
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep or not name or name != name.strip():
                raise ValueError(f"bad header line {line[:80]!r}")
            headers.append((name, value.strip()))
        head = Head(status, reason, headers)
        if status < 200:
            return  # interim (103 Early Hints): the real head follows
        connection = (head.get("connection") or "").lower()
        self._keep_alive = version == "HTTP/1.1" and "close" not in connection
        length = head.get("content-length")
        if self._method == "HEAD" or status in (204, 304):
            self._state = _DONE
        elif "chunked" in (head.get("transfer-encoding") or "").lower():
            self._state = _CHUNK_SIZE
        elif length is not None:
            if not length.isdigit():
                raise ValueError(f"bad Content-Length {length[:20]!r}")
            self._left = int(length)
            self._state = _LENGTH if self._left else _DONE
        else:
            self._state = _UNTIL_CLOSE
        self._head.set_result(head)
