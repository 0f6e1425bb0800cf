"""Keep-alive HTTP/1.1 connections to the proxy's one upstream, at the protocol level.

Why not aiohttp's client: relaying an SSE stream through its StreamReader costs a task
wake-up, a coroutine and a timer reschedule per event, and the proxy relays tens of events per
request. Here a request is written from the caller's own callback when a pooled connection is
free, and each upstream read is de-framed in `data_received` and handed straight to a
`Receiver` (the proxy's call, which writes to the client): no task switch on the way in or out.
The upstream is one known HTTP/1.1 server (vLLM's uvicorn), so the client needed is small:
one request per connection at a time, Content-Length / chunked / until-close bodies, an idle
timeout.
"""

from __future__ import annotations

import asyncio
import functools
import ssl
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol, cast
from urllib.parse import urlsplit

MAX_HEAD = 64 * 1024  # bytes of status line and headers
KEEPALIVE = 4.0  # s: reuse an idle connection only this long; uvicorn closes them after 5 s
MAX_IDLE = 256  # idle connections kept
_HEX = b"0123456789abcdefABCDEF"


class Broken(Exception):
    """The upstream connection failed after the response head."""


@dataclass(frozen=True, slots=True)
class Head:
    status: int
    reason: str
    headers: list[tuple[str, str]]  # as sent
    fields: dict[str, str]  # lower-case name -> its first value

    def get(self, name: str) -> str | None:
        return self.fields.get(name.lower())


class Receiver(Protocol):
    """What an exchange reports to, from the connection's callbacks. After `end` or `fail`
    nothing more comes; after the receiver's own `Exchange.abort`, nothing at all."""

    def head(self, head: Head) -> None: ...

    def data(self, data: bytes) -> bool:
        """Body bytes (de-chunked); False pauses reading until `Exchange.resume`."""
        ...

    def end(self) -> None: ...

    def fail(self, error: BaseException) -> None:
        """Before the head: OSError (refused, or dropped without a response: a 502) or
        TimeoutError (connect or head timed out: a 504). After it: Broken."""
        ...


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

    def send(
        self,
        method: str,
        target: str,
        headers: Iterable[tuple[str, str]],
        body: bytes,
        receiver: Receiver,
    ) -> Exchange:
        """Send a request; its response goes to `receiver`. On a pooled connection the request
        is written before this returns. A reused connection that the upstream closed while
        idle is retried once on a fresh one (nothing was processed on it)."""
        data = self._serialize(method, target, headers, body)
        loop = asyncio.get_running_loop()
        while self._idle:
            conn = self._idle.pop()
            if conn.usable(loop.time()):
                assert conn.transport is not None
                conn.transport.write(data)  # on its way before any bookkeeping
                self._busy.add(conn)
                exchange = Exchange(self, method, data, receiver)
                exchange.attached(conn, reused=True)
                return exchange
            conn.close()
        exchange = Exchange(self, method, data, receiver)
        exchange.connect()
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

    async def _connect(self) -> _Connection:
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(self.connect_timeout):
            _, conn = await loop.create_connection(
                lambda: _Connection(self), self.host, self.port, ssl=self.ssl
            )
        self._busy.add(conn)
        return conn

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


_HEAD, _LENGTH, _CHUNK_SIZE, _CHUNK_DATA, _CHUNK_END, _TRAILER, _UNTIL_CLOSE, _DONE = range(8)


