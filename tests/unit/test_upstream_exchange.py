"""An upstream exchange around its framer: whatever the read boundaries, the receiver gets the
body sent and the end exactly, the connection goes back to the pool only when the response
allows it, a malformed response fails the exchange (a 502 before the head, a broken response
after it; never re-sent), back-pressure pauses reading, and an abort drops the connection.
The framer alone: test_response_framer.py."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.proxy.upstream import Broken, Closed, Exchange, Malformed
from tests.receiver import Gather
from tests.unit.responses import CHUNKED_BODY, RESPONSES, SSE, split


class FakeTransport:
    def __init__(self) -> None:
        self.closed = False
        self.paused = False
        self.written = b""

    def write(self, data: bytes) -> None:
        self.written += data

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


class FakePool:
    read_timeout = 60.0


def exchange_on(method: str, receiver: Gather) -> tuple[Exchange, FakeConnection]:
    conn = FakeConnection()
    exchange = Exchange(FakePool(), method, (), receiver)  # type: ignore[arg-type]
    conn.transport.write(b"request")
    exchange.attached(conn)  # type: ignore[arg-type]
    return exchange, conn


def run(method: str, pieces: list[bytes], close_at_end: bool) -> tuple[Gather, FakeConnection]:
    async def go() -> tuple[Gather, FakeConnection]:
        receiver = Gather()
        exchange, conn = exchange_on(method, receiver)
        for piece in pieces:
            if conn.exchange is None:
                break
            exchange.feed(piece)
        if close_at_end and conn.exchange is not None:
            exchange.lost()
        return receiver, conn

    return asyncio.run(go())


@pytest.mark.parametrize("name", list(RESPONSES))
@given(cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=12))
@settings(max_examples=60, deadline=None)
def test_any_read_boundaries_give_the_body_and_its_end(name: str, cuts: list[int]) -> None:
    method, raw, body, reusable = RESPONSES[name]
    receiver, conn = run(method, split(raw, cuts), close_at_end=not reusable)
    assert receiver.ended.done() and receiver.error is None
    assert receiver.body == body
    assert receiver.got is not None and receiver.got.status in (200, 204)
    assert conn.released is reusable  # keep-alive only when the response allows it


def test_a_read_of_one_whole_chunk_is_passed_on_as_one_piece() -> None:
    """The common read of a stream (one chunk, one SSE event) takes the short way."""
    chunks = [b"%x\r\n%b\r\n" % (len(e), e) for e in SSE]
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    receiver, conn = run("POST", [head, *chunks, b"0\r\n\r\n"], close_at_end=False)
    assert receiver.parts == SSE and receiver.ended.done() and conn.released is True


def test_a_read_of_several_whole_chunks_is_passed_on_as_one_piece() -> None:
    """Under load several events arrive in one read: one piece (a part chunk's bytes too)."""
    chunks = b"".join(b"%x\r\n%b\r\n" % (len(e), e) for e in SSE)
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    receiver, conn = run("POST", [head, chunks + b"4\r\nab", b"cd\r\n0\r\n\r\n"], False)
    assert receiver.parts == [CHUNKED_BODY + b"ab", b"cd"] and conn.released is True


@pytest.mark.parametrize(
    "raw",
    [
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",  # chunk size not hex
        # sizes Python's int() would take: a sign, a prefix, blanks, an underscore; as a
        # whole chunk in one read (the fast path) and as a chunk that is not whole
        *(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n%b\r\nabc\r\n%b" % (size, rest)
            for size in (b"-3", b"+3", b"0x3", b" 3", b"0_3")
            for rest in (b"", b"0\r\n\r\n")
        ),
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabc\r\n",  # chunk overrun
        b"SPDY/3 200 OK\r\n\r\n",  # not HTTP/1.x
        b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort",  # then the connection drops
    ],
)
def test_a_malformed_or_truncated_response_fails_and_drops_the_connection(raw: bytes) -> None:
    async def go() -> None:
        receiver = Gather()
        exchange, conn = exchange_on("GET", receiver)
        head, sep, rest = raw.partition(b"\r\n\r\n")
        exchange.feed(head + sep)  # then the body in a read of its own, as vLLM writes it
        if rest and conn.exchange is not None:
            exchange.feed(rest)
        if conn.exchange is not None:
            exchange.lost()
        # before the head a 502 (malformed, or closed without an answer), after it broken
        with pytest.raises(Broken if receiver.got is not None else (Malformed, Closed)):
            await receiver.response()
        assert conn.transport.closed and conn.released is None

    asyncio.run(go())


def test_a_receiver_that_is_full_pauses_reading_until_resumed() -> None:
    async def go() -> None:
        receiver = Gather(full=True)
        exchange, conn = exchange_on("GET", receiver)
        exchange.feed(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        exchange.feed(b"3\r\nabc\r\n")
        assert conn.transport.paused and receiver.body == b"abc"
        exchange.resume()
        assert not conn.transport.paused
        exchange.feed(b"0\r\n\r\n")
        await receiver.response()
        assert conn.released is True and not conn.transport.paused

    asyncio.run(go())


def test_an_aborted_exchange_drops_its_connection_and_reports_nothing() -> None:
    async def go() -> None:
        receiver = Gather()
        exchange, conn = exchange_on("POST", receiver)
        exchange.feed(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n")
        exchange.abort()  # the client hung up
        assert conn.transport.closed and conn.exchange is None and conn.released is None
        exchange.lost()
        assert not receiver.ended.done()

    asyncio.run(go())
