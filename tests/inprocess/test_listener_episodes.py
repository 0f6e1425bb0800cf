"""The accept loop's episodes of running out of descriptors, with the shortage scripted: a
shortage that comes back right after a success belongs to the same episode (one line when it
starts, one with its count when accept() has worked for `RECOVERED` seconds), as when the
backlog still holds the connections of clients that have just left."""

from __future__ import annotations

import asyncio
import errno
import socket

import pytest
import structlog
from structlog.testing import capture_logs

from exporter.proxy import listener as listening
from exporter.proxy.listener import Listener
from harness.helpers import wait_for

STARTS = "out of file descriptors: new connections get 503"
ENDS = "file descriptors available again"


class Short:
    """The listening socket, except that the next `left` accept() calls fail with EMFILE."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self.left = 0

    def accept(self) -> tuple[socket.socket, object]:
        if self.left:
            self.left -= 1
            raise OSError(errno.EMFILE, "Too many open files")
        return self._sock.accept()

    def fileno(self) -> int:
        return self._sock.fileno()

    def close(self) -> None:
        self._sock.close()


class Answer(asyncio.Protocol):
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.WriteTransport)
        transport.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        transport.close()


async def status(port: int) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    line = await reader.readline()
    writer.close()
    return line.split(b" ")[1]


async def test_a_shortage_right_after_a_success_is_the_same_episode(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(listening, "RECOVERED", 0.3)
    shed: list[str] = []
    with capture_logs() as logs:
        accepting = Listener(lambda peer: Answer(), shed.append, structlog.get_logger())
        accepting.bind("127.0.0.1", 0)
        accepting.start()
        assert accepting._sock is not None
        port = accepting._sock.getsockname()[1]
        short = accepting._sock = Short(accepting._sock)  # type: ignore[assignment]
        try:
            seen = []
            for left in (1, 0, 1, 0):  # short, fine, short again at once, fine
                short.left = left
                seen.append(await status(port))
            assert seen == [b"503", b"200", b"503", b"200"]
            events = lambda: [e["event"] for e in logs]  # noqa: E731
            assert events().count(ENDS) == 0  # accept() has not worked for RECOVERED yet
            await asyncio.to_thread(
                wait_for, lambda: ENDS in events() or None, timeout=5, what="the end"
            )
            assert events().count(STARTS) == 1
            ended = next(e for e in logs if e["event"] == ENDS)
            assert ended["shed"] == 2 == len(shed)

            short.left = 1  # a shortage after the episode ended starts a new one
            assert await status(port) == b"503"
            assert events().count(STARTS) == 2
        finally:
            accepting.close()


async def test_no_success_since_the_last_shortage_ends_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Quiet after a shortage is not recovery: no client came since, so nothing shows that
    accept() works again. The next success, and RECOVERED seconds with no shortage, end it."""
    monkeypatch.setattr(listening, "RECOVERED", 0.2)
    with capture_logs() as logs:
        accepting = Listener(lambda peer: Answer(), lambda _: None, structlog.get_logger())
        accepting.bind("127.0.0.1", 0)
        accepting.start()
        assert accepting._sock is not None
        port = accepting._sock.getsockname()[1]
        short = accepting._sock = Short(accepting._sock)  # type: ignore[assignment]
        events = lambda: [e["event"] for e in logs]  # noqa: E731
        try:
            for left, answer in ((1, b"503"), (0, b"200"), (1, b"503")):
                short.left = left
                assert await status(port) == answer
            await asyncio.sleep(0.6)  # the check the success set up has come and gone
            assert ENDS not in events()
            assert await status(port) == b"200"
            await asyncio.to_thread(
                wait_for, lambda: ENDS in events() or None, timeout=5, what="the end"
            )
            assert events().count(STARTS) == 1
        finally:
            accepting.close()
