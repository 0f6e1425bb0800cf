"""The proxy's client side: HTTP/1.1 connections from clients, at the protocol level.

Why not aiohttp's server: it hands each request to a handler task (two task switches before
the handler runs, a third when the upstream answers), and at one stream at a time those cost
more than everything else the proxy does. Here a complete request is handed to the `Server`
from `data_received`, which usually writes it upstream before returning. Requests in the shape
clients send are parsed by `request.quick`; anything else by aiohttp's own request parser
(llhttp, in C), so what is accepted is what aiohttp's server accepts.

One request at a time per connection: pipelined requests wait (and reading pauses while they
do), so responses go out in order. A client that hangs up is told to the current call at once.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from email.utils import formatdate
from typing import Protocol, cast

from aiohttp.base_protocol import BaseProtocol
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.http_parser import HttpRequestParser, RawRequestMessage
from aiohttp.streams import StreamReader

from exporter.request import MORE, Request, from_message, quick

HIGH_WATER = 64 * 1024  # bytes buffered for the client before its call is told to pause
KEEPALIVE = 75.0  # s: an idle client connection is closed after this (aiohttp's default)
HTTP_10 = (1, 0)


class Call(Protocol):
    """A request under way, as its connection sees it."""

    def resume(self) -> None:
        """The client's buffer drained below the high-water mark: relay on."""

    def gone(self) -> None:
        """The client hung up: stop, and drop the upstream request."""


class Server(Protocol):
    def begin(self, client: Client, request: Request, body: bytes) -> Call | None:
        """Start answering; return the call, or None when it was answered at once."""

    def refuse(self, client: Client, status: int, message: str, kind: str) -> None:
        """Answer a request that cannot be served (bad HTTP, too large) and count it."""


