"""The tap's reading of a connection, and the relay check built on it (tests/wiretap.py): the
real-vLLM transparency test passes only where `relay_difference` finds nothing, so it must find
what a proxy could get wrong."""

from __future__ import annotations

import json

from tests.wiretap import Response, relay_difference, responses

SSE = {"content-type": "text/event-stream"}


def chunk(content: str | None, finish: str | None = None, **extra: object) -> bytes:
    choice = {"index": 0, "delta": {} if content is None else {"content": content},
              "finish_reason": finish}  # fmt: skip
    return b"data: " + json.dumps({"id": "c", "choices": [choice], **extra}).encode()


USAGE = (
    b"data: "
    + json.dumps(
        {"id": "c", "choices": [], "usage": {"completion_tokens": 2}, "system_fingerprint": "fp"}
    ).encode()
)


def stream(*events: bytes) -> bytes:
    return b"".join(e + b"\n\n" for e in events)


def test_a_connection_carries_replies_by_length_chunked_or_to_its_end() -> None:
    raw = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: text/event-stream"
           b"\r\n\r\n6\r\ndata: \r\n5\r\nhello\r\n0\r\n\r\n"
           b"HTTP/1.1 404 Not Found\r\nContent-Length: 3\r\n\r\nabc"
           b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nabc")  # fmt: skip
    got = responses(raw)
    assert [(r.status, r.body) for r in got] == [(200, b"data: hello"), (404, b"abc")]
    assert got[0].headers["content-type"] == "text/event-stream"  # names lower-cased


def test_the_engines_events_as_they_came_pass() -> None:
    up = Response(200, SSE, stream(chunk("a"), chunk("b", "length"), b"data: [DONE]"))
    assert relay_difference(up.body, up, {"include_usage": True}) == ""


def test_events_cut_otherwise_or_changed_are_found() -> None:
    up = Response(200, SSE, stream(chunk("a"), chunk("b"), chunk("", "length"), b"data: [DONE]"))
    merged = stream(chunk("ab"), chunk("", "length"), b"data: [DONE]")
    assert relay_difference(merged, up, {"include_usage": True}).startswith("3 events where")
    changed = up.body.replace(b'"b"', b'"B"')
    assert relay_difference(changed, up, {"include_usage": True}).startswith("event 1:")


def test_what_the_proxy_asked_for_is_gone_and_vllms_fingerprint_stamped() -> None:
    """The client asked no usage: the usage event goes, and its fingerprint rides on the
    terminal chunk (as vLLM writes it when no usage event follows); per-event usage goes."""
    up = Response(200, SSE, stream(chunk("a", usage={"completion_tokens": 1}),
                                   chunk("", "length", usage={"completion_tokens": 2}), USAGE,
                                   b"data: [DONE]"))  # fmt: skip
    right = stream(chunk("a"), chunk("", "length", system_fingerprint="fp"), b"data: [DONE]")
    assert relay_difference(right, up, None) == ""
    unstamped = stream(chunk("a"), chunk("", "length"), b"data: [DONE]")
    assert relay_difference(unstamped, up, None).startswith("event 1:")
    kept = stream(chunk("a"), chunk("", "length", system_fingerprint="fp"), USAGE, b"data: [DONE]")
    assert relay_difference(kept, up, None).startswith("4 events where")
    # asked with both options, the client gets every usage member and event as they came
    both = {"include_usage": True, "continuous_usage_stats": True}
    assert relay_difference(up.body, up, both) == ""


def test_a_whole_reply_is_its_body() -> None:
    up = Response(200, {"content-type": "application/json"}, b'{"id":"c"}')
    assert relay_difference(b'{"id":"c"}', up, None) == ""
    assert relay_difference(b'{"id": "c"}', up, None) == "the body differs"
