"""The simulator's contract: vLLM's wire shapes, and counters = per-request objects = truth."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestClient, TestServer

from exporter.core.counts import Counts, from_spec_object, total
from exporter.scrape.families import families, read_page
from exporter.sim.decoder import SimEngine
from exporter.sim.server import build_app

JA = [{"role": "user", "content": "こんにちは、今日は何してた？"}]
CODE = [{"role": "user", "content": "Write a Python function that parses a duration."}]


@pytest.fixture
async def sim() -> AsyncIterator[TestClient[Any, Any]]:
    engine = SimEngine("sim-27b", draft_length=3, data_parallel_size=2, speed=1000, seed=7)
    async with TestClient(TestServer(build_app(engine, "detailed"))) as client:
        yield client


async def sse_events(resp: Any) -> list[Any]:
    body = (await resp.read()).decode()
    assert body.endswith("data: [DONE]\n\n")
    events = [block.removeprefix("data: ") for block in body.split("\n\n") if block]
    assert all(not e.startswith("data:") for e in events)
    return [json.loads(e) for e in events[:-1]]


async def engine_counts(client: TestClient[Any, Any]) -> Counts:
    page = read_page(await (await client.get("/metrics")).text(), families("vllm"))
    return total([s.counts for s in page.series.values()])


async def test_stream_shape_and_agreement(sim: TestClient[Any, Any]) -> None:
    body = {
        "model": "sim-27b",
        "messages": JA,
        "stream": True,
        "max_tokens": 40,
        "stream_options": {"include_usage": True},
    }
    events = await sse_events(await sim.post("/v1/chat/completions", json=body))
    role, contents, final = events[0], events[1:-1], events[-1]
    assert role["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert role["object"] == "chat.completion.chunk"
    assert all(
        len(e["choices"]) == 1 and set(e["choices"][0]["delta"]) == {"content"} for e in contents
    )
    assert [e["choices"][0]["finish_reason"] for e in contents][:-1] == [None] * (len(contents) - 1)
    assert contents[-1]["choices"][0]["finish_reason"] in ("stop", "length")
    assert final["choices"] == [] and "usage" in final
    spec = final["metrics"]["speculative_decoding"]
    # what the stream shows is what was accepted: chunk i (after the first) = accepted + 1 tokens
    steps = spec["per_step_accepted"]
    assert len(contents) == 1 + len(steps) == 1 + spec["num_spec_steps"]
    assert final["usage"]["completion_tokens"] <= 1 + sum(a + 1 for a in steps)
    assert sum(steps) == spec["num_accepted_draft_tokens"]
    assert spec["num_draft_tokens"] == 3 * spec["num_spec_steps"] == sum(spec["per_step_drafted"])
    assert (
        spec["draft_acceptance_rate"]
        == spec["num_accepted_draft_tokens"] / spec["num_draft_tokens"]
    )
    assert (
        spec["mean_acceptance_length"]
        == 1 + spec["num_accepted_draft_tokens"] / spec["num_spec_steps"]
    )
    assert await engine_counts(sim) == from_spec_object(spec)


async def test_counters_equal_objects_equal_truth_over_many_requests(
    sim: TestClient[Any, Any],
) -> None:
    objects = []
    for i in range(30):
        messages = JA if i % 2 else CODE
        body = {"model": "sim-27b", "messages": messages, "max_tokens": 50 + i}
        resp = await sim.post("/v1/chat/completions", json=body)
        objects.append((await resp.json())["metrics"]["speculative_decoding"])
    per_request = total([from_spec_object(o) for o in objects])
    assert await engine_counts(sim) == per_request
    truth = await (await sim.get("/admin/truth")).json()
    ja, code = (
        Counts(t["drafts"], t["draft_tokens"], t["accepted"], tuple(t["per_position"]))
        for t in (truth["ja_chat"], truth["code_agent"])
    )
    assert ja + code == per_request
    assert (
        0.2 < ja.accepted / ja.draft_tokens < 0.5 < 0.6 < code.accepted / code.draft_tokens < 0.85
    )
    page = await (await sim.get("/metrics")).text()
    assert 'engine="0"' in page and 'engine="1"' in page


async def test_completions_and_options(sim: TestClient[Any, Any]) -> None:
    resp = await sim.post(
        "/v1/completions",
        json={
            "model": "sim-27b",
            "prompt": "def f():",
            "max_tokens": 8,
            "stream": True,
            "stream_options": {"continuous_usage_stats": True, "include_usage": True},
        },
    )
    events = await sse_events(resp)
    assert all(e["object"] == "text_completion" for e in events)
    used = [e["usage"]["completion_tokens"] for e in events]
    assert used == sorted(used) and used[-1] == 8
    assert events[-1]["choices"] == [] and "metrics" in events[-1]
    assert "".join(e["choices"][0]["text"] for e in events[:-1])
    # like vLLM, continuous_usage_stats alone gives no usage anywhere
    body = {
        "prompt": "def f():",
        "max_tokens": 8,
        "stream": True,
        "stream_options": {"continuous_usage_stats": True},
    }
    events = await sse_events(await sim.post("/v1/completions", json=body))
    assert all("usage" not in e for e in events)

    # n > 1: no per-request object (null), like vLLM
    whole = await (
        await sim.post("/v1/chat/completions", json={"messages": CODE, "n": 2, "max_tokens": 5})
    ).json()
    assert len(whole["choices"]) == 2 and whole["metrics"] is None

    missing = await sim.post("/v1/chat/completions", json={"model": "other", "messages": CODE})
    assert missing.status == 404
    assert (await missing.json())["error"]["type"] == "NotFoundError"
    assert (await sim.post("/v1/chat/completions", data=b"{nope")).status == 400
    models = await (await sim.get("/v1/models")).json()
    assert models["data"][0]["id"] == "sim-27b"
    assert (await sim.get("/health")).status == 200


async def test_admin_restart_profile_and_faults(sim: TestClient[Any, Any]) -> None:
    await sim.post("/v1/chat/completions", json={"messages": CODE, "max_tokens": 30})
    before = await (await sim.get("/metrics")).text()
    await sim.post("/admin/restart")
    after = await (await sim.get("/metrics")).text()
    assert read_page(after, families("vllm")).series[("sim-27b", "0")].counts.draft_tokens == 0
    created = [
        line
        for line in after.splitlines()
        if line.startswith("vllm:spec_decode_num_drafts_created")
    ]
    assert created and created[0] not in before

    assert (
        await sim.post("/admin/profile", json={"name": "code_agent", "acceptance": 0.1})
    ).status == 200
    objs = [
        (
            await (
                await sim.post("/v1/chat/completions", json={"messages": CODE, "max_tokens": 200})
            ).json()
        )["metrics"]["speculative_decoding"]
        for _ in range(10)
    ]
    c = total([from_spec_object(o) for o in objs])
    assert c.accepted / c.draft_tokens < 0.2

    await sim.post("/admin/fault", json={"name": "http_500"})
    assert (await sim.get("/metrics")).status == 500
    await sim.post("/admin/fault", json={"name": "http_500", "enabled": False})
    await sim.post("/admin/fault", json={"name": "malformed_metrics"})
    assert read_page(await (await sim.get("/metrics")).text(), families("vllm")).bad_lines >= 1
    await sim.post("/admin/fault", json={"name": "spec_off"})
    before_off = await engine_counts(sim)
    resp = await (
        await sim.post("/v1/chat/completions", json={"messages": CODE, "max_tokens": 20})
    ).json()
    assert resp["usage"]["completion_tokens"] == 20
    assert await engine_counts(sim) == before_off, "speculation off: no drafts counted"
    assert (await sim.post("/admin/fault", json={"name": "nope"})).status == 400


async def test_drop_connection_mid_stream(sim: TestClient[Any, Any]) -> None:
    await sim.post("/admin/fault", json={"name": "drop_connection_mid_stream", "value": 2})
    body = {"messages": CODE, "stream": True, "max_tokens": 100}
    resp = await sim.post("/v1/chat/completions", json=body)
    received = b""
    with contextlib.suppress(aiohttp.ClientPayloadError):
        async for data in resp.content.iter_any():
            received += data
    assert received.count(b"data: ") == 3 and b"[DONE]" not in received  # role + 2 chunks
    page = await (await sim.get("/metrics")).text()
    aborts = [
        line
        for line in page.splitlines()
        if line.startswith("vllm:request_success_total")
        and 'finished_reason="abort"' in line
        and not line.endswith(" 0.0")
    ]
    assert aborts, "the dropped request counts as an abort"


async def acceptances(client: TestClient[Any, Any], n: int, **body: Any) -> list[float]:
    """Per-request acceptance of n code_agent requests, from their per-request objects."""
    out = []
    for _ in range(n):
        payload = {"messages": CODE, "max_tokens": 400, **body}
        resp = await (await client.post("/v1/chat/completions", json=payload)).json()
        obj = resp["metrics"]["speculative_decoding"]
        out.append(obj["num_accepted_draft_tokens"] / obj["num_draft_tokens"])
    return out


def sd(values: list[float]) -> float:
    mean = sum(values) / len(values)
    return (sum((v - mean) ** 2 for v in values) / (len(values) - 1)) ** 0.5


async def test_each_request_draws_its_own_acceptance(sim: TestClient[Any, Any]) -> None:
    """Default c = 15: requests spread (sd ~0.115 at 0.71, plus their own steps' noise);
    c = inf: only the steps' noise is left."""
    spread = await acceptances(sim, 120)
    assert 0.64 < sum(spread) / len(spread) < 0.78
    assert 0.09 < sd(spread) < 0.17, sd(spread)
    changed = {"name": "code_agent", "acceptance": 0.71, "concentration": "inf"}
    answer = await (await sim.post("/admin/profile", json=changed)).json()
    assert answer["concentration"] == "inf" and answer["acceptance"] == 0.71
    alike = await acceptances(sim, 120)
    assert sd(alike) < sd(spread) / 2, (sd(alike), sd(spread))


async def test_sampling_fields_decide_the_length(sim: TestClient[Any, Any]) -> None:
    async def ending(**body: Any) -> tuple[int, str]:
        payload = {"messages": JA, "max_tokens": 300, **body}
        resp = await (await sim.post("/v1/chat/completions", json=payload)).json()
        return resp["usage"]["completion_tokens"], resp["choices"][0]["finish_reason"]

    natural = [await ending() for _ in range(5)]
    assert all(n <= 90 and reason == "stop" for n, reason in natural)  # ja_chat: 30-90 tokens
    assert await ending(ignore_eos=True) == (300, "length")
    tokens, reason = await ending(min_tokens=200)
    assert 200 <= tokens <= 300 and reason == "stop"
    bad = {"messages": JA, "min_tokens": -1}
    assert (await sim.post("/v1/chat/completions", json=bad)).status == 400
    bad = {"messages": JA, "ignore_eos": "yes"}
    assert (await sim.post("/v1/chat/completions", json=bad)).status == 400


async def test_a_profile_with_repetition_loops(sim: TestClient[Any, Any]) -> None:
    loops = {"name": "code_agent", "acceptance": 0.71, "loop_share": 1.0}
    assert (await sim.post("/admin/profile", json=loops)).status == 200
    payload = {"messages": CODE, "max_tokens": 500}
    resp = await (await sim.post("/v1/chat/completions", json=payload)).json()
    obj = resp["metrics"]["speculative_decoding"]
    assert resp["choices"][0]["finish_reason"] == "length"
    assert resp["usage"]["completion_tokens"] == 500
    assert obj["num_accepted_draft_tokens"] / obj["num_draft_tokens"] > 0.9
    bad = {"name": "code_agent", "acceptance": 0.5, "loop_share": 2}
    assert (await sim.post("/admin/profile", json=bad)).status == 400
