"""A reload swaps the proxy side as one object: a request in flight finishes under the routes
and limits it began with, and the next request on the same keep-alive connection meets the new
ones (blackbox_exporter's SafeConfig: build, swap one pointer, each request reads it once)."""

from __future__ import annotations

import asyncio
import dataclasses
import json

from exporter.config import Route
from harness.helpers import until
from harness.rig import sidecar
from harness.scripted import ok, scripted

ANSWER = json.dumps({
    "id": "chatcmpl-1", "object": "chat.completion", "model": "sim-27b",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"},
                 "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
}).encode()  # fmt: skip


def request(route: str, content: str) -> bytes:
    body = json.dumps({"model": "sim-27b", "messages": [{"role": "user", "content": content}]})
    return (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Route: {route}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n{body}"
    ).encode()


async def response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    return status, await reader.readexactly(length)


async def test_in_flight_keeps_its_settings_and_the_next_on_its_connection_takes_the_new() -> None:
    gate = asyncio.Event()
    seen: list[bytes] = []

    async def respond(raw: bytes, writer: asyncio.StreamWriter) -> bool:
        if not raw.startswith(b"POST"):  # the sidecar's scrapes
            writer.write(ok(b""))
            await writer.drain()
            return True
        seen.append(raw)
        if len(seen) == 1:
            await gate.wait()  # the first request is held upstream while the reload lands
        writer.write(ok(ANSWER))
        await writer.drain()
        return True

    async with (
        scripted(respond) as (upstream, _),
        sidecar(
            upstream, routes=(Route("voice", (("x-route", "voice"),)),), max_body_bytes=4096
        ) as (side, proxy, _),  # fmt: skip
    ):
        assert side.proxy is not None
        requests = side.proxy.accounting.requests
        host, port = proxy.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(request("voice", "first"))
        await until(lambda: len(seen) == 1)

        old = side.config
        assert old.proxy is not None
        new_proxy = dataclasses.replace(
            old.proxy, routes=(Route("voice_v2", (("x-route", "voice"),)),), max_body_bytes=600
        )
        before = side.proxy.settings
        side.apply(dataclasses.replace(old, proxy=new_proxy))
        assert side.proxy.settings is not before  # one pointer, swapped
        assert side.proxy.settings.pool is before.pool  # same upstream: same pool

        gate.set()
        assert (await response(reader))[0] == 200
        await until(lambda: requests[("voice", "sim-27b", "200", "stop")] == 1)  # as it began

        writer.write(request("voice", "second"))  # the same connection, after the reload
        assert (await response(reader))[0] == 200
        await until(lambda: requests[("voice_v2", "sim-27b", "200", "stop")] == 1)

        writer.write(request("voice", "x" * 1000))  # under the old 4096, over the new 600
        status, body = await response(reader)
        assert status == 413, body
        assert len(seen) == 2  # never forwarded
        writer.close()
