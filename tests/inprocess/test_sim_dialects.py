"""The simulator's other engines against recorded samples of those engines: every event and
response has the recorded one's keys, in its order, with values of the same JSON types
(tests/fixtures/real-llamacpp-* from a real llama-server; sglang-0.5.23-wire.json from
SGLang's own serializers); the llama.cpp metrics page has the real one's names, HELP and TYPE."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from harness.rig import JA, simulator

FIXTURES = Path(__file__).parents[1] / "fixtures"
SGLANG = json.loads((FIXTURES / "sglang-0.5.23-wire.json").read_text("utf-8"))


def shape(value: Any) -> Any:
    """Keys in order and JSON types, recursively (lists: the shape of their first item)."""
    if isinstance(value, dict):
        return [(k, shape(v)) for k, v in value.items()]
    if isinstance(value, list):
        return ["list", shape(value[0]) if value else None]
    if isinstance(value, bool) or value is None:
        return type(value).__name__
    return "number" if isinstance(value, int | float) else type(value).__name__


def events(body: bytes) -> list[Any]:
    out = []
    for block in body.decode().split("\n\n"):
        if block.startswith("data: {"):
            out.append(json.loads(block.removeprefix("data: ")))
    return out


async def post(base: str, path: str, body: dict[str, Any]) -> bytes:
    async with aiohttp.ClientSession() as session, session.post(base + path, json=body) as resp:
        assert resp.status == 200
        return await resp.read()


def recorded_events(name: str) -> list[Any]:
    return events((FIXTURES / name).read_bytes())


async def test_llamacpp_events_and_responses_have_the_real_servers_shapes() -> None:
    chat = {"messages": JA, "max_tokens": 24}
    async with simulator(kind="llamacpp") as (_, base):
        stream = events(await post(base, "/v1/chat/completions", chat | {"stream": True}))
        usage = events(
            await post(
                base,
                "/v1/chat/completions",
                chat | {"stream": True, "stream_options": {"include_usage": True}},
            )
        )
        whole = json.loads(await post(base, "/v1/chat/completions", chat))
        text = events(await post(base, "/v1/completions", {"prompt": "x", "stream": True}))
        text_whole = json.loads(await post(base, "/v1/completions", {"prompt": "x"}))
    real = recorded_events("real-llamacpp-sse-chat.txt")
    assert [shape(e) for e in (stream[0], stream[-1])] == [shape(e) for e in (real[0], real[-1])]
    real_usage = recorded_events("real-llamacpp-sse-chat-usage.txt")
    assert [shape(e) for e in usage[-2:]] == [shape(e) for e in real_usage[-2:]]
    assert shape(whole) == shape(json.loads((FIXTURES / "real-llamacpp-chat.json").read_bytes()))
    real_text = recorded_events("real-llamacpp-sse-completions.txt")
    assert [shape(e) for e in (text[0], text[-1])] == [
        shape(e) for e in (real_text[0], real_text[-1])
    ]
    recorded = json.loads((FIXTURES / "real-llamacpp-completion.json").read_bytes())
    assert shape(text_whole) == shape(recorded)


async def test_llamacpp_timings_are_the_time_the_request_spent() -> None:
    """A user timing the simulator reads its timings as a real server's: the decode's time grows
    with the tokens decoded, never exceeds the request's own wall time, and its rate agrees."""
    timings, walls = {}, {}
    async with simulator(kind="llamacpp", speed=50) as (_, base):
        for tokens in (8, 160):
            body = {"prompt": "def f():", "max_tokens": tokens, "ignore_eos": True}
            started = time.monotonic()
            timings[tokens] = json.loads(await post(base, "/v1/completions", body))["timings"]
            walls[tokens] = 1000.0 * (time.monotonic() - started)
    short, long = timings[8], timings[160]
    assert long["predicted_n"] == 160 and short["predicted_n"] == 8
    assert long["predicted_ms"] > 4 * short["predicted_ms"] > 0
    for tokens, found in timings.items():
        assert found["prompt_ms"] + found["predicted_ms"] <= walls[tokens]
        rate = 1000.0 * tokens / found["predicted_ms"]
        assert found["predicted_per_second"] == pytest.approx(rate)


async def test_the_llamacpp_page_has_the_real_servers_names_help_and_types() -> None:
    real = {
        line
        for line in (FIXTURES / "real-llamacpp.prom").read_text().splitlines()
        if line.startswith("#")
    }
    async with simulator(kind="llamacpp") as (_, base):
        await post(base, "/v1/completions", {"prompt": "x", "max_tokens": 30})
        async with aiohttp.ClientSession() as session, session.get(base + "/metrics") as resp:
            page = await resp.text()
    ours = {line for line in page.splitlines() if line.startswith("#")}
    assert ours and ours <= real
    assert 'llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="2"}' in page


@pytest.mark.parametrize("chat", [True, False])
async def test_sglang_events_and_responses_have_its_serializers_shapes(chat: bool) -> None:
    path = "/v1/chat/completions" if chat else "/v1/completions"
    body: dict[str, Any] = {"messages": JA} if chat else {"prompt": "def f():"}
    # chat: as recorded, ends on a stop token (matched_stop a number); completions: max_tokens
    body |= {"return_spec_tokens_details": True} | ({} if chat else {"max_tokens": 30})
    async with simulator(kind="sglang") as (_, base):
        stream = events(
            await post(
                base, path, body | {"stream": True, "stream_options": {"include_usage": True}}
            )
        )
        whole = json.loads(await post(base, path, body))
        plain = json.loads(await post(base, path, {**body, "return_spec_tokens_details": False}))
    kind = "chat" if chat else "completion"
    want = [
        *(["chat first chunk", "chat content chunk", "chat finish chunk"] if chat else []),
        *([] if chat else ["completion content chunk", "completion final content chunk"]),
        f"{kind} sglext chunk",
        "chat usage chunk" if chat else "completion usage chunk (exclude_none=True)",
    ]
    recorded = {n: json.loads(SGLANG[n].removeprefix("data: ")) for n in want}
    ours = (
        [stream[0], stream[1], stream[-3], stream[-2], stream[-1]]
        if chat
        else [stream[0], stream[-3], stream[-2], stream[-1]]
    )
    if not chat:  # ours: a content chunk, the last one (with the finish), details, usage
        ours = [stream[0], stream[-3], stream[-2], stream[-1]]
    assert [shape(e) for e in ours] == [shape(recorded[n]) for n in want]
    with_ext = (
        "chat non-stream with sglext (model_dump_json(by_alias=True))"
        if chat
        else "completion non-stream with sglext"
    )
    assert shape(whole) == shape(json.loads(SGLANG[with_ext]))
    if chat:
        assert shape(plain) == shape(json.loads(SGLANG["chat non-stream without sglext"]))
    assert "sglext" not in plain
