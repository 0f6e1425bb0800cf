"""The proxy's upstream connections on real sockets, against a scripted HTTP/1.1 server: keep-alive
reuse, the idle-close race, a response that never comes, and back-pressure from a slow client."""

from __future__ import annotations

import asyncio
import hashlib

import aiohttp
import pytest

from exporter.proxy.upstream import UpstreamPool
from harness.helpers import eventually
from harness.rig import sidecar
from harness.scripted import ok, scripted
from tests.receiver import Gather


async def test_one_connection_serves_request_after_request() -> None:
    async def respond(request: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(ok(request.split(b" ", 2)[1]))
        return True

    async with scripted(respond) as (url, connections):
        pool = UpstreamPool(url, connect_timeout=5, read_timeout=5)
        for i in range(5):
            receiver = Gather()
            pool.send("GET", f"/n/{i}", [], b"", receiver)
            assert (await receiver.response())[1] == f"/n/{i}".encode()
        pool.close()
    assert len(connections) == 1


async def test_a_pooled_connection_the_upstream_closed_while_idle_is_never_written_to() -> None:
    """uvicorn closes idle keep-alive connections: one whose close has arrived is checked out
    before any byte of a request is written on it, and the request goes on a fresh one."""

    async def respond(request: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(ok(b"one" if b"/first" in request else b"two"))
        return False  # and close: the connection the proxy pools is gone

    async with scripted(respond) as (url, connections):
        pool = UpstreamPool(url, connect_timeout=5, read_timeout=5)
        first, second = Gather(), Gather()
        pool.send("POST", "/first", [], b"{}", first)
        assert (await first.response())[1] == b"one"
        await eventually(lambda: ready(pool), timeout=5)  # the close is on its way
        pool.send("POST", "/second", [], b"{}", second)
        assert (await second.response())[1] == b"two"
        pool.close()
    assert len(connections) == 2


async def ready(pool: UpstreamPool) -> bool | None:
    """The pooled connection's close has reached this side (it may not have been read yet)."""
    await asyncio.sleep(0)
    idle = pool._idle  # the test looks, the pool decides
    return not idle or not idle[0].usable(asyncio.get_running_loop().time()) or None


async def test_a_request_the_upstream_read_and_left_unanswered_is_never_sent_again() -> None:
    """Once written, a request may be running on the engine: a close without an answer is a
    502 (counted as `closed`), never a second execution, on a pooled or a fresh connection."""
    executed: list[bytes] = []

    async def respond(request: bytes, writer: asyncio.StreamWriter) -> bool:
        if b"/metrics" in request:
            writer.write(ok(b""))
            return True
        executed.append(request)
        if b"warm" in request:
            writer.write(ok(b"{}"))
            return True  # keep-alive: the next request goes on this pooled connection
        return False  # read it, then hang up without a word

    async with (
        scripted(respond) as (url, _),
        sidecar(url) as (side, proxy, _),
        aiohttp.ClientSession() as session,
    ):
        async with session.post(proxy + "/v1/chat/completions", json={"user": "warm"}) as resp:
            assert resp.status == 200
        for tag in ("pooled", "fresh"):
            async with session.post(proxy + "/v1/chat/completions", json={"user": tag}) as resp:
                assert resp.status == 502
                assert (await resp.json())["error"]["type"] == "BadGateway"
        assert side.proxy is not None
        assert side.proxy.stats.upstream_errors["closed"] == 2
    assert [b"pooled" in r for r in executed].count(True) == 1
    assert [b"fresh" in r for r in executed].count(True) == 1


async def test_a_slow_client_pauses_upstream_reads_and_loses_nothing() -> None:
    """Without back-pressure the proxy would read the whole 64 MiB stream into memory while the
    client reads nothing; with it, the upstream connection stops being read until the client
    catches up, and then every byte arrives in order."""
    piece = bytes(range(256)) * 256  # 64 KiB
    total = 1024 * len(piece)
    sent = [0]

    async def respond(request: bytes, writer: asyncio.StreamWriter) -> bool:
        if b"/metrics" in request:
            writer.write(ok(b""))
            return True
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for _ in range(total // len(piece)):
            writer.write(b"%x\r\n%b\r\n" % (len(piece), piece))
            await writer.drain()
            sent[0] += len(piece)
        writer.write(b"0\r\n\r\n")
        return True

    async with (
        scripted(respond) as (url, _),
        sidecar(url) as (side, proxy, _),
        aiohttp.ClientSession() as session,
    ):
        assert side.proxy is not None
        pool = side.proxy.settings.pool
        async with session.get(proxy + "/bulk") as resp:
            assert resp.status == 200

            def paused() -> bool:
                return any(
                    c.transport is not None and not c.transport.is_reading() for c in pool._busy
                )

            deadline = asyncio.get_running_loop().time() + 30
            while not paused():
                assert sent[0] < total, "the proxy read everything: no back-pressure"
                assert asyncio.get_running_loop().time() < deadline, "upstream never paused"
                await asyncio.sleep(0.01)
            assert sent[0] < total
            digest, received = hashlib.sha256(), 0
            async for data in resp.content.iter_any():
                digest.update(data)
                received += len(data)
        assert received == total
        assert digest.hexdigest() == hashlib.sha256(piece * (total // len(piece))).hexdigest()
        assert not paused()


@pytest.mark.parametrize("status", [204, 304])
async def test_bodiless_statuses_end_without_a_body(status: int) -> None:
    async def respond(request: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 %d Nothing\r\nX-Kept: yes\r\n\r\n" % status)
        return True

    async with scripted(respond) as (url, _):
        pool = UpstreamPool(url, connect_timeout=5, read_timeout=5)
        receiver = Gather()
        pool.send("GET", "/", [], b"", receiver)
        head, body = await receiver.response()
        assert body == b"" and head.get("x-kept") == "yes"
        pool.close()
