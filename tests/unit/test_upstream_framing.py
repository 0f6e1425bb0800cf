"""The upstream client's response framing: whatever the read boundaries, the body handed on is
the body sent, the end is found exactly, and a malformed response fails the exchange."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.upstream import Broken, Exchange

SSE = [b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n', b"data: [DONE]\n\n"]
CHUNKED_BODY = b"".join(SSE)

RESPONSES: dict[str, tuple[str, bytes, bytes, bool]] = {
    # name: (method, raw response, body, reusable afterwards)
    "length": ("GET", b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello", b"hello", True),
    "empty length": ("GET", b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", b"", True),
    "chunked": (
        "POST",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        + b"".join(b"%x\r\n%b\r\n" % (len(e), e) for e in SSE)
        + b"0\r\n\r\n",
        CHUNKED_BODY,
        True,
    ),
    "chunk extensions and trailers": (
        "POST",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: Chunked\r\n\r\n"
        b"5;name=value\r\nhello\r\n1\r\n!\r\n0\r\nX-Trailer: yes\r\nX-Other: 1\r\n\r\n",
        b"hello!",
        True,
    ),
    "until close": ("GET", b"HTTP/1.0 200 OK\r\n\r\nall of it", b"all of it", False),
    "connection close": (
        "GET",
        b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok",
        b"ok",
        False,
    ),
    "head": ("HEAD", b"HTTP/1.1 200 OK\r\nContent-Length: 1234\r\n\r\n", b"", True),
    "no content": ("DELETE", b"HTTP/1.1 204 No Content\r\n\r\n", b"", True),
    "early hints": (
        "GET",
        b"HTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\n"
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
        b"ok",
        True,
    ),
}


class FakeTransport:
    def __init__(self) -> None:
        self.closed = False
        self.paused = False

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False


class FakeConnection:
    """What an Exchange needs of its connection."""

    def __init__(self) -> None:
        self.transport: Any = FakeTransport()
        self.exchange: Exchange | None = None
        self.released: bool | None = None

    def close(self) -> None:
        self.transport.close()

    def finished(self, reusable: bool) -> None:
        self.exchange = None
        self.released = reusable


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in itertools.pairwise(points) if b > a]


def run(method: str, pieces: list[bytes], close_at_end: bool) -> tuple[Exchange, bytes, Any]:
    async def go() -> tuple[Exchange, bytes, Any]:
        conn = FakeConnection()
        exchange = Exchange(conn, method, read_timeout=60)  # type: ignore[arg-type]
        conn.exchange = exchange
        received: list[bytes] = []
        exchange.start(lambda data: received.append(data) is None)
        for piece in pieces:
            if conn.exchange is None:
                break
            exchange.feed(piece)
        if close_at_end and conn.exchange is not None:
            exchange.lost()
        exchange.close()
        return exchange, b"".join(received), conn

    return asyncio.run(go())


@pytest.mark.parametrize("name", list(RESPONSES))
@given(cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=12))
@settings(max_examples=60, deadline=None)
def test_any_read_boundaries_give_the_body_and_its_end(name: str, cuts: list[int]) -> None:
    method, raw, body, reusable = RESPONSES[name]
    exchange, received, conn = run(method, split(raw, cuts), close_at_end=not reusable)
    assert received == body
    assert exchange.complete
    assert exchange.head.status in (200, 204)
    assert conn.released is reusable  # keep-alive only when the response allows it


@pytest.mark.parametrize(
    "raw",
    [
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",  # chunk size not hex
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabc\r\n",  # chunk overrun
        b"SPDY/3 200 OK\r\n\r\n",  # not HTTP/1.x
        b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort",  # then the connection drops
    ],
)
def test_a_malformed_or_truncated_response_fails_and_drops_the_connection(raw: bytes) -> None:
    async def go() -> None:
        conn = FakeConnection()
        exchange = Exchange(conn, "GET", read_timeout=60)  # type: ignore[arg-type]
        conn.exchange = exchange
        exchange.start(lambda data: True)
        exchange.feed(raw)
        if conn.exchange is not None:
            exchange.lost()
        with pytest.raises(Broken):
            exchange.head  # noqa: B018 (a malformed head has no result)
            await exchange.relayed()
        assert conn.transport.closed and conn.released is None

    asyncio.run(go())


def test_a_sink_that_is_full_pauses_reading_until_resumed() -> None:
    async def go() -> None:
        conn = FakeConnection()
        exchange = Exchange(conn, "GET", read_timeout=60)  # type: ignore[arg-type]
        conn.exchange = exchange
        exchange.feed(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        exchange.start(lambda data: False)  # always full
        exchange.feed(b"3\r\nabc\r\n")
        assert conn.transport.paused
        assert await exchange.relayed() is False
        exchange.resume()
        assert not conn.transport.paused
        exchange.feed(b"0\r\n\r\n")
        assert await exchange.relayed() is True
        assert conn.released is True and not conn.transport.paused

    asyncio.run(go())
