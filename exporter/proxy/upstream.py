"""Keep-alive HTTP/1.1 connections to the proxy's one upstream, at the protocol level.

Why not aiohttp's client: relaying an SSE stream through its StreamReader costs a task
wake-up, a coroutine and a timer reschedule per event, and the proxy relays tens of events per
request. Here a request is written from the caller's own callback when a pooled connection is
free, and each upstream read is de-framed in `data_received` and handed straight to a
`Receiver` (the proxy's call, which writes to the client): no task switch on the way in or out.
The upstream is one known HTTP/1.1 server (vLLM's uvicorn), so the client needed is small:
one request per connection at a time, Content-Length / chunked / until-close bodies, an idle
timeout.

Never twice: a request is written once. A pooled connection is checked before it is written to
(closed, or bytes arrived while it sat idle: discarded, and the next one or a fresh connection
taken), and once a request's bytes are written, whatever happens is reported, never re-sent:
an engine that read the request may be running it.
"""

from __future__ import annotations

import asyncio
import errno
import select
import ssl
from collections.abc import Iterable, Sequence
from typing import Protocol, cast
from urllib.parse import urlsplit

from exporter.proxy.framing import FramingError, Head, ResponseFramer

KEEPALIVE = 4.0  # s: reuse an idle connection only this long; uvicorn closes them after 5 s
MAX_IDLE = 256  # idle connections kept
READ_SIZE = 64 * 1024  # bytes of one upstream read
JOIN_BELOW = 64 * 1024  # a request smaller than this goes out in one write (one packet)
Body = bytes | Sequence[bytes | memoryview]  # pieces: a spliced body is not copied whole


class Broken(Exception):
    """The upstream connection failed after the response head."""


class Malformed(Broken):
    """The upstream's bytes are not a well-formed HTTP/1.1 response (before or after its head);
    `reason`: which rule they broke (framing.FRAMING_REASONS)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class Closed(ConnectionError):
    """The upstream closed the connection after the request was written, before a response
    head: it may have run the request, so it is not sent again."""


class Unreachable(ConnectionError):
    """No connection could be made: nothing of the request reached the upstream."""


class OutOfDescriptors(Unreachable):
    """No connection could be made because this process (or the host) has no file descriptor
    left for it: the proxy's shortage, not the upstream's fault."""


class Receiver(Protocol):
    """What an exchange reports to, from the connection's callbacks. After `end` or `fail`
    nothing more comes; after the receiver's own `Exchange.abort`, nothing at all."""

    def head(self, head: Head) -> None: ...

    def data(self, data: bytes) -> bool:
        """Body bytes (de-chunked); False pauses reading until `Exchange.resume`."""
        ...

    def end(self) -> None: ...

    def fail(self, error: BaseException) -> None:
        """Before the head: Unreachable (nothing sent), Closed (sent, no answer), Malformed
        or TimeoutError (connect or head timed out). After it: Broken (or Malformed)."""
        ...


