"""The proxy's upstream connections on real sockets, against a scripted HTTP/1.1 server: keep-alive
reuse, the idle-close race, a response that never comes, and back-pressure from a slow client."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import aiohttp
import pytest

from exporter.upstream import Upstream
from tests.rig import sidecar

Respond = Callable[[bytes, asyncio.StreamWriter], Awaitable[bool]]  # False: close afterwards


@asynccontextmanager
async def scripted(respond: Respond) -> AsyncIterator[tuple[str, list[int]]]:
    """An HTTP/1.1 server answering each request with `respond`; yields its URL and a list
    that gets one entry per accepted connection."""
    connections: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(len(connections))
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    (
                        int(line.split(b":", 1)[1])
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length:")
                    ),
                    0,
                )
                if not await respond(head + await reader.readexactly(length), writer):
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", connections
    finally:
        server.close()


def ok(body: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%b" % (len(body), body)


async def test_one_connection_serves_request_after_request() -> None:
    async def respond(request: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(ok(request.split(b" ", 2)[1]))
        return True

    async with scripted(respond) as (url, connections):
        upstream = Upstream(url, connect_timeout=5, read_timeout=5)
        for i in range(5):
            exchange = await upstream.request("GET", f"/n/{i}", [], b"")
            assert await exchange.read() == f"/n/{i}".encode()
            exchange.close()
        upstream.close()
    assert len(connections) == 1


async def test_a_connection_the_upstream_closed_while_idle_is_retried_on_a_fresh_one() -> None:
    """uvicorn closes idle keep-alive connections; a request sent just then must not fail."""

    async def respond(request: bytes, writer: asyncio.StreamWriter) -> bool:
        if b"/first" in request:
            writer.write(ok(b"one"))  # keep-alive by the headers, then closed anyway
            return False
        writer.write(ok(b"two"))
        return True

    async with scripted(respond) as (url, connections):
        upstream = Upstream(url, connect_timeout=5, read_timeout=5)
        first = await upstream.request("POST", "/first", [], b"{}")
        assert await first.read() == b"one"
        first.close()
        second = await upstream.request("POST", "/second", [], b"{}")
        assert await second.read() == b"two"
        second.close()
        upstream.close()
    assert len(connections) == 2


async def test_no_response_at_all_is_a_502_once_not_a_retry_loop() -> None:
    async def respond(request: bytes, writer: asyncio.StreamWriter) -> bool:
        if b"/metrics" in request:
            writer.write(ok(b""))
            return True
        return False  # hang up without a word

    async with (
        scripted(respond) as (url, connections),
        sidecar(url) as (side, proxy, _),
        aiohttp.ClientSession() as session,
    ):
        scrapes = len(connections)
        async with session.post(proxy + "/v1/chat/completions", json={}) as resp:
            assert resp.status == 502
            assert (await resp.json())["error"]["type"] == "BadGateway"
        assert side.proxy is not None and side.proxy.upstream_errors["connection"] == 1
        assert len(connections) - scrapes <= 2  # the scraper may have opened one meanwhile


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
        assert side.proxy is not None and side.proxy.upstream is not None
        pool = side.proxy.upstream
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
        upstream = Upstream(url, connect_timeout=5, read_timeout=5)
        exchange = await upstream.request("GET", "/", [], b"")
        assert await exchange.read() == b""
        assert exchange.head.get("x-kept") == "yes"
        exchange.close()
        upstream.close()
