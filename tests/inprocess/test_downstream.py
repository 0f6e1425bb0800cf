"""The proxy's client side on raw sockets: what HTTP/1.1 clients may send besides one plain
request per connection (pipelining, 100-continue, chunked and compressed bodies, HTTP/1.0,
upgrades, garbage) and the idle timeout. The upstream echoes what it received."""

from __future__ import annotations

import asyncio
import gzip
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from exporter.proxy import reader as request_reader
from exporter.proxy.request import quick
from harness.rig import sidecar
from harness.scripted import Respond, scripted
from harness.wire import SSE, echo, response


@asynccontextmanager
async def proxy_port(respond: Respond = echo, **config: Any) -> AsyncIterator[int]:
    async with scripted(respond) as (url, _), sidecar(url, **config) as (_, proxy, _):
        yield int(proxy.rsplit(":", 1)[1])


async def exchange(port: int, data: bytes) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    return reader, writer


async def answered_then_closed(port: int, data: bytes) -> tuple[bytes, dict[str, str], bytes]:
    """The one response to `data`, after which the proxy must have closed the connection."""
    reader, writer = await exchange(port, data)
    got = await response(reader)
    assert await asyncio.wait_for(reader.read(), 10) == b""
    writer.close()
    return got


async def test_pipelined_requests_are_answered_in_order() -> None:
    async with proxy_port() as port:
        reader, writer = await exchange(
            port,
            b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n"
            b"POST /b HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nxyz"
            b"GET /c HTTP/1.1\r\nHost: x\r\n\r\n",
        )
        bodies = [(await response(reader))[2] for _ in range(3)]
        writer.close()
    assert [b.split(b" ")[1] for b in bodies] == [b"/a", b"/b", b"/c"]
    assert bodies[1].endswith(b"\r\n\r\nxyz")


async def test_expect_100_continue_then_the_body() -> None:
    async with proxy_port() as port:
        reader, writer = await exchange(
            port,
            b"POST /v1/x HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n",
        )
        interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
        writer.write(b"hello")
        status, _, body = await response(reader)
        writer.close()
    assert status.startswith(b"HTTP/1.1 200")
    assert body.endswith(b"\r\n\r\nhello") and b"expect" not in body.lower()


async def test_chunked_and_compressed_bodies_reach_upstream_as_sent() -> None:
    packed = gzip.compress(b'{"prompt": "hello"}')
    async with proxy_port() as port:
        reader, writer = await exchange(
            port,
            b"POST /v1/x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"
            b"POST /v1/y HTTP/1.1\r\nHost: x\r\nContent-Encoding: gzip\r\n"
            b"Content-Length: %d\r\n\r\n%b" % (len(packed), packed),
        )
        _, _, chunked = await response(reader)
        _, _, compressed = await response(reader)
        writer.close()
    assert b"Content-Length: 11\r\n\r\nhello world" in chunked  # de-chunked, length-framed
    assert b"Content-Encoding: gzip" in compressed and compressed.endswith(packed)


async def test_an_http_10_client_gets_a_streamed_body_until_the_connection_closes() -> None:
    async with proxy_port() as port:
        reader, writer = await exchange(port, b"GET /stream HTTP/1.0\r\n\r\n")
        status, headers, body = await response(reader)
        writer.close()
    assert status.startswith(b"HTTP/1.1 200")
    assert "transfer-encoding" not in headers and headers["connection"] == "close"
    assert body == SSE


