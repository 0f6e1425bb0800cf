"""One client connection at the protocol level: its reader, its writer, one request at a time.

Why not aiohttp's server: it hands each request to a handler task (two task switches before
the handler runs, a third when the upstream answers), and at one stream at a time those cost
more than everything else the proxy does. Here a complete request is handed to the `Server`
from `data_received`, which usually writes it upstream before returning.

Pipelined requests wait (and reading pauses while they do), so responses go out in order. A
client that hangs up is told to the current call at once. An idle connection, or a head that
never completes, is closed after KEEPALIVE seconds.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol, cast

from exporter.proxy.reader import Refusal, RequestReader
from exporter.proxy.request import ClientRequest
from exporter.proxy.writer import HIGH_WATER, HTTP_10, ResponseWriter

KEEPALIVE = 75.0  # s: an idle client connection is closed after this (aiohttp's default)


class Call(Protocol):
    """A request under way, as its connection sees it."""

    def resume(self) -> None:
        """The client's buffer drained below the high-water mark: relay on."""

    def gone(self) -> None:
        """The client hung up: stop, and drop the upstream request."""


class Server(Protocol):
    def begin(self, writer: ResponseWriter, request: ClientRequest, body: bytes) -> Call | None:
        """Start answering; return the call, or None when it was answered at once."""

    def refuse(self, writer: ResponseWriter, status: int, message: str, kind: str) -> None:
        """Answer a request that cannot be served (bad HTTP, too large) and count it."""


class ClientConnection(asyncio.Protocol):
    """Reads requests, hands them to the server in order, one at a time."""

    def __init__(
        self, server: Server, max_body: int, closed: Callable[[ClientConnection], None]
    ) -> None:
        self.server = server
        self._closed = closed
        self.reader = RequestReader(max_body)
        self.writer = ResponseWriter(self._ended)
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self._call: Call | None = None
        self._busy = False  # a request is being answered (its call may not exist yet)
        self._running = False
        self._continued = False  # 100 Continue sent for the request being read
        self._last = self._loop.time()
        self._timer: asyncio.TimerHandle | None = None

    def close(self) -> None:
        """Drop the connection (a call under way is told its client is gone)."""
        if self._transport is not None:
            self._transport.abort()

    # ------------------------------------------------------------ asyncio's side

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self._transport.set_write_buffer_limits(high=HIGH_WATER)
        self.writer.transport = self._transport
        self._timer = self._loop.call_at(self._last + KEEPALIVE, self._check_idle)

    def data_received(self, data: bytes) -> None:
        if self._transport is None or self._transport.is_closing():
            return
        self.reader.feed(data)
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
        writer.close_after |= request.should_close or request.upgrade or request.version == HTTP_10
        self._last = self._loop.time()
        call = self.server.begin(writer, request, body)
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

    def _check_idle(self) -> None:
        """One timer per connection, re-armed lazily: requests only stamp the time."""
        deadline = self._last + KEEPALIVE
        if self._busy:
            self._timer = self._loop.call_at(self._loop.time() + KEEPALIVE, self._check_idle)
        elif self._loop.time() >= deadline and self._transport is not None:
            self._transport.close()  # idle keep-alive, or a request head that never completes
        else:
            self._timer = self._loop.call_at(deadline, self._check_idle)
