"""The response framer alone (no connection, no loop): whatever the read boundaries, the body it
returns is the body sent, its end is found exactly, what may reuse the connection is told
right, and a malformed response is a FramingError."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.proxy.framing import MAX_HEAD, FramingError, ResponseFramer
from tests.unit.responses import CHUNKED_BODY, RESPONSES, SSE, split


def frame(method: str, pieces: list[bytes]) -> tuple[ResponseFramer, list[bytes]]:
    framer, parts = ResponseFramer(method), []
    for piece in pieces:
        if body := framer.feed(piece):
            parts.append(body)
    return framer, parts


@pytest.mark.parametrize("name", list(RESPONSES))
@given(cuts=st.lists(st.integers(min_value=0, max_value=10_000), max_size=12))
@settings(max_examples=80, deadline=None)
def test_any_read_boundaries_give_the_body_and_its_end(name: str, cuts: list[int]) -> None:
    method, raw, body, reusable = RESPONSES[name]
    framer, parts = frame(method, split(raw, cuts))
    if not reusable and not framer.done:
        assert framer.closed()  # an until-close body ends with the connection
    assert framer.done and b"".join(parts) == body
    assert framer.head is not None and framer.head.status in (200, 204)
    assert framer.reusable is reusable


def test_the_head_is_told_once_whole_and_interim_heads_are_skipped() -> None:
    framer = ResponseFramer("GET")
    assert framer.feed(b"HTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\nHTTP/1.1 200 OK\r\n") == b""
    assert framer.head is None  # the 103 is not the response's head
    framer.feed(b"X-A: 1\r\nx-a: 2\r\nContent-Length: 2\r\n\r\n")
    head = framer.head
    assert head is not None and head.status == 200 and head.reason == "OK"
    assert head.headers == [("X-A", "1"), ("x-a", "2"), ("Content-Length", "2")]
    assert head.get("X-a") == "1" and not framer.done
    assert framer.feed(b"ok") == b"ok" and framer.done and framer.reusable


def test_whole_chunks_in_one_read_come_back_as_one_piece() -> None:
    framer = ResponseFramer("POST")
    framer.feed(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
    one = b"%x\r\n%b\r\n" % (len(SSE[0]), SSE[0])
    assert framer.feed(one) == SSE[0]
    many = b"".join(b"%x\r\n%b\r\n" % (len(e), e) for e in SSE)
    assert framer.feed(many + b"4\r\nab") == CHUNKED_BODY + b"ab"
    assert framer.feed(b"cd\r\n0\r\n\r\n") == b"cd" and framer.done and framer.reusable


def test_bytes_after_the_response_make_the_connection_unusable() -> None:
    framer, parts = frame("GET", [b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokEXTRA"])
    assert parts == [b"ok"] and framer.done and not framer.reusable


def test_a_truncated_body_does_not_end_with_the_connection() -> None:
    framer, _ = frame("GET", [b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort"])
    assert not framer.done and not framer.closed()
    framer, _ = frame("GET", [b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nab"])
    assert not framer.closed()


@pytest.mark.parametrize(
    "raw",
    [
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        *(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n%b\r\nabc\r\n%b" % (size, rest)
            for size in (b"-3", b"+3", b"0x3", b" 3", b"0_3")
            for rest in (b"", b"0\r\n\r\n")
        ),
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabc\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n%b\r\nabc" % (b"f" * 24),
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n100000001\r\nabc",
        b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n\x81\x05hello",
        b"SPDY/3 200 OK\r\n\r\n",
        b"HTTP/1.1 abc OK\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
        b"HTTP/1.1 200 OK\r\n X-Folded: yes\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
        b"HTTP/1.1 200 OK\r\n" + b"X-Big: " + b"a" * (MAX_HEAD + 1),
    ],
)
def test_a_malformed_response_is_a_framing_error(raw: bytes) -> None:
    framer = ResponseFramer("GET")
    head, sep, rest = raw.partition(b"\r\n\r\n")
    with pytest.raises(FramingError):
        framer.feed(head + sep)
        framer.feed(rest)


def test_a_chunk_size_with_leading_zeros_is_still_a_size() -> None:
    framer = ResponseFramer("GET")
    framer.feed(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
    assert framer.feed(b"0000000000000000003\r\nabc\r\n0\r\n\r\n") == b"abc"
    assert framer.done


def test_each_framing_error_names_its_reason() -> None:
    framer = ResponseFramer("GET")
    framer.feed(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
    with pytest.raises(FramingError) as caught:
        framer.feed(b"f" * 24 + b"\r\n")
    assert caught.value.reason == "chunk_size"
