"""Every connection the proxy ends is closed by lingering: its answer, then a FIN, then the
client's bytes read and dropped. A plain close with bytes unread makes the kernel reset the
connection, and the reset drops what the kernel had not sent yet: the end of a response to a
slow reader. Bounded: a client that goes quiet is closed after QUIET, one that keeps sending
after LONGEST. Run on both event loops."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import pytest

from exporter.proxy import linger
from harness.rig import sidecar, simulator
from harness.scripted import ok, scripted

MIB = 1 << 20


BIG = 8 * MIB  # more than the kernel's socket buffers hold between the proxy and a slow reader


async def big(request: bytes, writer: asyncio.StreamWriter) -> bool:
    writer.write(ok(b"x" * BIG))
    await writer.drain()
    return True


def slow_reader(port: int) -> bytes:
    """A request that closes the connection, with more bytes after it (requests the proxy
    never reads: the last of them in the kernel's buffer), then the response read slowly
    through a small buffer."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16384)
        sock.connect(("127.0.0.1", port))
        sock.settimeout(30)
        sock.sendall(
            b"GET /big HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
            b"GET /more HTTP/1.1\r\nHost: x\r\n\r\n"
        )
        time.sleep(0.2)  # the proxy holds the second request unread and stops reading...
        sock.sendall(b"GET /still-more HTTP/1.1\r\nHost: x\r\n\r\n")  # ...so these wait
        time.sleep(0.5)  # the proxy writes the whole response meanwhile (its buffers fill)
        got = b""
        try:
            while data := sock.recv(65536):
                got += data
                time.sleep(0.001)
        except ConnectionResetError:
            pass  # judged on what came before it
        return got


async def test_a_response_with_unread_bytes_behind_it_arrives_whole() -> None:
    """The proxy closes after a response that says `Connection: close` while the client's
    next bytes sit unread: a plain close resets the connection and the kernel drops the part
    of the response it had not sent yet; the lingering close sends all of it, then the FIN."""
    async with scripted(big) as (up, _), sidecar(up, max_buffered_bytes=64 * MIB) as rig:
        port = int(rig[1].rsplit(":", 1)[1])
        got = await asyncio.to_thread(slow_reader, port)
    head, _, body = got.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and b"Connection: close" in head, head
    assert len(body) == BIG, f"{len(body)} of {BIG} bytes"


def refused(port: int, keep_sending: bool, done: threading.Event) -> bytes:
    """A head the proxy refuses (400); then nothing more, or a byte every 50 ms, until the
    proxy's side is gone or `done`. What came back before the FIN."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.settimeout(30)
        sock.sendall(b"NOT HTTP\r\n\r\n")
        got = b""
        while data := sock.recv(65536):
            got += data
        while not done.wait(0.05):
            if keep_sending:
                try:
                    sock.sendall(b"x")
                except OSError:
                    break
        return got


@pytest.mark.parametrize("keep_sending", [False, True], ids=["quiet", "sending"])
async def test_a_lingering_close_is_bounded(
    monkeypatch: pytest.MonkeyPatch, keep_sending: bool
) -> None:
    """After its answer and FIN the proxy holds the socket to drain the client's bytes: until
    QUIET after the last one, and LONGEST at most, whatever the client sends."""
    monkeypatch.setattr(linger, "QUIET", 0.3)
    monkeypatch.setattr(linger, "LONGEST", 1.0)
    async with simulator() as (_, upstream), sidecar(upstream) as rig:
        port = int(rig[1].rsplit(":", 1)[1])
        proxy = rig[0].proxy
        assert proxy is not None
        done = threading.Event()
        client = asyncio.create_task(asyncio.to_thread(refused, port, keep_sending, done))
        while not proxy._lingering:
            await asyncio.sleep(0.005)
        started = time.monotonic()
        while proxy._lingering:
            await asyncio.sleep(0.005)
        held = time.monotonic() - started
        done.set()
        answer = await client
    assert answer.startswith(b"HTTP/1.1 400") and b"Connection: close" in answer
    bound = linger.LONGEST if keep_sending else linger.QUIET
    assert bound * 0.8 < held < bound + 0.5, held


async def test_while_max_connections_sockets_linger_new_clients_wait_in_the_backlog() -> None:
    """The sockets being closed are bounded too: with max_connections of them lingering the
    proxy stops accepting, and a new client waits in the listen backlog (its request sent,
    nothing lost) until one of them ends; then it is served."""
    async with simulator() as (_, upstream), sidecar(upstream, max_connections=2) as rig:
        side, proxy_url, _ = rig
        port = int(proxy_url.rsplit(":", 1)[1])
        proxy = side.proxy
        assert proxy is not None
        held = []
        for _ in range(2):  # refused heads whose clients keep their sockets open and quiet
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"NOT HTTP\r\n\r\n")
            assert (await reader.readuntil(b"\r\n")).startswith(b"HTTP/1.1 400")
            held.append((reader, writer))
        while len(proxy._lingering) < 2:
            await asyncio.sleep(0.005)
        assert proxy._listener._held  # accept() paused
        reader, writer = await asyncio.open_connection("127.0.0.1", port)  # the backlog's
        writer.write(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        waiting = asyncio.create_task(reader.read())
        await asyncio.sleep(0.2)  # a deadline for what must not happen: an answer while held
        assert not waiting.done()
        held[0][1].close()  # one lingering socket ends: accepting resumes
        answer = await asyncio.wait_for(waiting, 10)
        assert answer.startswith(b"HTTP/1.1 200"), answer[:100]
        writer.close()
        held[1][1].close()
