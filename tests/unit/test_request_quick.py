"""`request.quick` against the reader's llhttp path (httptools with aiohttp's server limits):
every request quick accepts, llhttp reads the same way (method, target, path, version, fields,
keep-alive, body); the rest quick leaves to llhttp. Requests are drawn near the edges of
quick's shape, valid or not."""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

from exporter.proxy.reader import Llhttp, Refusal, RequestReader
from exporter.proxy.request import MORE, ClientRequest, quick


def llhttp(raw: bytes) -> list[tuple[ClientRequest, bytes]] | None:
    """llhttp's reading of `raw`: its requests, or None when it refuses any part of it."""
    reader = RequestReader(2**20)
    Llhttp(reader).feed(raw)
    if any(isinstance(item, Refusal) for item in reader.ready):
        return None
    return [item for item in reader.ready if not isinstance(item, Refusal)]


methods = st.sampled_from(["GET", "POST", "POST", "HEAD", "DELETE", "OPTIONS", "get", "PRI"])
targets = st.from_regex(r"(/[a-z0-9_~-][a-z0-9_~.-]{0,5}){0,3}/?(\?[a-z=&%]{0,6})?", fullmatch=True)
odd_targets = st.text(alphabet="ab.~_-%2F/?#=& é", max_size=12).map(lambda t: "/" + t)
names = st.sampled_from(
    ["Content-Type", "content-length", "Connection", "X-Route", "Authorization", "Host",
     "Transfer-Encoding", "Expect", "Upgrade", "X Bad", "X:Colon", "", " Host", "X-é"]
)  # fmt: skip
values = st.from_regex(r"[ \t]?[!-~]{1,8}( [!-~]{1,4})?[ \t]?", fullmatch=True)
odd_values = st.text(alphabet="ab /:;=,\t\r\né\x00", max_size=12) | st.sampled_from(
    ["close", "keep-alive", "Upgrade", "chunked", "100-continue", "3", "+3", "3, 3", "99999"]
)


@st.composite
def requests(draw: st.DrawFn) -> bytes:
    """Mostly in quick's shape, with one or two things off the edge now and then."""
    line = b"%s %s HTTP/%s\r\n" % (
        draw(methods).encode(),
        draw(targets | odd_targets).encode(),
        draw(st.sampled_from([b"1.1", b"1.1", b"1.0", b"1.2"])),
    )
    fields = draw(st.lists(st.tuples(names, values | odd_values), max_size=6))
    if draw(st.integers(0, 3)):
        fields.insert(0, ("Host", "example"))
    head = b"".join(b"%s:%s\r\n" % (n.encode(), v.encode()) for n, v in fields)
    body = draw(st.binary(max_size=8))
    return line + head + b"\r\n" + body


@given(raw=requests())
@example(raw=b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}")
@example(raw=b"GET /a/b.c/?x=1 HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
@example(raw=b"GET /a HTTP/1.1\r\nHost: x\r\nX-Route:  voice \t\r\n\r\n")
@settings(max_examples=1500, deadline=None)
def test_what_quick_accepts_llhttp_reads_the_same_way(raw: bytes) -> None:
    got = quick(raw)
    if got is None:
        return  # llhttp's to serve or refuse
    if got == MORE:
        assert b"\r\n\r\n" not in raw
        return
    assert isinstance(got, tuple)
    request, start, length = got
    if len(raw) < start + length:
        raw += b"x" * (start + length - len(raw))  # the body the reader would wait for
    parsed = llhttp(raw[: start + length])
    assert parsed is not None and len(parsed) == 1, "quick accepted what llhttp refuses"
    message, body = parsed[0]
    assert request.method == message.method
    assert request.uri == message.uri
    assert request.path == message.path
    assert request.version == message.version
    assert request.fields == message.fields
    assert request.headers == message.headers
    assert request.should_close == message.should_close
    assert not message.upgrade
    assert raw[start : start + length] == body


def test_what_openai_clients_send_takes_the_quick_path() -> None:
    """The fast path must not go unused: heads as the OpenAI SDK (httpx) and aiohttp send them."""
    body = b'{"model":"m","messages":[],"stream":true}'
    heads = [
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:8001\r\nAccept-Encoding: gzip, "
        b"deflate\r\nConnection: keep-alive\r\nAccept: application/json\r\nContent-Type: "
        b"application/json\r\nUser-Agent: OpenAI/Python 1.99.9\r\nX-Stainless-Lang: python\r\n"
        b"Authorization: Bearer sk-test\r\nX-Stainless-Retry-Count: 0\r\n"
        b"Content-Length: %d\r\n\r\n",
        b"POST /agent/v1/completions HTTP/1.1\r\nHost: localhost:8001\r\nX-Route: voice\r\n"
        b"Accept: */*\r\nAccept-Encoding: gzip, deflate, br\r\nUser-Agent: Python/3.11 "
        b"aiohttp/3.12.15\r\nContent-Length: %d\r\nContent-Type: application/json\r\n\r\n",
    ]
    for head in heads:
        raw = head % len(body) + body
        got = quick(raw)
        assert isinstance(got, tuple)
        request, start, length = got
        assert raw[start : start + length] == body and not request.should_close