class Client(asyncio.Protocol):
    """One client connection: parse requests, hand them on in order, write their responses."""

    def __init__(self, server: Server, max_body: int, closed: Callable[[Client], None]) -> None:
        self.server = server
        self.max_body = max_body
        self._closed = closed
        self.paused = False  # the client reads slower than we write
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self._parser = HttpRequestParser(  # bodies pass through as sent: no decompression
            cast(BaseProtocol, self), self._loop, 2**16, auto_decompress=False
        )
        self._waiting: deque[tuple[RawRequestMessage, StreamReader]] = deque()
        self._call: Call | None = None
        self._busy = False  # a request is being answered (its call may not exist yet)
        self._running = False
        self._continued = False  # 100 Continue sent for the first waiting request
        self._close_after = False
        self._upgraded = False
        self._quick = True  # until llhttp has seen bytes of this connection
        self._raw = bytearray()  # a request `quick` has not got whole yet
        self._need = 0  # bytes of it needed: its head and Content-Length, once known
        self._version = (1, 1)
        self._pending_head: bytes | None = None  # a streamed response's head, until bytes come
        self._chunked = False
        self._last = self._loop.time()
        self._timer: asyncio.TimerHandle | None = None

    # ------------------------------------------------------------ what calls use

    def respond(
        self,
        status: int,
        reason: str,
        headers: list[tuple[str, str]],
        body: bytes,
        *,
        head_only: bool = False,
    ) -> None:
        """A whole response: head and body in one write. `head_only` (a HEAD request): the
        headers, Content-Length among them, describe a body that is not sent."""
        if not head_only and status not in (204, 304) and not 100 <= status < 200:
            headers = [*headers, ("Content-Length", str(len(body)))]
        self._write(self._head(status, reason, headers) + (b"" if head_only else body))
        self._finish()

    def start_stream(self, status: int, reason: str, headers: list[tuple[str, str]]) -> None:
        """A streamed response: the head goes out with the first bytes, or on the next loop
        iteration if none come with it."""
        self._chunked = self._version != HTTP_10
        if self._chunked:
            headers = [*headers, ("Transfer-Encoding", "chunked")]
        else:
            self._close_after = True  # an HTTP/1.0 client reads until the connection closes
        self._pending_head = self._head(status, reason, headers)
        self._loop.call_soon(self._flush_head)

    def send(self, data: bytes) -> None:
        if self._chunked:
            data = b"%x\r\n%b\r\n" % (len(data), data)
        if self._pending_head is not None:
            data, self._pending_head = self._pending_head + data, None
        self._write(data)

    def end_stream(self, rest: bytes) -> None:
        data = b"%x\r\n%b\r\n" % (len(rest), rest) if self._chunked and rest else rest
        if self._pending_head is not None:
            data, self._pending_head = self._pending_head + data, None
        self._write(data + b"0\r\n\r\n" if self._chunked else data)
        self._finish()

    def abort(self) -> None:
        """Close at once: the client must see a broken response, not a clean end."""
        self._call = None
        self.close()

    def close(self) -> None:
        """Drop the connection (a call under way is told its client is gone)."""
        if self._transport is not None:
            self._transport.abort()

    # ------------------------------------------------------------ asyncio's side

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self._transport.set_write_buffer_limits(high=HIGH_WATER)
        self._timer = self._loop.call_at(self._last + KEEPALIVE, self._check_idle)

    def data_received(self, data: bytes) -> None:
        if self._upgraded or not self._open():
            return  # after an upgrade request: a protocol we do not speak; or we are closing
        if self._quick and not self._busy:  # one request at a time: the common case
            raw = self._raw
            raw += data  # a bytearray: a long body in many reads is not copied over and over
            if len(raw) < self._need:
                return  # the body is on its way: the head was parsed already
            got = quick(raw)
            if got == MORE:
                return
            if isinstance(got, tuple):
                request, start, length = got
                if length > self.max_body:
                    raw.clear()
                    self._too_large()
                    return
                if len(raw) < start + length:
                    self._need = start + length
                    return
                body, data = bytes(raw[start : start + length]), bytes(raw[start + length :])
                raw.clear()
                self._need = 0
                self._start(request, body)
                if not data:
                    return  # else: pipelined requests, llhttp's from here
            else:
                data = bytes(raw)
                raw.clear()
            self._quick = False  # llhttp has seen bytes: it keeps the connection
        try:
            messages, upgraded, _ = self._parser.feed_data(data)
        except HttpProcessingError as exc:
            self._waiting.clear()
            self._close_after = True
            if not self._busy:
                self.server.refuse(self, 400, exc.message or "bad request", "BadRequestError")
            return
        self._waiting.extend(messages)
        self._upgraded = upgraded  # no upgrades: answered as a plain request, then we close
        self._next()

    def eof_received(self) -> bool:
        return False  # a half-close is a hang-up, as in aiohttp's server

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        self._waiting.clear()
        if self._timer is not None:
            self._timer.cancel()
        call, self._call = self._call, None
        if call is not None:
            call.gone()
        self._closed(self)

    def pause_writing(self) -> None:
        self.paused = True

    def resume_writing(self) -> None:
        self.paused = False
        if self._call is not None:
            self._call.resume()

    # the request parser's body readers ask for these; bodies are bounded by max_body
    def pause_reading(self) -> None:
        pass

    def resume_reading(self, resume_parser: bool = True) -> None:
        pass

    # ------------------------------------------------------------ internals

    def _next(self) -> None:
        """Start the first waiting request whose body is complete, if none is being answered."""
        if self._running:
            return  # re-entered from a call answered at once: the loop below goes on
        self._running = True
        try:
            while not self._busy and self._waiting and self._open():
                message, payload = self._waiting[0]
                if max(_declared(message), payload.total_bytes) > self.max_body:
                    self._too_large()
                    break
                if not payload.is_eof():
                    if not self._continued and _expects_continue(message):
                        self._continued = True
                        self._write(b"HTTP/1.1 100 Continue\r\n\r\n")
                    break
                self._waiting.popleft()
                self._continued = False
                body = payload.read_nowait(-1) if payload.total_bytes else b""
                self._start(from_message(message), body)
        finally:
            self._running = False
        self._flow()

    def _start(self, request: Request, body: bytes) -> None:
        self._busy = True
        self._version = request.version
        self._close_after |= request.should_close or request.upgrade or self._version == HTTP_10
        self._last = self._loop.time()
        call = self.server.begin(self, request, body)
        if self._busy:
            self._call = call

    def _too_large(self) -> None:
        self._waiting.clear()
        self._close_after = True  # the rest of the body is never read
        why = f"request body larger than {self.max_body} bytes"
        self.server.refuse(self, 413, why, "RequestEntityTooLarge")

    def _finish(self) -> None:
        self._busy = False
        self._call = None
        self._last = self._loop.time()
        if self._close_after and self._transport is not None:
            self._transport.close()
        elif not self._running:
            self._next()

    def _open(self) -> bool:
        return self._transport is not None and not self._transport.is_closing()

    def _flow(self) -> None:
        """Pipelined requests wait unread while one is answered (memory stays bounded)."""
        if self._transport is None or self._transport.is_closing():
            return
        if self._busy and self._waiting:
            self._transport.pause_reading()
        elif not self._transport.is_reading():
            self._transport.resume_reading()

    def _flush_head(self) -> None:
        if self._pending_head is not None:
            self._write(self._pending_head)
            self._pending_head = None

    def _write(self, data: bytes) -> None:
        if self._transport is not None:
            self._transport.write(data)

    def _head(self, status: int, reason: str, headers: list[tuple[str, str]]) -> bytes:
        lines = [f"HTTP/1.1 {status} {reason}"]
        lines += (f"{k}: {v}" for k, v in headers)
        if self._close_after:
            lines.append("Connection: close")
        return "\r\n".join(lines).encode("utf-8", "surrogateescape") + b"\r\n\r\n"

    def _check_idle(self) -> None:
        """One timer per connection, re-armed lazily: requests only stamp the time."""
        deadline = self._last + KEEPALIVE
        if self._busy:
            self._timer = self._loop.call_at(self._loop.time() + KEEPALIVE, self._check_idle)
        elif self._loop.time() >= deadline and self._transport is not None:
            self._transport.close()  # idle keep-alive, or a request head that never completes
        else:
            self._timer = self._loop.call_at(deadline, self._check_idle)


def _declared(message: RawRequestMessage) -> int:
    """The Content-Length a request announced (the parser checked it is a number)."""
    return int(message.headers.get("Content-Length") or 0)


def _expects_continue(message: RawRequestMessage) -> bool:
    return message.version >= (1, 1) and message.headers.get("Expect", "").lower() == "100-continue"


def date_header() -> tuple[str, str]:
    """For the proxy's own responses (relayed ones keep the upstream's)."""
    return ("Date", formatdate(usegmt=True))