class UpstreamPool:
    """A pool of connections to the upstream, one `http(s)://host:port`."""

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
        self._retired = False  # replaced by a reload: no connection goes back to the pool

    def send(
        self,
        method: str,
        uri: str,
        headers: Iterable[tuple[str, str]],
        body: Body,
        receiver: Receiver,
        keeps_chunked: bool = True,
    ) -> Exchange:
        """Send a request; its response goes to `receiver`. On a pooled connection that passes
        its check the request is written before this returns; else on a fresh connection.
        `keeps_chunked`: False if the upstream closes a connection after a chunked response
        (whatever its head says), which then goes back to no pool."""
        data = self._serialize(method, uri, headers, body)
        loop = asyncio.get_running_loop()
        while self._idle:
            conn = self._idle.pop()
            if conn.usable(loop.time()):
                _write(conn, data)  # on its way before any bookkeeping
                self._busy.add(conn)
                exchange = Exchange(self, method, (), receiver, keeps_chunked)
                exchange.attached(conn)
                return exchange
            conn.close()
        exchange = Exchange(self, method, data, receiver, keeps_chunked)
        exchange.connect()
        return exchange

    @property
    def idle_connections(self) -> int:
        return len(self._idle)

    def retire(self) -> None:
        """Replaced (a reload changed the upstream): idle connections close now, busy ones
        when their response ends."""
        self._retired = True
        for conn in self._idle:
            conn.close()
        self._idle.clear()

    def close(self) -> None:
        for conn in (*self._idle, *self._busy):
            conn.close()
        self._idle.clear()
        self._busy.clear()

    def _serialize(
        self, method: str, uri: str, headers: Iterable[tuple[str, str]], body: Body
    ) -> Sequence[bytes | memoryview]:
        """The request as pieces to write: one, unless its body is large."""
        pieces = (body,) if isinstance(body, bytes) else tuple(body)
        size = sum(len(p) for p in pieces)
        lines = [f"{method} {uri} HTTP/1.1", f"Host: {self.authority}"]
        lines += (f"{k}: {v}" for k, v in headers)
        if size or method in ("POST", "PUT", "PATCH"):
            lines.append(f"Content-Length: {size}")
        head = "\r\n".join(lines).encode("utf-8", "surrogateescape") + b"\r\n\r\n"
        if size < JOIN_BELOW:
            return (head + b"".join(pieces),)
        return (head, *pieces)

    async def connect(self) -> _Connection:
        """A fresh connection, counted busy (for an exchange that will write on it)."""
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(self.connect_timeout):
            _, conn = await loop.create_connection(
                lambda: _Connection(self), self.host, self.port, ssl=self.ssl
            )
        self._busy.add(conn)
        return conn

    def release(self, conn: _Connection, reusable: bool) -> None:
        """A response ended on `conn`: back to the pool, or closed."""
        self._busy.discard(conn)
        if reusable and not self._retired and len(self._idle) < MAX_IDLE:
            conn.idle_since = asyncio.get_running_loop().time()
            self._idle.append(conn)
        else:
            conn.close()

    def lost(self, conn: _Connection) -> None:
        """`conn` closed: out of the pool."""
        self._busy.discard(conn)
        if conn in self._idle:
            self._idle.remove(conn)


def _write(conn: _Connection, pieces: Sequence[bytes | memoryview]) -> None:
    assert conn.transport is not None
    for piece in pieces:
        conn.transport.write(piece)


class _Connection(asyncio.BufferedProtocol):
    """Reads into a buffer of READ_SIZE: the event loops read up to 256 KiB at a time
    otherwise, and a read that lands while the client is not reading is held whole in the
    client's transport; at most READ_SIZE is, so a stalled stream pins little."""

    def __init__(self, pool: UpstreamPool) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.exchange: Exchange | None = None
        self.idle_since = 0.0
        self._poll: select.poll | None = None  # is the idle socket readable (EOF, late bytes)?
        self._buffer: memoryview | None = None

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._buffer is None:
            self._buffer = memoryview(bytearray(READ_SIZE))
        return self._buffer

    def buffer_updated(self, nbytes: int) -> None:
        assert self._buffer is not None
        self.data_received(bytes(self._buffer[:nbytes]))

    def usable(self, now: float) -> bool:
        """Fit for a request: open, not idle too long, and nothing arrived while it was idle
        (a close on its way, or bytes nobody asked for: a request written now would meet
        them)."""
        return (
            self.transport is not None
            and not self.transport.is_closing()
            and now - self.idle_since < KEEPALIVE
            and not (self._poll is not None and self._poll.poll(0))
        )

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        sock = transport.get_extra_info("socket")
        if sock is not None and transport.get_extra_info("sslcontext") is None:
            self._poll = select.poll()  # TLS records may come unasked: no check for them
            self._poll.register(sock.fileno(), select.POLLIN | select.POLLPRI)

    def data_received(self, data: bytes) -> None:
        if self.exchange is None:
            self.close()  # bytes nobody asked for: the connection is out of step
        else:
            self.exchange.feed(data)

    def eof_received(self) -> bool:
        return False  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        self.pool.lost(self)
        if self.exchange is not None:
            self.exchange.lost()

    def finished(self, reusable: bool) -> None:
        self.exchange = None
        self.pool.release(self, reusable and self.transport is not None)


