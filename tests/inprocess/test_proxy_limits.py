"""Limits: past max_in_flight requests upstream, or max_connections client connections, a
request gets vLLM's 503 shape with a Retry-After (and its connection closes), counted by
limit; below them nothing changes. The requests in flight finish untouched."""

from __future__ import annotations

import asyncio
import json

import aiohttp

from harness.rig import sidecar
from harness.scripted import scripted, sse_completion, streaming

EVENTS = 30


async def one(session: aiohttp.ClientSession, base: str, tag: str) -> tuple[int, dict, bytes]:  # type: ignore[type-arg]
    body = {"model": "sim-27b", "stream": True, "user": tag, "messages": []}
    async with session.post(base + "/v1/chat/completions", json=body) as resp:
        return resp.status, dict(resp.headers), await resp.read()


async def test_past_max_in_flight_requests_get_503_with_retry_after() -> None:
    async with (
        scripted(streaming(EVENTS, 0.02)) as (up, _),
        sidecar(up, max_in_flight=2) as (side, proxy, _),
        aiohttp.ClientSession() as session,
    ):
        first = [asyncio.create_task(one(session, proxy, f"a{i}")) for i in range(2)]
        while side.proxy is not None and side.proxy.stats.in_flight < 2:
            await asyncio.sleep(0.01)
        shed = await asyncio.gather(*(one(session, proxy, f"b{i}") for i in range(3)))
        done = await asyncio.gather(*first)
        after = await one(session, proxy, "c")  # room again
        assert side.proxy is not None
        counted = dict(side.proxy.stats.shed)
    for status, headers, body in shed:
        assert status == 503 and headers["Retry-After"] == "1"
        error = json.loads(body)["error"]
        assert error["code"] == 503 and error["type"] == "ServiceUnavailableError"
        assert "requests in flight" in error["message"]
    for i, (status, _, body) in enumerate(done):
        assert status == 200 and body == b"".join(sse_completion(f"a{i}", EVENTS, usage=False))
    assert after[0] == 200
    assert counted == {
        "connections": 0,
        "in_flight": 3,
        "buffered_bytes": 0,
        "descriptors": 0,
        "connections_idle_closed": 0,
        "connections_silent_closed": 0,
        "connections_slow_head": 0,
    }


async def test_past_max_connections_with_none_to_spare_a_connection_gets_503() -> None:
    """Every slot holds a request under way (none idle, none trickling a head): a new
    connection's request is shed, and the connection closed; once a slot frees, served."""
    async with (
        scripted(streaming(EVENTS, 0.1)) as (up, _),
        sidecar(up, max_connections=2) as (side, proxy, _),
        aiohttp.ClientSession() as session,
    ):
        busy = [asyncio.create_task(one(session, proxy, f"a{i}")) for i in range(2)]
        while side.proxy is not None and side.proxy.stats.in_flight < 2:
            await asyncio.sleep(0.01)
        host, port = proxy.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = await asyncio.wait_for(reader.read(), 10)  # then closed: read to EOF
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 503") and b"Retry-After: 1" in head
        assert b"Connection: close" in head
        assert json.loads(body)["error"]["code"] == 503
        assert [status for status, _, _ in await asyncio.gather(*busy)] == [200, 200]
        status, _, _ = await one(session, proxy, "ok")
        assert status == 200
        assert side.proxy is not None and side.proxy.stats.shed["connections"] == 1
