"""Responses to one client connection: whole, or streamed as the upstream's bytes come.

A streamed response is chunked for HTTP/1.1 clients and runs until the connection closes for
HTTP/1.0 ones; one whose length the upstream gave keeps it and goes out as it comes. Its head
waits for the first body bytes (one write, one packet), or for the next loop iteration if none
come with it. Back-pressure is a flag the relay reads (`paused`): the client reads slower than
the upstream writes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from email.utils import formatdate

from exporter.proxy.budget import Hold

HIGH_WATER = 64 * 1024  # bytes buffered for the client before the relay is told to pause
HTTP_10 = (1, 0)


class ResponseWriter:
    """Writes the response of the request being answered; `ended(True)` is called once it is
    complete, `ended(False)` when it was aborted."""

    def __init__(self, ended: Callable[[bool], None]) -> None:
        self.transport: asyncio.Transport | None = None
        self.paused = False  # the client reads slower than we write
        self.version = (1, 1)  # of the request being answered
        self.close_after = False  # the connection closes after this response
        self._ended = ended
        self._pending_head: bytes | None = None  # a streamed response's head, until bytes come
        self._chunked = False
        self._kept: Hold | None = None  # a whole response's bytes, until the client takes them

    def keep(self, hold: Hold | None) -> None:
        """The bytes of `hold` were written: they stay held while the client has not read them
        (the transport buffers them), so a client that reads nothing pins no bytes unaccounted."""
        if hold is None:
            return
        if self.paused and self._kept is None:
            self._kept = hold
        else:
            hold.release()

    def unread(self) -> Hold | None:
        """The hold of bytes the client has not read yet, handed to whoever keeps the socket
        (a lingering close) and no longer this writer's to release."""
        kept, self._kept = self._kept, None
        return kept

    def drained(self) -> None:
        """The client took what was buffered for it (or is gone)."""
        self.paused = False
        if self._kept is not None:
            self._kept.release()
            self._kept = None

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
        self.write(self._head(status, reason, headers) + (b"" if head_only else body))
        self._ended(True)

    def start_stream(
        self, status: int, reason: str, headers: list[tuple[str, str]], length: str | None = None
    ) -> None:
        """A response whose body follows with `send`; `length`: its Content-Length, if known."""
        self._chunked = length is None and self.version != HTTP_10
        if length is not None:
            headers = [*headers, ("Content-Length", length)]
        elif self._chunked:
            headers = [*headers, ("Transfer-Encoding", "chunked")]
        else:
            self.close_after = True  # an HTTP/1.0 client reads until the connection closes
        self._pending_head = self._head(status, reason, headers)
        asyncio.get_running_loop().call_soon(self._flush_head)

    def send(self, data: bytes) -> None:
        if self._chunked:
            data = b"%x\r\n%b\r\n" % (len(data), data)
        if self._pending_head is not None:
            data, self._pending_head = self._pending_head + data, None
        self.write(data)

    def end_stream(self, rest: bytes) -> None:
        data = b"%x\r\n%b\r\n" % (len(rest), rest) if self._chunked and rest else rest
        if self._pending_head is not None:
            data, self._pending_head = self._pending_head + data, None
        self.write(data + b"0\r\n\r\n" if self._chunked else data)
        self._ended(True)

    def abort(self) -> None:
        """Close at once: the client must see a broken response, not a clean end."""
        if self.transport is not None:
            self.transport.abort()
        self._ended(False)

    def write(self, data: bytes) -> None:
        if self.transport is not None:
            self.transport.write(data)

    def _flush_head(self) -> None:
        if self._pending_head is not None:
            self.write(self._pending_head)
            self._pending_head = None

    def _head(self, status: int, reason: str, headers: list[tuple[str, str]]) -> bytes:
        lines = [f"HTTP/1.1 {status} {reason}"]
        lines += (f"{k}: {v}" for k, v in headers)
        if self.close_after:
            lines.append("Connection: close")
        return "\r\n".join(lines).encode("utf-8", "surrogateescape") + b"\r\n\r\n"


def date_header() -> tuple[str, str]:
    """For the proxy's own responses (relayed ones keep the upstream's)."""
    return ("Date", formatdate(usegmt=True))
