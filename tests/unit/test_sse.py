"""The SSE tap: whatever the read boundaries, the client gets the events vLLM sent less what
the proxy injected, the first content token is found, and only the usage event is decoded."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.engines import engine
from exporter.proxy.sse import StreamTap

FINGERPRINT = "fp-1"


def event(doc: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(doc, separators=(",", ":")).encode() + b"\n\n"


def chat(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> bytes:
    choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
    return event({"id": "c1", "object": "chat.completion.chunk", "choices": [choice], **extra})


def text(piece: str, finish: str | None = None) -> bytes:
    choice = {"index": 0, "text": piece, "logprobs": None, "finish_reason": finish}
    return event({"id": "c1", "object": "text_completion", "choices": [choice]})


USAGE = event(
    {
        "id": "c1",
        "choices": [],
        "usage": {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7},
        "system_fingerprint": FINGERPRINT,
    }
)
DONE = b"data: [DONE]\n\n"
CHAT = [
    chat({"role": "assistant", "content": ""}),
    chat({"reasoning_content": "hmm"}),  # not content: TTFT counts the answer's first token
    chat({"content": 'say "finish_reason":"stop"'}),  # escaped in JSON: not a finish
    chat({"content": "!"}),
    chat({"content": ""}, finish="stop"),
]
COMPLETION = [text("Once"), text(" upon"), text("", finish="length")]


def stamped(finish_event: bytes) -> bytes:
    return finish_event[:-3] + b',"system_fingerprint":"' + FINGERPRINT.encode() + b'"}\n\n'


def feed(tap: StreamTap, stream: bytes, cuts: list[int]) -> bytes:
    bounds = sorted({c % (len(stream) + 1) for c in cuts} | {0, len(stream)})
    out = b"".join(tap.feed(stream[a:b]) for a, b in itertools.pairwise(bounds))
    return out + tap.flush()


@settings(max_examples=200, deadline=None)
@given(cuts=st.lists(st.integers(min_value=0), max_size=12))
def test_injected_usage_is_removed_at_any_read_boundaries(cuts: list[int]) -> None:
    tap = StreamTap(strip_usage_event=True)
    out = feed(tap, b"".join([*CHAT, USAGE, DONE]), cuts)
    assert out == b"".join([*CHAT[:-1], stamped(CHAT[-1]), DONE])
    assert tap.usage is not None and tap.usage["usage"]["completion_tokens"] == 4
    assert tap.first_content_at is not None


@settings(max_examples=100, deadline=None)
@given(cuts=st.lists(st.integers(min_value=0), max_size=12))
def test_a_usage_event_the_client_asked_for_passes_unchanged(cuts: list[int]) -> None:
    stream = b"".join([*CHAT, USAGE, DONE])
    tap = StreamTap()
    assert feed(tap, stream, cuts) == stream
    assert tap.usage is not None


def test_the_first_content_token_is_the_first_non_empty_content() -> None:
    for stream, key, first in ((CHAT, b'"content":"', 2), (COMPLETION, b'"text":"', 0)):
        tap = StreamTap(content_key=key)
        seen = []
        for e in stream:
            tap.feed(e)
            seen.append(tap.first_content_at is not None)
        assert seen == [i >= first for i in range(len(stream))]
        last = tap.last_content_at
        tap.feed(stream[-1])  # a finish event with no content moves nothing
        assert tap.last_content_at == last


def test_several_events_in_one_read_are_timed_as_one_by_one() -> None:
    tap = StreamTap()
    assert tap.feed(CHAT[0] + CHAT[1]) == CHAT[0] + CHAT[1]
    assert tap.first_content_at is None  # an empty content and reasoning are not tokens
    assert tap.feed(CHAT[0] + CHAT[2] + CHAT[3]) == CHAT[0] + CHAT[2] + CHAT[3]
    assert tap.first_content_at is not None and tap.last_content_at == tap.first_content_at
    first = tap.first_content_at
    tap.feed(CHAT[3] + CHAT[3])
    assert tap.first_content_at == first and tap.last_content_at > first


def test_injected_usage_fields_are_removed_and_their_increments_kept() -> None:
    events = [
        chat({"content": "a"}, usage={"prompt_tokens": 3, "completion_tokens": 1}),
        chat({"content": "bcd"}, usage={"prompt_tokens": 3, "completion_tokens": 4}),
    ]
    tap = StreamTap(strip_usage_fields=True)
    out = b"".join(tap.feed(e) for e in events)
    assert out == chat({"content": "a"}) + chat({"content": "bcd"})
    assert tap.increments == [1, 3]


def test_a_truncated_stream_passes_through_as_it_came() -> None:
    tap = StreamTap(strip_usage_event=True)
    cut = CHAT[3][:-5]
    assert tap.feed(CHAT[3]) + tap.feed(cut) + tap.flush() == CHAT[3] + cut


@settings(max_examples=100, deadline=None)
@given(cuts=st.lists(st.integers(min_value=0), max_size=12))
def test_a_held_finish_event_keeps_its_place_when_no_usage_event_follows(cuts: list[int]) -> None:
    """The finish event waits for the usage event's fingerprint; an upstream that sends none
    (a gateway, an older server) still gets the finish event out before [DONE]. Found by the
    upstream fuzzer: the finish event came after [DONE]."""
    stream = b"".join([*CHAT, DONE])
    assert feed(StreamTap(strip_usage_event=True), stream, cuts) == stream


def test_llama_cpp_timings_are_read_from_the_finish_event_and_passed_on() -> None:
    timings = {"predicted_n": 4, "draft_n": 6, "draft_n_accepted": 3}
    stream = b"".join([*CHAT[:-1], chat({}, finish="stop", timings=timings), DONE])
    tap = StreamTap(engine=engine("llamacpp"))
    assert feed(tap, stream, [7, 300]) == stream
    assert tap.timings == timings and tap.finish_reason == "stop"
    vllm = StreamTap()  # an engine that sends no timings: its finish event is not decoded
    assert feed(vllm, stream, [7, 300]) == stream and vllm.timings is None


SGLANG = json.loads(
    (Path(__file__).parents[1] / "fixtures" / "sglang-0.5.23-wire.json").read_text("utf-8")
)
SGL_FIRST, SGL_TOKEN, SGL_FINISH, SGL_DETAILS, SGL_USAGE = (
    SGLANG[name].encode()
    for name in (
        "chat first chunk",
        "chat content chunk",
        "chat finish chunk",
        "chat sglext chunk",
        "chat usage chunk",
    )
)
# SGLang's ids in their own named frame (`x-sglext-ids-framed: 1`): after the details' chunk
SGL_IDS = (
    b'event: sglext_ids\ndata: {"id":"d1f2c3","object":"chat.completion.chunk","created":'
    b'1767225600,"model":"qwen","choices":[],"usage":null,"sglext":{"input_ids":[1,2,3]}}\n\n'
)


@settings(max_examples=200, deadline=None)
@given(cuts=st.lists(st.integers(min_value=0), max_size=12))
def test_sglang_details_and_usage_the_proxy_asked_for_are_removed(cuts: list[int]) -> None:
    """SGLang's own bytes (serialized by its 0.5.23 classes), at any read boundaries: what the
    proxy added goes, the details are read, the ids frame passes as SGLang sent it."""
    stream = b"".join([SGL_FIRST, SGL_TOKEN, SGL_FINISH, SGL_DETAILS, SGL_IDS, SGL_USAGE, DONE])
    tap = StreamTap(strip_usage_event=True, strip_spec_details=True, engine=engine("sglang"))
    assert feed(tap, stream, cuts) == b"".join([SGL_FIRST, SGL_TOKEN, SGL_FINISH, SGL_IDS, DONE])
    assert isinstance(tap.spec_details, dict) and tap.spec_details["spec_verify_ct"] == 7
    assert tap.usage is not None and tap.usage["usage"]["completion_tokens"] == 20


def test_sglang_details_the_client_asked_for_pass_unchanged() -> None:
    stream = b"".join([SGL_FIRST, SGL_TOKEN, SGL_FINISH, SGL_DETAILS, SGL_USAGE, DONE])
    tap = StreamTap(strip_usage_event=False, strip_spec_details=False, engine=engine("sglang"))
    assert feed(tap, stream, []) == stream
    assert isinstance(tap.spec_details, dict)


@settings(max_examples=200, deadline=None)
@given(cuts=st.lists(st.integers(min_value=0), max_size=12), ending=st.sampled_from(["\r\n", "\r"]))
def test_crlf_and_cr_framing_is_read_like_lf_at_any_read_boundaries(
    cuts: list[int], ending: str
) -> None:
    """The SSE grammar's other line ends: the same events found, the same injection removed,
    every other byte as the upstream framed it."""

    def framed(*events: bytes) -> bytes:
        return b"".join(e.replace(b"\n", ending.encode()) for e in events)

    tap = StreamTap(strip_usage_event=True)
    out = feed(tap, framed(*CHAT, USAGE, DONE), cuts)
    assert out == framed(*CHAT[:-1], stamped(CHAT[-1]), DONE)
    assert tap.usage is not None and tap.usage["usage"]["completion_tokens"] == 4
    assert tap.first_content_at is not None and tap.finish_reason == "stop"


def test_an_event_larger_than_max_event_turns_the_tap_into_a_plain_relay() -> None:
    from exporter.proxy.sse import MAX_EVENT

    tap = StreamTap(strip_usage_event=True)
    big = b'data: {"x":"' + b"y" * (MAX_EVENT + 65536) + b'"}\n\n'
    out = b"".join(tap.feed(big[i : i + 65536]) for i in range(0, len(big), 65536))
    out += tap.feed(USAGE) + tap.flush()  # no longer observed: nothing is removed either
    assert out == big + USAGE and tap.overflowed and tap.usage is None


USAGE_DOC = {"choices": [], "usage": {"completion_tokens": 9}, "metrics": {"x": 1}}
USAGE_JSON = json.dumps(USAGE_DOC, separators=(",", ":")).encode()
HALF = USAGE_JSON.index(b'"usage"')  # between two members: where JSON allows a newline


@pytest.mark.parametrize(
    "event",
    [
        b"data: " + USAGE_JSON + b"\n\n",  # vLLM's own
        b"data:" + USAGE_JSON + b"\n\n",  # no space after the colon
        b"id: 41\nevent: message\ndata: " + USAGE_JSON + b"\n\n",  # other fields
        b": keep-alive\nretry: 3000\ndata: " + USAGE_JSON + b"\r\n\r\n",  # a comment, CRLF
        b"data: " + USAGE_JSON[:HALF] + b"\ndata: " + USAGE_JSON[HALF:] + b"\n\n",  # two lines
        b"\xef\xbb\xbfdata: " + USAGE_JSON + b"\r\r",  # a BOM, CR framing
    ],
)
def test_a_usage_event_in_any_form_the_standard_allows_is_read(event: bytes) -> None:
    """An intermediary that re-frames SSE may send any of these; relayed byte for byte, and
    the usage (where the per-request object rides) read as from vLLM's own form. The two-line
    form joins with LF (inside JSON that is whitespace)."""
    tap = StreamTap()
    assert tap.feed(event) + tap.flush() == event
    assert tap.usage == USAGE_DOC
