"""A scripted HTTP/1.1 upstream: each request is answered by a test's own function."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

Respond = Callable[[bytes, asyncio.StreamWriter], Awaitable[bool]]  # False: close afterwards


@asynccontextmanager
async def scripted(respond: Respond) -> AsyncIterator[tuple[str, list[int]]]:
    """An HTTP/1.1 server answering each request with `respond`; yields its URL and a list
    that gets one entry per accepted connection."""
    connections: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(len(connections))
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    (
                        int(line.split(b":", 1)[1])
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length:")
                    ),
                    0,
                )
                if not await respond(head + await reader.readexactly(length), writer):
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        except asyncio.CancelledError:
            pass  # the server closing at the end of a test: asyncio would log a traceback
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}", connections
    finally:
        server.close()


def ok(body: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%b" % (len(body), body)


def sse_completion(tag: str, events: int, usage: bool) -> list[bytes]:
    """The SSE events of a chat completion as vLLM writes them (compact JSON): `events`
    content events, the finish event, the usage event with a per-request spec-decode object
    when `usage`, then [DONE]. The same `tag` gives the same bytes."""

    def event(doc: dict[str, object]) -> bytes:
        return b"data: " + json.dumps(doc, separators=(",", ":")).encode() + b"\n\n"

    base = {"id": f"chatcmpl-{tag}", "object": "chat.completion.chunk", "created": 1}

    def chunk(delta: str, finish: str | None) -> bytes:
        choice = {"index": 0, "delta": {"content": delta}, "logprobs": None}
        return event({**base, "model": "sim-27b", "choices": [{**choice, "finish_reason": finish}]})

    out = [chunk(f"{tag}:{i} ", None) for i in range(events)] + [chunk("", "stop")]
    if usage:
        steps = max(1, events // 2)
        spec = {
            "num_spec_steps": steps,
            "num_draft_tokens": 3 * steps,
            "num_accepted_draft_tokens": events - steps,
            "acceptance_histogram": [0, steps, 0, 0],
        }
        counts = {"prompt_tokens": 7, "total_tokens": 7 + events, "completion_tokens": events}
        out.append(
            event(
                {**base, "model": "sim-27b", "choices": [], "usage": counts,
                 "metrics": {"speculative_decoding": spec}}
            )
        )  # fmt: skip
    out.append(b"data: [DONE]\n\n")
    return out


def streaming(events: int, delay: float) -> Respond:
    """A vLLM-like streaming upstream: each request's `user` field is its tag, its events go
    out `delay` s apart (chunked); a request that asked for usage gets the usage event too."""

    async def respond(request: bytes, writer: asyncio.StreamWriter) -> bool:
        body = request.partition(b"\r\n\r\n")[2]
        doc = json.loads(body) if body else {}
        options = doc.get("stream_options") or {}
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
            b"transfer-encoding: chunked\r\n\r\n"
        )
        for chunk in sse_completion(
            str(doc.get("user", "x")), events, bool(options.get("include_usage"))
        ):
            writer.write(b"%x\r\n%b\r\n" % (len(chunk), chunk))
            await writer.drain()
            await asyncio.sleep(delay)
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return True

    return respond
