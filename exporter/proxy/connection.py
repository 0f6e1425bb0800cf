"""One client connection at the protocol level: its reader, its writer, one request at a time.

Why not aiohttp's server: it hands each request to a handler task (two task switches before
the handler runs, a third when the upstream answers), and at one stream at a time those cost
more than everything else the proxy does. Here a complete request is handed to the `Server`
from `data_received`, which usually writes it upstream before returning.

Pipelined requests wait (and reading pauses while they do), so responses go out in order. A
client that hangs up is told to the current call at once. Every phase has a deadline, so no
client holds a connection slot or a request slot for longer than the config says, however
slowly it sends or reads: a request head must arrive whole within `header_timeout` of its
first byte (else 408, as nginx answers a slow head), its body within `body_timeout` of the
head (408), a client that stops reading a response is cut after `write_timeout` (its upstream
request dropped), and an idle connection is closed after `idle_timeout`.
"""

from __future__ import annotations

import asyncio
import fcntl
import struct
import termios
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple, Protocol, cast

from exporter.proxy.budget import Budget, Hold
from exporter.proxy.reader import Refusal, RequestReader
from exporter.proxy.request import ClientRequest
from exporter.proxy.responses import closing
from exporter.proxy.writer import HIGH_WATER, HTTP_10, ResponseWriter

# a request head arriving slower than this, for longer than a second, yields its connection's
# slot to a new connection when the proxy is at max_connections (a head comes in one segment)
MIN_HEAD_RATE = 512.0  # bytes a second
MIN_HEAD_SECONDS = 1.0
# what a connection with no request under way is told as the proxy closes it (RFC 9110
# §15.5.9: a server that will not wait any longer says 408 and closes): a request that crosses
# the close reads a whole answer that says it was not served, never a bare EOF or a reset
IDLE_CLOSED = closing(408, "the proxy closed this idle keep-alive connection")
SILENT_CLOSED = closing(408, "no request came in time on this new connection to a busy proxy")


class Call(Protocol):
    """A request under way, as its connection sees it."""

    def resume(self) -> None:
        """The client's buffer drained below the high-water mark: relay on."""

    def gone(self) -> None:
        """The client hung up: stop, and drop the upstream request."""


class Server(Protocol):
    def limits(self) -> Limits:
        """What the next request on a connection is held to (a reload may change it)."""

    def begin(self, writer: ResponseWriter, request: ClientRequest, body: bytes) -> Call | None:
        """Start answering; return the call, or None when it was answered at once."""

    def refuse(self, writer: ResponseWriter, refusal: Refusal) -> None:
        """Answer a request that cannot be served (bad HTTP, too large, too slow) and count it."""

    def timed_out(self, phase: str) -> None:
        """A client missed a deadline: "head", "body" or "write" (count it)."""

    def linger(
        self,
        transport: asyncio.Transport,
        answer: bytes,
        unread: Hold | None,
        write: float,
        idle: bool,
    ) -> None:
        """Close `transport`, done with, by a lingering close (`answer` written first; `unread`
        held until the client has read what was written; `write`: its write deadline; `idle`:
        it was between requests, so bytes after the close are a request that crossed it)."""


@dataclass(frozen=True, slots=True)
class Deadlines:
    """Seconds a client has for each phase (ProxyConfig's, with their defaults)."""

    head: float = 10.0  # first byte of a head -> the whole head
    body: float = 60.0  # the whole head -> the whole body
    write: float = 30.0  # a response the client stopped reading -> cut
    idle: float = 75.0  # no request under way, nothing read


class Use(NamedTuple):
    """What a connection is doing with its slot, when no request under way keeps it:
    "kept" (a keep-alive connection between requests, since its last response), "fresh" (no
    byte received yet, since its accept), "head" or "slow_head" (bytes of a request head
    come, not all of it: since the first; slow: under MIN_HEAD_RATE for over a second)."""

    kind: str
    since: float


@dataclass(frozen=True, slots=True)
class Limits:
    """What a connection holds a request to, taken from the server at the accept and again
    after each response: a reload reaches an open keep-alive connection at its next request."""

    max_body: int
    deadlines: Deadlines


