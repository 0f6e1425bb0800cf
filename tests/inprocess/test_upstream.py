"""The proxy's upstream connections on real sockets, against a scripted HTTP/1.1 server: keep-alive
reuse, the idle-close race, a response that never comes, and back-pressure from a slow client."""

from __future__ import annotations

import asyncio
import hashlib

import aiohttp
import pytest

from exporter.proxy.upstream import Upstream
from tests.receiver import Gather
from tests.rig import sidecar
from tests.scripted import ok, scripted


async def test_one_connection_serves_request_after_request() -> None:
    async def respond(request: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(ok(request.split(b" ", 2)[1]))
        return True

    async with scripted(respond) as (url, connections):
        upstream = Upstream(url, connect_timeout=5, read_timeout=5)
        for i in range(5):
            receiver = Gather()
            upstream.send("GET", f"/n/{i}", [], b"", receiver)
            assert (await receiver.response())[1] == f"/n/{i}".encode()
        upstream.close()
    assert len(connections) == 1


async def test_a_connection_the_upstream_closed_while_idle_is_retried_on_a_fresh_one() -> None:
    """uvicorn closes idle keep-alive connections; a request sent on one just then must not
    fail. Here the server drops each connection at its second request without a word."""
    served: set[asyncio.StreamWriter] = set()

    async def respond(request: bytes, writer: asyncio.StreamWriter) -> bool:
        if writer in served:
            return False  # closed as the request arrived: nothing was processed
        served.add(writer)
        writer.write(ok(b"one" if b"/first" in request else b"two"))
        return True

    async with scripted(respond) as (url, connections):
        upstream = Upstream(url, connect_timeout=5, read_timeout=5)
        first, second = Gather(), Gather()
        upstream.send("POST", "/first", [], b"{}", first)
        assert (await first.response())[1] == b"one"
        upstream.send("POST", "/second", [], b"{}", second)  # on the pooled connection
        assert (await second.response())[1] == b"two"
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
        receiver = Gather()
        upstream.send("GET", "/", [], b"", receiver)
        head, body = await receiver.response()
        assert body == b"" and head.get("x-kept") == "yes"
        upstream.close()