class Exchange:
    """One request and its response: the head, then the body, handed to the receiver as they
    arrive. The read timeout is the longest silence allowed from upstream."""

    def __init__(self, pool: Upstream, method: str, request: bytes, receiver: Receiver) -> None:
        self._pool = pool
        self._method = method
        self._request = request
        self._receiver = receiver
        self._loop = asyncio.get_running_loop()
        self._conn: _Connection | None = None
        self._connecting: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._reused = False
        self._last = 0.0
        self._state = _HEAD
        self._buffer = b""
        self._left = 0  # body bytes left: Content-Length or the current chunk
        self._keep_alive = False
        self._new_head: Head | None = None  # parsed, not yet told
        self._headed = False
        self._paused = False
        self.received = 0  # bytes from upstream

    def attach(self, conn: _Connection, reused: bool) -> None:
        """Write the request on `conn`."""
        assert conn.transport is not None
        conn.transport.write(self._request)
        self.attached(conn, reused)

    def attached(self, conn: _Connection, reused: bool) -> None:
        """The request was written on `conn`: its response is this exchange's."""
        conn.exchange = self
        self._conn = conn
        self._reused = reused
        self._last = self._loop.time()
        self._timer = self._loop.call_at(self._last + self._pool.read_timeout, self._check_idle)

    def connect(self) -> None:
        """Open a fresh connection for this request, in a task (the slow, rare path)."""
        self._connecting = self._loop.create_task(self._connect())

    def resume(self) -> None:
        if self._paused and self._conn is not None and self._conn.transport is not None:
            self._paused = False
            self._last = self._loop.time()
            self._conn.transport.resume_reading()

    def abort(self) -> None:
        """The receiver is done with it (its client is gone): drop the connection unless the
        response already ended, so vLLM aborts the request. Nothing more is reported."""
        if self._state == _DONE:
            return
        self._state = _DONE
        self._stop()

    # ------------------------------------------------------------ the connection's side

    def feed(self, data: bytes) -> None:
        self.received += len(data)
        self._last = self._loop.time()
        try:
            body = self._parse(data)
        except ValueError as exc:
            self._fail(Broken(f"malformed response: {exc}"))
            return
        if (head := self._new_head) is not None:
            self._new_head = None
            self._headed = True
            self._receiver.head(head)
            if self._conn is None:
                return  # aborted by the receiver
        if body and not self._receiver.data(body):
            self._pause()  # the client is full: stop reading upstream
        if self._state == _DONE and self._conn is not None:
            self._end()

    def lost(self) -> None:
        if self._state == _UNTIL_CLOSE:
            self._keep_alive = False
            self._state = _DONE
            self._end()
        elif self._state != _DONE:
            self._fail(Broken("upstream closed the connection"))

    # ------------------------------------------------------------ internals

    async def _connect(self) -> None:
        try:
            conn = await self._pool._connect()
        except (OSError, TimeoutError) as exc:
            self._connecting = None
            self._fail(exc)
            return
        self._connecting = None
        self.attach(conn, reused=False)

    def _pause(self) -> None:
        if not self._paused and self._conn is not None and self._conn.transport is not None:
            self._paused = True
            self._conn.transport.pause_reading()

    def _end(self) -> None:
        conn, self._conn = self._conn, None
        if self._timer is not None:
            self._timer.cancel()
        assert conn is not None
        if self._paused and conn.transport is not None:  # back to the pool reading
            conn.transport.resume_reading()
        conn.finished(self._keep_alive and not self._buffer)
        self._receiver.end()

    def _fail(self, error: BaseException) -> None:
        if self._conn is None and self._connecting is None and self._state == _DONE:
            return  # already ended, failed or aborted
        retry = self._reused and not self.received and isinstance(error, Broken)
        self._state = _DONE
        self._stop()
        if retry:  # the pooled connection was closed under us: once more on a fresh one
            self._reused = False
            self._state = _HEAD
            self.connect()
        elif self._headed:
            self._receiver.fail(error if isinstance(error, Broken) else Broken(str(error)))
        elif isinstance(error, Broken):
            self._receiver.fail(ConnectionResetError(f"upstream: {error}"))
        else:
            self._receiver.fail(error)

    def _stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self._connecting is not None:
            self._connecting.cancel()
            self._connecting = None
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.exchange = None
            conn.close()

    def _check_idle(self) -> None:
        """One timer per exchange, re-armed lazily: reads only stamp the time."""
        if self._paused:  # the client is slow, not the upstream
            self._last = self._loop.time()
        deadline = self._last + self._pool.read_timeout
        if self._loop.time() >= deadline:
            self._fail(Broken("upstream read timed out") if self._headed else TimeoutError())
        else:
            self._timer = self._loop.call_at(deadline, self._check_idle)

    def _parse(self, data: bytes) -> bytes:
        """Consume `data`; return the body bytes it completes (de-chunked)."""
        out: list[bytes] = []
        pos = 0
        if self._state == _CHUNK_SIZE and not self._buffer:
            # the common reads of a stream: whole chunks (vLLM writes one SSE event per chunk,
            # several arrive together under load), taken without the state machine
            while (line := data.find(b"\r\n", pos, pos + 18)) > pos:
                size = _chunk_size(data[pos:line])
                end = line + 2 + size
                if not size or data[end : end + 2] != b"\r\n":
                    break
                out.append(data[line + 2 : end])
                pos = end + 2
            if pos == len(data):
                return b"".join(out) if len(out) != 1 else out[0]
        buffer = self._buffer + data if self._buffer else data
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
                    self._left = _chunk_size(buffer[pos:end])
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
        fields: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep or not name or name != name.strip():
                raise ValueError(f"bad header line {line[:80]!r}")
            value = value.strip()
            headers.append((name, value))
            fields.setdefault(name.lower(), value)
        head = Head(status, reason, headers, fields)
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
        self._new_head = head


@functools.lru_cache(maxsize=1024)  # a stream repeats a few sizes; C lookup, no re-parsing
def _chunk_size(line: bytes) -> int:
    """A chunk-size line's size: hex digits only (int() would also take a sign, 0x, _)."""
    size = line.split(b";", 1)[0].rstrip(b" \t")
    if not size or size.strip(_HEX):
        raise ValueError(f"bad chunk size {line[:20]!r}")
    return int(size, 16)