class ClientConnection(asyncio.Protocol):
    """Reads requests, hands them to the server in order, one at a time."""

    def __init__(
        self,
        server: Server,
        closed: Callable[[ClientConnection], None],
        *,
        budget: Budget | None = None,
        peer: str = "",
    ) -> None:
        self.server = server
        self._closed = closed
        self.peer = peer  # the client's address: at max_connections, who holds how many slots
        self.limits = server.limits()
        self.reader = RequestReader(self.limits.max_body, budget)
        self.writer = ResponseWriter(self._ended)
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self._fd = -1  # its socket's, to ask the kernel for bytes not read yet
        self._call: Call | None = None
        self._busy = False  # a request is being answered (its call may not exist yet)
        self._served = False  # a response has gone out on it: a keep-alive connection
        self._running = False
        self._draining = False  # every response says Connection: close, then it closes
        self._continued = False  # 100 Continue sent for the request being read
        self._last = self._loop.time()
        self._head_since: float | None = None  # the first byte of a head not yet whole
        self._head_bytes = 0  # bytes received of that head
        self._body_since: float | None = None  # a head whole, its body not yet
        self._body_last = 0.0  # when the last bytes of a body being received came
        self._stalled_since: float | None = None  # the client stopped reading our writes
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
        else:
            self.make_way()

    # ------------------------------------------------------------ at max_connections

    def use(self, now: float) -> Use | None:
        """What it does with its slot; None while a request keeps it (being answered, waiting
        to be, or its body arriving): then it is never the one to go. Bytes still in the kernel
        are not seen here (`unread`)."""
        reader, transport = self.reader, self._transport
        if transport is None or transport.is_closing() or self._busy or reader.ready:
            return None
        if reader.body_pending:
            return None
        if not reader.head_pending:
            return Use("kept" if self._served else "fresh", self._last)
        since = self._head_since if self._head_since is not None else now
        elapsed = now - since
        slow = elapsed >= MIN_HEAD_SECONDS and self._head_bytes < MIN_HEAD_RATE * elapsed
        return Use("slow_head" if slow else "head", since)

    def unread(self) -> int:
        """Bytes the client sent that are still in the kernel's buffer: a request under way,
        whatever the reader has seen."""
        if self._fd < 0 or self._transport is None:
            return 0
        try:
            got = fcntl.ioctl(self._fd, termios.FIONREAD, b"\0\0\0\0")
        except OSError:
            return 0
        return int(struct.unpack("i", got)[0])

    def make_way(self) -> None:
        """Closed with no request under way (to make room, or at a drain): a 408, then a
        lingering close."""
        self._linger(IDLE_CLOSED if self._served else SILENT_CLOSED, idle=self._served)

    def cut_slow_head(self) -> None:
        """A head still arriving gives its slot up: 408, then the close."""
        self._head_since = None
        self.reader.refuse(
            Refusal(408, "request head arriving too slowly for a busy proxy", "RequestTimeout")
        )
        self._next()

    # ------------------------------------------------------------ asyncio's side

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        self._transport.set_write_buffer_limits(high=HIGH_WATER)
        self.writer.transport = self._transport
        sock = self._transport.get_extra_info("socket")
        self._fd = sock.fileno() if sock is not None else -1
        self._head_since = self._last  # the first request's head is due from the connect on
        self._timer = self._loop.call_at(
            self._last + self.limits.deadlines.head, self._check_deadlines
        )

    def data_received(self, data: bytes) -> None:
        if self._transport is None or self._transport.is_closing():
            return
        reader = self.reader
        reader.feed(data)
        now = self._loop.time()
        self._last = now  # a body that keeps coming is not idle
        self._head_bytes = self._head_bytes + len(data) if reader.head_pending else 0
        if not reader.head_pending:
            self._head_since = None
        elif self._head_since is None:
            self._head_since = now
            self._arm(now + self.limits.deadlines.head)
        if not reader.body_pending:
            if self._body_since is not None:
                self._body_since = None
                reader.budget.uploads.discard(self)
        else:
            self._body_last = now
            if self._body_since is None:
                self._body_since = now
                self._arm(now + self.limits.deadlines.body)
                reader.budget.uploads.add(self)  # it may give its hold back when it stalls
        self._next()

    def eof_received(self) -> bool:
        return False  # a half-close is a hang-up, as in aiohttp's server

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = self.writer.transport = None
        self.reader.budget.uploads.discard(self)
        self.reader.release()
        self.writer.drained()
        self.reader.ready.clear()
        if self._timer is not None:
            self._timer.cancel()
        call, self._call = self._call, None
        if call is not None:
            call.gone()
        self._closed(self)

    def pause_writing(self) -> None:
        self.writer.paused = True
        self._stalled_since = now = self._loop.time()
        self._arm(now + self.limits.deadlines.write)

    def resume_writing(self) -> None:
        self.writer.drained()
        self._stalled_since = None
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
        call = self.server.begin(writer, request, body)
        if self._busy:
            self._call = call

    def _refuse(self, refusal: Refusal) -> None:
        self._busy = True
        self.writer.close_after = True  # the rest of the bytes are never read
        self.server.refuse(self.writer, refusal)

    def _ended(self, complete: bool) -> None:
        """The writer ended a response: on to the next request, or close."""
        self._busy = False
        self._served = True
        self._call = None
        self.limits = self.server.limits()  # the next request's, after a reload the new ones
        self.reader.max_body = self.limits.max_body
        self._last = self._loop.time()
        self._arm(self._last + self.limits.deadlines.idle)
        if not complete:
            return  # aborted: the transport is going
        if self.writer.close_after or self.reader.upgraded:
            self._linger()
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

    def _linger(self, answer: bytes = b"", idle: bool = False) -> None:
        """Done with the connection: its state is freed now, its socket handed to the server's
        lingering close, `answer` written first. `idle`: a keep-alive connection between
        requests, where bytes that come after the close are a request that crossed it."""
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        unread = self.writer.unread()  # taken before connection_lost would release it
        self.connection_lost(None)
        self.server.linger(transport, answer, unread, self.limits.deadlines.write, idle)

    def _arm(self, deadline: float) -> None:
        """Make sure the timer fires by `deadline` (it is re-armed lazily otherwise)."""
        timer = self._timer
        if timer is None or timer.when() > deadline:
            if timer is not None:
                timer.cancel()
            self._timer = self._loop.call_at(deadline, self._check_deadlines)

    def _check_deadlines(self) -> None:
        """One timer per connection, re-armed lazily: reads and requests only stamp the time."""
        now, transport, limits = self._loop.time(), self._transport, self.limits.deadlines
        if transport is None:
            return
        if self._stalled_since is not None and now >= self._stalled_since + limits.write:
            self.server.timed_out("write")
            transport.abort()  # its call is told the client is gone: upstream is dropped
            return
        head_since, body_since = self._head_since, self._body_since
        if head_since is not None and now >= head_since + limits.head and not self._busy:
            self._timed_out("head", "request head not received in time")
            return
        if body_since is not None and now >= body_since + limits.body:
            self._timed_out("body", "request body not received in time")
            return
        due = [] if self._stalled_since is None else [self._stalled_since + limits.write]
        if body_since is not None:
            due.append(body_since + limits.body)
        if self._busy:
            due.append(now + limits.idle)
        else:
            if now >= self._last + limits.idle:
                self._linger(IDLE_CLOSED, idle=True)  # idle keep-alive
                return
            due.append(self._last + limits.idle)
            if head_since is not None:
                due.append(head_since + limits.head)
        self._timer = self._loop.call_at(min(due), self._check_deadlines)

    # ------------------------------------------------------------ as a budget's Upload

    def stalled_for(self) -> float:
        """Seconds since the last bytes of the body being received (0: none is)."""
        return 0.0 if self._body_since is None else self._loop.time() - self._body_last

    def evict(self) -> None:
        """The budget needs the room its stalled body holds: 408 and close, its hold given
        back now; the answer goes out from the loop (this runs inside another request's)."""
        if self._body_since is None or self._transport is None:
            return
        self._body_since = None
        self.server.timed_out("stalled_body")
        self.reader.refuse(Refusal(408, "request body stalled under load", "RequestTimeout"))
        self._loop.call_soon(self._next)

    def _timed_out(self, phase: str, message: str) -> None:
        """A head or body too slow: 408 after the responses before it, then the close."""
        if self._body_since is not None:
            self.reader.budget.uploads.discard(self)
        self._head_since = self._body_since = None
        self.server.timed_out(phase)
        self.reader.refuse(Refusal(408, message, "RequestTimeout"))
        self._next()