@pytest.mark.parametrize(
    "garbage",
    [
        b"NOT HTTP AT ALL\r\n\r\n",
        b"GET /x HTTP/1.1\r\nHost: x\r\nX-Long: " + b"a" * 10_000 + b"\r\n\r\n",
        b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd",
        b"POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    ],
)
async def test_malformed_requests_get_a_400_and_the_connection_closes(garbage: bytes) -> None:
    async with proxy_port() as port:
        status, headers, body = await answered_then_closed(port, garbage)
    assert status.startswith(b"HTTP/1.1 400") and headers["connection"] == "close"
    assert json.loads(body)["error"]["type"] == "BadRequestError"


async def test_an_upgrade_is_answered_as_a_plain_request_then_the_connection_closes() -> None:
    async with proxy_port() as port:
        status, headers, body = await answered_then_closed(
            port,
            b"GET /v1/realtime HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\n"
            b"Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\n\r\nframes",
        )
    assert status.startswith(b"HTTP/1.1 200") and headers["connection"] == "close"
    assert b"upgrade" not in body.lower() and b"frames" not in body


async def test_an_idle_connection_is_closed_with_a_408_first() -> None:
    """A request that crosses the close reads a 408 (not served), never a bare EOF."""
    async with proxy_port(idle_timeout=0.2) as port:
        reader, writer = await exchange(port, b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n")
        await response(reader)
        status, headers, body = await response(reader)
        assert status.startswith(b"HTTP/1.1 408") and headers["connection"] == "close"
        assert b"idle keep-alive" in body
        assert await asyncio.wait_for(reader.read(), 10) == b""
        writer.close()


@pytest.mark.parametrize(
    "sent",
    [b"", b"GET /b HTTP/1.1\r\n", b"GET /b HTTP/1.1\r\nHost: x\r\nX-Slow: "],
    ids=["nothing", "a request line", "a header half-way"],
)
async def test_a_head_that_does_not_complete_in_time_gets_408(sent: bytes) -> None:
    """A slowloris holds no slot: bytes that keep dripping do not extend the head's time."""
    async with proxy_port(header_timeout=0.5, idle_timeout=60) as port:
        reader, writer = await exchange(port, sent)
        started = asyncio.get_running_loop().time()
        for i in range(3):  # drip, well inside the idle timeout (a request line's start:
            await asyncio.sleep(0.2)  # bytes no request begins with are refused at once)
            writer.write(b"GET"[i : i + 1] if not sent else b"a")
        status, headers, body = await response(reader)
        assert status.startswith(b"HTTP/1.1 408") and headers["connection"] == "close"
        assert b"RequestTimeout" in body
        assert await asyncio.wait_for(reader.read(), 10) == b""
        assert asyncio.get_running_loop().time() - started < 5
        writer.close()


async def test_nothing_after_a_request_that_closes_the_connection_is_forwarded() -> None:
    forwarded: list[bytes] = []

    async def recording(request: bytes, writer: asyncio.StreamWriter) -> bool:
        forwarded.append(request.split(b" ", 2)[1])
        return await echo(request, writer)

    async with proxy_port(recording) as port:
        status, headers, _ = await answered_then_closed(
            port,
            b"GET /a HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
            b"GET /b HTTP/1.1\r\nHost: x\r\n\r\n",
        )
    assert status.startswith(b"HTTP/1.1 200") and headers["connection"] == "close"
    assert b"/a" in forwarded and b"/b" not in forwarded


async def test_a_long_body_in_many_reads_is_parsed_once_and_arrives_whole(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its head is parsed once more when the body is complete, not at every read (a 16 MiB
    body in 64 KiB reads, re-parsed and re-copied each time, held the loop for ~2 s)."""
    calls = []

    def counting(buffer: bytes | bytearray) -> object:
        calls.append(len(buffer))
        return quick(buffer)

    monkeypatch.setattr(request_reader, "quick", counting)
    body = bytes(range(256)) * 16384  # 4 MiB
    async with proxy_port() as port:
        reader, writer = await exchange(
            port, b"POST /v1/x HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % len(body)
        )
        for i in range(0, len(body), 4096):
            writer.write(body[i : i + 4096])
            await writer.drain()
        _, _, echoed = await response(reader)
        writer.close()
    assert echoed.endswith(b"\r\n\r\n" + body)
    assert len(calls) <= 3, f"the head was parsed {len(calls)} times"
