"""How the proxy closes a client connection it has finished with: a lingering close.

Why not transport.close(): when bytes the proxy has not read are in the socket, or arrive after
the close, the kernel answers them with a reset, and a reset makes the client's kernel drop
what it had not yet handed the client: the end of the response, or the 503 that said to come
back. A client that sent a request on a keep-alive connection the proxy was closing then sees
"connection reset" and cannot know whether its request ran. As nginx and Apache do: shut the
write side once the last response byte is out (the client reads a FIN, after every byte we
sent), then read and drop what the client still sends, until it closes its side, has sent
nothing for `QUIET` seconds, or `LONGEST` seconds have passed; then close. The socket is
handed to a `Lingering` protocol, so the connection's own state is freed at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import cast

from exporter.proxy.budget import Hold

QUIET = 2.0  # seconds without a byte from the client that end the lingering
LONGEST = 10.0  # seconds a lingering close takes at most, whatever the client sends


class Lingering(asyncio.Protocol):
    """A socket being closed: `answer` (if any) is written, then the FIN, then the client's
    bytes are read and dropped until it closes, goes quiet or `LONGEST` passes. While bytes we
    wrote are still going out, the lingering waits for them (the response is whole first), as
    long as they make progress within `write_timeout`, and `unread` (the budget's bytes for
    them) is held until they are out. `crossed` is told once if the client sends anything (a
    request that crossed the close of an idle connection); `over` once, when it is closed."""

    def __init__(
        self,
        over: Callable[[Lingering], None],
        answer: bytes = b"",
        unread: Hold | None = None,
        write_timeout: float = 30.0,
        crossed: Callable[[], None] | None = None,
    ) -> None:
        self._over = over
        self._crossed = crossed
        self._answer = answer
        self._unread = unread
        self._write_timeout = write_timeout
        self._transport: asyncio.Transport | None = None
        self._loop = asyncio.get_running_loop()
        self._last = self._until = 0.0  # the client's last byte; the lingering's end
        self._unsent = 0  # bytes of ours not yet sent when last looked, and since when
        self._unsent_since = 0.0
        self._timer: asyncio.TimerHandle | None = None

    def take(self, transport: asyncio.BaseTransport) -> None:
        """Start lingering on `transport` (a new connection refused, or one handed over)."""
        self._transport = transport = cast(asyncio.Transport, transport)  # uvloop's: no subclass
        now = self._loop.time()
        self._last = self._unsent_since = now
        self._until = now + LONGEST
        try:
            if self._answer:
                transport.write(self._answer)
            transport.write_eof()  # after the bytes already buffered
            if not transport.is_reading():
                transport.resume_reading()
        except OSError:  # the client reset it already: nothing to linger for
            transport.abort()
            return
        self._check()

    def abort(self) -> None:
        if self._transport is not None:
            self._transport.abort()

    # ------------------------------------------------------------ asyncio's side

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.take(transport)

    def data_received(self, data: bytes) -> None:
        self._last = self._loop.time()  # dropped: nothing after the end is answered
        if self._crossed is not None:
            self._crossed()
            self._crossed = None

    def eof_received(self) -> bool:
        return False  # the client closed its side too: the transport closes (after our bytes)

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        self._release()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._over(self)

    def _check(self) -> None:
        transport, now = self._transport, self._loop.time()
        if transport is None:
            return
        unsent = transport.get_write_buffer_size()
        if unsent:  # the response is still going out: lingering starts when it is all sent
            if unsent < self._unsent or not self._unsent:
                self._unsent, self._unsent_since = unsent, now
            elif now >= self._unsent_since + self._write_timeout:
                transport.abort()  # the client stopped reading
                return
            self._until = now + LONGEST
            self._timer = self._loop.call_at(now + min(QUIET, self._write_timeout), self._check)
            return
        self._release()
        if now >= self._until:
            transport.abort()  # a client still sending after LONGEST
        elif now >= self._last + QUIET:
            transport.close()
        else:
            self._timer = self._loop.call_at(min(self._until, self._last + QUIET), self._check)

    def _release(self) -> None:
        if self._unread is not None:
            self._unread.release()
            self._unread = None
