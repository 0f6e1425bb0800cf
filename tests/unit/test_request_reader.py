"""The request reader in process: quick path then llhttp, pipelined requests in order, any read
boundaries, and every refusal (aiohttp's server limits) queued after the requests before it."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.proxy.reader import MAX_FIELD, MAX_HEAD, MAX_HEADERS, Refusal, RequestReader
from exporter.proxy.request import ClientRequest
from tests.unit.responses import split

POST = b"POST /v1/x HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n\r\nabc"
GET = b"GET /a?b=1 HTTP/1.1\r\nHost: h\r\n\r\n"
CHUNKED = (
    b"POST /c HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
)


def read(*pieces: bytes, max_body: int = 1024) -> RequestReader:
    reader = RequestReader(max_body)
    for piece in pieces:
        reader.feed(piece)
    return reader


def requests(reader: RequestReader) -> list[tuple[str, str, bytes]]:
    out = []
    for item in reader.ready:
        assert isinstance(item, tuple), item
        request, body = item
        out.append((request.method, request.uri, body))
    return out


@given(cuts=st.lists(st.integers(0, len(POST + GET + CHUNKED + POST)), max_size=8))
@settings(max_examples=200, deadline=None)
def test_pipelined_requests_in_any_reads_come_out_whole_and_in_order(cuts: list[int]) -> None:
    raw = POST + GET + CHUNKED + POST
    reader = read(*split(raw, cuts))
    assert requests(reader) == [
        ("POST", "/v1/x", b"abc"),
        ("GET", "/a?b=1", b""),
        ("POST", "/c", b"abcde"),  # de-chunked
        ("POST", "/v1/x", b"abc"),
    ]


def test_llhttp_reads_fields_as_sent() -> None:
    raw = b"GET /%61/b?q HTTP/1.0\r\nX-Route:  voice \t\r\nx-route: second\r\n\r\n"
    reader = read(raw)
    request, body = reader.ready[0]  # type: ignore[misc]
    assert isinstance(request, ClientRequest) and body == b""
    assert request.path == "/%61/b" and request.uri == "/%61/b?q"  # as sent, not decoded
    assert request.version == (1, 0) and request.should_close
    assert request.fields == [("X-Route", "voice"), ("x-route", "second")]
    assert request.headers == {"x-route": "voice"}


@pytest.mark.parametrize(
    ("raw", "status", "words"),
    [
        (b"GET /a HTTP/1.1\r\n\r\n", 400, "Missing 'Host' header"),
        (b"GET /a HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400, "Duplicate 'Host' header"),
        (b"GET /a HTTP/1.1\r\nHost: a\r\nX: a\x00b\r\n\r\n", 400, "header value"),
        (b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\nHost: a\r\n\r\n", 400, "request target longer"),
        (
            b"GET /a HTTP/1.1\r\nHost: a\r\nX: " + b"v" * MAX_FIELD + b"\r\n\r\n",
            400,
            "field longer",
        ),
        (
            b"GET /a HTTP/1.1\r\nHost: a\r\n" + b"X: v\r\n" * MAX_HEADERS + b"\r\n",
            400,
            "too many headers",
        ),
        (b"GET /a HTTP/1.1\r\nHost: a\r\nX: " + b"v" * (MAX_HEAD + 10), 400, "head longer"),
        (b"BREW /a HTTP/1.1\r\nHost: a\r\n\r\n", 400, "method"),
        (b"POST /a HTTP/1.1\r\nHost: a\r\nContent-Length: 2000\r\n\r\n", 413, "larger than 1024"),
        (
            b"POST /a HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
            + b"400\r\n"
            + b"x" * 1024
            + b"\r\n1\r\nx\r\n0\r\n\r\n",
            413,
            "larger than 1024",
        ),
    ],
)
def test_refusals_come_after_the_requests_before_them(raw: bytes, status: int, words: str) -> None:
    reader = read(GET, GET + raw, GET)
    items = list(reader.ready)
    assert [type(i) for i in items[:2]] == [tuple, tuple]
    refusal = items[2]
    assert isinstance(refusal, Refusal) and refusal.status == status, refusal
    assert words.lower() in refusal.message.lower()
    assert len(items) == 3, "nothing after a refusal is read"


def test_a_large_body_declared_by_quick_is_refused_before_it_arrives() -> None:
    reader = read(b"POST /a HTTP/1.1\r\nHost: a\r\nContent-Length: 5000\r\n\r\n", max_body=1024)
    assert list(reader.ready) == [
        Refusal(413, "request body larger than 1024 bytes", "RequestEntityTooLarge")
    ]


def test_expect_100_continue_is_signalled_until_the_body_is_complete() -> None:
    reader = read(
        b"POST /a HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n"
    )
    assert reader.wants_continue and not reader.ready
    reader.feed(b"ok")
    assert not reader.wants_continue and requests(reader) == [("POST", "/a", b"ok")]


def test_an_upgrade_ends_the_reading() -> None:
    reader = read(
        b"GET /ws HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\nframes"
    )
    assert reader.upgraded
    ((request, body),) = reader.ready  # type: ignore[misc]
    assert request.upgrade and body == b""
    reader.feed(GET)
    assert len(reader.ready) == 1
