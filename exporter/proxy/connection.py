"""One client connection at the protocol level: its reader, its writer, one request at a time.

Why not aiohttp's server: it hands each request to a handler task (two task switches before
the handler runs, a third when the upstream answers), and at one stream at a time those cost
more than everything else the proxy does. Here a complete request is handed to the `Server`
from `data_received`, which usually writes it upstream before returning.

Pipelined requests wait (and reading pauses while they do), so responses go out in order. A
client that hangs up is told to the current call at once. A request head must arrive whole
within `header_timeout` of its first byte (else 408, as nginx answers a slow head), so a
slowloris does not hold a connection slot; an idle connection, or a body that stalls, is
closed after `idle_timeout`.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol, cast

from exporter.proxy.reader import Refusal, RequestReader
from exporter.proxy.request import ClientRequest
from exporter.proxy.writer import HIGH_WATER, HTTP_10, ResponseWriter


class Call(Protocol):
    """A request under way, as its connection sees it."""

    def resume(self) -> None:
        """The client's buffer drained below the high-water mark: relay on."""

    def gone(self) -> None:
        """The client hung up: stop, and drop the upstream request."""


class Server(Protocol):
    def begin(
        self, writer: ResponseWriter, request: ClientRequest, body: bytes, over_limit: bool
    ) -> Call | None:
        """Start answering; return the call, or None when it was answered at once.
        `over_limit`: the connection came past the server's connection limit."""

    def refuse(self, writer: ResponseWriter, status: int, message: str, kind: str) -> None:
        """Answer a request that cannot be served (bad HTTP, too large) and count it."""


class ClientConnection(asyncio.Protocol):
    """Reads requests, hands them to the server in order, one at a time."""

    def __init__(
        self,
        server: Server,
        max_body: int,
        closed: Callable[[ClientConnection], None],
        *,
        header_timeout: float = 10.0,
        idle_timeout: float = 75.0,
        over_limit: bool = False,
    ) -> None:
        self.server = server
        self._closed = closed
        self.header_timeout = header_timeout
        self.idle_timeout = idle_timeout
        self.over_limit = over_limit  # every request on it is shed (503), then it closes
        self.reader = RequestReader(max_body)
        self.writer = ResponseWriter(self._ended)
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self._call: Call | None = None
        self._busy = False  # a request is being answered (its call may not exist yet)
        self._running = False
        self._draining = False  # every response says Connection: close, then it closes
        self._continued = False  # 100 Continue sent for the request being read
        self._last = self._loop.time()
        self._head_since: float | None = None  # the first byte of a head not yet whole
        self._timer: asyncio.TimerHandle | None = None

    @property
    def busy(self) -> bool:
        """A request is being answered."""
        return self._busy

    def close(self) -> None:
        """Drop the connection (a call under way is told its client is gone)."""
        if self._transport is not None:
            self._transport.abort()

    def drain(self) -> None:
        """The server stops: close now when idle, else after the response under way. A
        connection accepted while draining (it was in the listen backlog) is answered once."""
        self._draining = True
        if self._busy:
            self.writer.close_after = True
        elif self._transport is not None:
            self._transport.close()

    # ------------------------------------------------------------ asyncio's side

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self._transport.set_write_buffer_limits(high=HIGH_WATER)
        self.writer.transport = self._transport
        self._head_since = self._last  # the first request's head is due from the connect on
        self._timer = self._loop.call_at(self._last + self.header_timeout, self._check_idle)

    def data_received(self, data: bytes) -> None:
        if self._transport is None or self._transport.is_closing():
            return
        reader = self.reader
        reader.feed(data)
        now = self._loop.time()
        self._last = now  # a body that keeps coming is not idle
        if not reader.head_pending:
            self._head_since = None
        elif self._head_since is None:
            self._head_since = now
            self._arm(now + self.header_timeout)
        self._next()

    def eof_received(self) -> bool:
        return False  # a half-close is a hang-up, as in aiohttp's server

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = self.writer.transport = None
        self.reader.ready.clear()
        if self._timer is not None:
            self._timer.cancel()
        call, self._call = self._call, None
        if call is not None:
            call.gone()
        self._closed(self)

    def pause_writing(self) -> None:
        self.writer.paused = True

    def resume_writing(self) -> None:
        self.writer.paused = False
        if self._call is not None:
            self._call.resume()

    # ------------------------------------------------------------ internals

    def _next(self) -> None:
        """Start the oldest complete request, if none is being answered."""
        if self._running:
            return  # re-entered from a call answered at once: the loop below goes on
        self._running = True
        ready, writer = self.reader.ready, self.writer
        try:
            while not self._busy and ready and not writer.close_after:
                item = ready.popleft()
                self._continued = False
                if isinstance(item, Refusal):
                    self._refuse(item)
                else:
                    self._start(*item)
            if not self._busy and self.reader.wants_continue and not self._continued:
                self._continued = True
                writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        finally:
            self._running = False
        self._flow()

    def _start(self, request: ClientRequest, body: bytes) -> None:
        self._busy = True
        writer = self.writer
        writer.version = request.version
        writer.close_after |= (
            self._draining or request.should_close or request.upgrade or request.version == HTTP_10
        )
        self._last = self._loop.time()
        call = self.server.begin(writer, request, body, self.over_limit)
        if self._busy:
            self._call = call

    def _refuse(self, refusal: Refusal) -> None:
        self._busy = True
        self.writer.close_after = True  # the rest of the bytes are never read
        self.server.refuse(self.writer, refusal.status, refusal.message, refusal.kind)

    def _ended(self, complete: bool) -> None:
        """The writer ended a response: on to the next request, or close."""
        self._busy = False
        self._call = None
        self._last = self._loop.time()
        self._arm(self._last + self.idle_timeout)
        if not complete:
            return  # aborted: the transport is going
        if self.writer.close_after or self.reader.upgraded:
            if self._transport is not None:
                self._transport.close()
        elif not self._running:
            self._next()

    def _flow(self) -> None:
        """Pipelined requests wait unread while one is answered (memory stays bounded)."""
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        if self._busy and self.reader.ready:
            transport.pause_reading()
        elif not transport.is_reading():
            transport.resume_reading()

    def _arm(self, deadline: float) -> None:
        """Make sure the timer fires by `deadline` (it is re-armed lazily otherwise)."""
        timer = self._timer
        if timer is None or timer.when() > deadline:
            if timer is not None:
                timer.cancel()
            self._timer = self._loop.call_at(deadline, self._check_idle)

    def _check_idle(self) -> None:
        """One timer per connection, re-armed lazily: reads and requests only stamp the time."""
        now, transport = self._loop.time(), self._transport
        if transport is None:
            return
        head_since = self._head_since
        if head_since is not None and now >= head_since + self.header_timeout and not self._busy:
            self._head_since = None
            self._refuse(Refusal(408, "request head not received in time", "RequestTimeout"))
            return
        if self._busy:
            deadline = now + self.idle_timeout
        else:
            deadline = self._last + self.idle_timeout
            if now >= deadline:
                transport.close()  # idle keep-alive, or a body that stalled
                return
            if head_since is not None:
                deadline = min(deadline, head_since + self.header_timeout)
        self._timer = self._loop.call_at(deadline, self._check_idle)
