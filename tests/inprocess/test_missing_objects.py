"""A completion without exact per-request counts is counted with its reason and left to the
estimate: never read as exact (a gateway that strips the object, n > 1, an odd object)."""

from __future__ import annotations

import asyncio
import json

import aiohttp

from harness.helpers import eventually
from harness.pages import samples
from harness.rig import sidecar
from harness.scripted import ok, scripted

GOOD = {
    "acceptance_histogram": [1, 0, 2, 1],
    "num_spec_steps": 4,
    "num_draft_tokens": 12,
    "num_accepted_draft_tokens": 7,
    "num_spec_tokens": 3,
}
OBJECTS = {  # the request's "user" field -> what the upstream puts in metrics.speculative_decoding
    "good": GOOD,
    "stripped": None,  # a gateway removed it
    "strings": {**GOOD, "num_draft_tokens": "12"},
    "impossible": {**GOOD, "num_accepted_draft_tokens": 13},
    "a list": [GOOD],
}


async def answer(request: bytes, writer: asyncio.StreamWriter) -> bool:
    body = json.loads(request.split(b"\r\n\r\n", 1)[1])
    choices = [
        {"index": i, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}
        for i in range(body.get("n", 1))
    ]
    doc: dict[str, object] = {
        "id": "c",
        "object": "chat.completion",
        "model": "sim-27b",
        "choices": choices,
        "usage": {"prompt_tokens": 3, "completion_tokens": 16, "total_tokens": 19},
    }
    spec = OBJECTS[body["user"]] if body.get("n", 1) == 1 else None
    if spec is not None:
        doc["metrics"] = {"speculative_decoding": spec}
    writer.write(ok(json.dumps(doc).encode()))
    await writer.drain()
    return True


async def test_each_missing_object_is_counted_with_its_reason_and_never_as_exact() -> None:
    async with scripted(answer) as (up, _), sidecar(up) as (_, proxy, metrics):
        async with aiohttp.ClientSession() as session:
            for user, n in [(u, 1) for u in OBJECTS] + [("good", 2)]:
                body = {"model": "sim-27b", "messages": [], "user": user, "n": n}
                headers = {"X-Route": "voice"}
                async with session.post(
                    proxy + "/v1/chat/completions", json=body, headers=headers
                ) as resp:
                    assert resp.status == 200, await resp.text()
                    await resp.read()

            async def page() -> dict[tuple[str, tuple[tuple[str, str], ...]], float] | None:
                async with session.get(metrics) as resp:
                    got = samples(await resp.text())
                return got if any("without_spec" in name for name, _ in got) else None

            got = await eventually(page, 5.0)
    without = {
        dict(labels)["reason"]: value
        for (name, labels), value in got.items()
        if name == "specdec_route_requests_without_spec_metrics_total"
        and dict(labels)["route"] == "voice_chat"
    }
    assert without == {"not_sent": 1, "unknown_shape": 3, "n_above_1": 1}
    exact = {
        name: value
        for (name, labels), value in got.items()
        if dict(labels).get("source") == "exact" and dict(labels).get("route") == "voice_chat"
    }
    # only the one good object: 4 steps, 12 draft tokens, 7 accepted
    assert exact["specdec_route_drafts_total"] == 4
    assert exact["specdec_route_draft_tokens_total"] == 12
    assert exact["specdec_route_accepted_tokens_total"] == 7
    spec_requests = [
        v for (name, _), v in got.items() if name == "specdec_route_spec_requests_total"
    ]
    assert spec_requests == [1]
