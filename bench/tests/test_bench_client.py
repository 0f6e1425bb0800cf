"""bench/_stream_client.py is the load generator of bench_proxy: if it miscounted, the proxy's
figures would be wrong. Checked against the simulator and against scripted responses."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import sys
from pathlib import Path

from harness.rig import simulator
from harness.scripted import scripted

_spec = importlib.util.spec_from_file_location(
    "_stream_client", Path(__file__).resolve().parents[1] / "_stream_client.py"
)
assert _spec is not None and _spec.loader is not None
client = importlib.util.module_from_spec(_spec)
sys.modules["_stream_client"] = client  # dataclasses look their module up
_spec.loader.exec_module(client)
Pool = client.Pool

BODY = json.dumps(
    {
        "model": "sim-27b",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 16,
        "stream": True,
    }
).encode()
JSON = {"Content-Type": "application/json"}


def chunked(events: list[bytes]) -> bytes:
    return b"".join(b"%x\r\n%b\r\n" % (len(e), e) for e in events) + b"0\r\n\r\n"


async def test_streams_from_the_simulator_complete_with_a_first_token_time() -> None:
    async with simulator(speed=1000) as (_, url):
        pool = Pool()
        samples, _ = await pool.run(f"{url}/v1/chat/completions", BODY, 12, 3, lambda _: JSON)
        pool.close()
    assert len(samples) == 12
    assert all(s.ok for s in samples)
    assert all(s.ttft is not None and 0 < s.ttft <= s.total for s in samples)
    assert len(pool.workers[f"{url}/v1/chat/completions"]) == 3


async def test_error_responses_and_truncated_streams_are_failures() -> None:
    async def respond(request: bytes, writer: asyncio.StreamWriter) -> bool:
        if b"/bad" in request:
            done = b'data: {"text":"x"}\n\ndata: [DONE]\n\n'  # a stream's body, a 500's status
            writer.write(b"HTTP/1.1 500 Oops\r\nContent-Length: %d\r\n\r\n%b" % (len(done), done))
            return True
        event = b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n'
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        if b"/nodone" in request:
            writer.write(chunked([event]))  # a complete body that never said [DONE]
            return True
        writer.write(chunked([event])[: -len(b"0\r\n\r\n")])
        return False  # closed before [DONE] and the last chunk

    async with scripted(respond) as (url, _):
        pool = Pool()
        bad, _ = await pool.run(f"{url}/bad", BODY, 2, 1, lambda _: JSON)
        cut, _ = await pool.run(f"{url}/cut", BODY, 2, 1, lambda _: JSON)
        nodone, _ = await pool.run(f"{url}/nodone", BODY, 2, 1, lambda _: JSON)
        pool.close()
    assert [s.ok for s in bad + cut + nodone] == [False] * 6
    assert all(s.ttft is not None for s in cut + nodone)  # the token came; the end did not


async def test_a_connection_the_server_announced_closing_is_not_reused() -> None:
    """nginx closes a keep-alive connection after 1,000 requests (`Connection: close` on the last
    one); a request sent on it before the close arrives would count as a failed stream."""

    async def respond(request: bytes, writer: asyncio.StreamWriter) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\n")
        writer.write(chunked([b'data: {"text":"a"}\n\n', b"data: [DONE]\n\n"]))
        return True  # keeps the connection open: only the client can avoid reusing it

    async with scripted(respond) as (url, connections):
        pool = Pool()
        samples, _ = await pool.run(f"{url}/v1/completions", BODY, 3, 1, lambda _: JSON)
        pool.close()
    assert [s.ok for s in samples] == [True] * 3
    assert len(connections) == 3


async def test_any_read_boundary_gives_the_same_result() -> None:
    events = [
        b'data: {"choices":[{"delta":{"role":"assistant","content":""}}]}\n\n',
        b'data: {"choices":[{"delta":{"content":"Hi"}}]}\n\n',
        b"data: [DONE]\n\n",
    ]
    wire = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked(events)
    # stamped when the chunk carrying the first content token is complete (an SSE event is of
    # use to a client only whole), not earlier, and not later than the read that completed it
    token_at = wire.index(b"\n\n\r\n", wire.index(b'"Hi"')) + 4

    class Transport:  # what the client writes its request to
        def write(self, _: bytes) -> None:
            pass

    for step in (1, 2, 3, 7, 64, len(wire)):
        conn = client._Exchange()
        conn.connection_made(Transport())  # type: ignore[arg-type]
        done = conn.start(client.build_request("http://h:1/v1/chat/completions", BODY, JSON))
        stamped_at = None
        for i in range(0, len(wire), step):
            conn.data_received(wire[i : i + step])
            if stamped_at is None and conn.ttft is not None:
                stamped_at = i + step
        assert done.result() is True, step
        assert stamped_at is not None and token_at <= stamped_at < token_at + step, step