class Exchange:
    """One request and its response on a pooled connection: the head, then the body, handed to
    the receiver as they arrive (framed by a `ResponseFramer`), with the connect,
    back-pressure and the read timeout around it. The read timeout is the longest silence
    allowed from upstream; while the client is the one not reading, the client's own write
    deadline applies instead."""

    def __init__(
        self,
        pool: UpstreamPool,
        method: str,
        request: Sequence[bytes | memoryview],
        receiver: Receiver,
        keeps_chunked: bool = True,
    ) -> None:
        self._pool = pool
        self._keeps_chunked = keeps_chunked
        self._method = method
        self._request = request  # until written (a fresh connection): then dropped
        self._receiver = receiver
        self._loop = asyncio.get_running_loop()
        self._conn: _Connection | None = None
        self._connecting: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._last = 0.0
        self._framer = ResponseFramer(method)
        self._over = False  # ended, failed or aborted: nothing more is reported
        self._headed = False
        self._paused = False
        self.received = 0  # bytes from upstream

    def attached(self, conn: _Connection) -> None:
        """The request was written on `conn`: its response is this exchange's."""
        conn.exchange = self
        self._conn = conn
        self._request = ()
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
        if self._over:
            return
        self._over = True
        self._stop()

    # ------------------------------------------------------------ the connection's side

    def feed(self, data: bytes) -> None:
        self.received += len(data)
        self._last = self._loop.time()
        framer = self._framer
        try:
            body = framer.feed(data)
        except FramingError as exc:
            self._fail(Malformed(exc.reason, f"malformed response: {exc}"))
            return
        if not self._headed and framer.head is not None:
            self._headed = True
            self._receiver.head(framer.head)
            if self._conn is None:
                return  # aborted by the receiver
        if body and not self._receiver.data(body):
            self._pause()  # the client is full: stop reading upstream
        if framer.done and self._conn is not None:
            self._end()

    def lost(self) -> None:
        if self._over:
            return
        if self._framer.closed():
            self._end()
        else:
            self._fail(Broken("upstream closed the connection"))

    # ------------------------------------------------------------ internals

    async def _connect(self) -> None:
        try:
            conn = await self._pool.connect()
        except TimeoutError as exc:
            self._connecting = None
            self._fail(exc)
            return
        except OSError as exc:
            self._connecting = None
            short = exc.errno in (errno.EMFILE, errno.ENFILE)
            pool = self._pool  # host:port, never the URL's credentials: it goes to the log
            where = f"{pool.host}:{pool.port}: {exc.strerror or exc}"
            self._fail((OutOfDescriptors if short else Unreachable)(where))
            return
        self._connecting = None
        _write(conn, self._request)
        self.attached(conn)

    def _pause(self) -> None:
        if not self._paused and self._conn is not None and self._conn.transport is not None:
            self._paused = True
            self._conn.transport.pause_reading()

    def _end(self) -> None:
        conn, self._conn = self._conn, None
        self._over = True
        if self._timer is not None:
            self._timer.cancel()
        assert conn is not None
        if self._paused and conn.transport is not None:  # back to the pool reading
            conn.transport.resume_reading()
        framer = self._framer
        conn.finished(framer.reusable and (self._keeps_chunked or not framer.chunked))
        self._receiver.end()

    def _fail(self, error: BaseException) -> None:
        if self._over:
            return  # already ended, failed or aborted
        self._over = True
        self._stop()
        if isinstance(error, Malformed | TimeoutError | Unreachable):
            self._receiver.fail(error)
        elif self._headed:
            self._receiver.fail(error if isinstance(error, Broken) else Broken(str(error)))
        else:  # written, and the connection ended before a head: never sent again
            self._receiver.fail(Closed(f"upstream: {error}"))

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
        if self._paused:  # the client is slow, not the upstream (its write deadline applies)
            self._last = self._loop.time()
        deadline = self._last + self._pool.read_timeout
        if self._loop.time() >= deadline:
            self._fail(Broken("upstream read timed out") if self._headed else TimeoutError())
        else:
            self._timer = self._loop.call_at(deadline, self._check_idle)
