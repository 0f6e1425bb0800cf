"""Clients that try to take the proxy down, on raw sockets: uploads that stall to pin memory,
readers that stop reading to pin slots, bodies that trickle, trailers that smuggle headers,
transfer codings, header floods, TLS bytes, hop-by-hop tricks, bodies routing cannot read.
Each is bounded, refused or relayed untouched, and counted; never an internal error."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from exporter.sidecar import Sidecar
from harness.helpers import until
from harness.rig import sidecar
from harness.scripted import Respond, ok, scripted
from harness.wire import connect, echo, response

KIB = 1024


@asynccontextmanager
async def proxied(respond: Respond = echo, **config: Any) -> AsyncIterator[tuple[Sidecar, int]]:
    async with scripted(respond) as (url, _), sidecar(url, **config) as (side, proxy, _):
        yield side, int(proxy.rsplit(":", 1)[1])


def upload_head(size: int, path: bytes = b"/v1/chat/completions") -> bytes:
    return b"POST %b HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % (path, size)


async def test_stalled_uploads_hold_at_most_the_budget_and_give_it_back() -> None:
    """Uploads that send all but one byte and stall hold their bytes in the one budget; past
    it a request is shed at its head (503 + Retry-After), a body over max_body_bytes is a 413;
    when the connections go, every byte held comes back."""
    body = 100 * KIB
    async with proxied(max_body_bytes=128 * KIB, max_buffered_bytes=256 * KIB) as (side, port):
        assert side.proxy is not None
        budget = side.proxy.budget
        budget.stall = 600.0  # no stalled upload gives way in this test
        stalled = []
        for _ in range(2):
            reader, writer = await connect(port)
            writer.write(upload_head(body) + b"x" * (body - 1))
            stalled.append((reader, writer))
        await until(lambda: budget.held == 2 * body)
        reader, writer = await connect(port)
        writer.write(upload_head(body))  # the third: nothing left for it
        status, headers, answer = await response(reader)
        assert status.startswith(b"HTTP/1.1 503") and headers["retry-after"] == "1"
        assert "buffered bytes" in json.loads(answer)["error"]["message"]
        writer.close()
        reader, writer = await connect(port)
        writer.write(upload_head(200 * KIB))
        status, _, _ = await response(reader)
        assert status.startswith(b"HTTP/1.1 413")
        writer.close()
        for _, w in stalled:
            w.close()
        await until(lambda: budget.held == 0)
        assert budget.peak <= 256 * KIB
        assert side.proxy.stats.shed["buffered_bytes"] == 1
        # room again: a whole upload goes through
        reader, writer = await connect(port)
        writer.write(upload_head(body) + b"x" * body)
        status, _, echoed = await response(reader)
        assert status.startswith(b"HTTP/1.1 200") and echoed.endswith(b"x" * body)
        writer.close()
        assert sum(side.faults.counts.values()) == 0


def endless(sent: list[int], aborted: asyncio.Event) -> Respond:
    """A stream that never ends (64 KiB events) until its client's connection is dropped."""
    event = b"data: " + b"x" * (64 * KIB) + b"\n\n"

    async def respond(request: bytes, writer: asyncio.StreamWriter) -> bool:
        if b" /stream " not in request:
            writer.write(ok(b""))
            return True
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        try:
            while True:
                writer.write(b"%x\r\n%b\r\n" % (len(event), event))
                await writer.drain()
                sent[0] += len(event)
        except ConnectionError:
            aborted.set()
        return False

    return respond


async def test_clients_that_stop_reading_are_cut_after_write_timeout_and_free_their_slot() -> None:
    sent, aborted = [0], asyncio.Event()
    async with proxied(endless(sent, aborted), max_in_flight=2, write_timeout=0.5) as (side, port):
        assert side.proxy is not None
        stuck = []
        for _ in range(2):
            reader, writer = await connect(port, receive_buffer=4 * KIB)
            writer.write(b"GET /stream HTTP/1.1\r\nHost: x\r\n\r\n")
            stuck.append((reader, writer))
        proxy = side.proxy
        await until(lambda: proxy.stats.in_flight == 2)
        # never read: both are cut, their upstream requests dropped, the slots free again
        await until(lambda: proxy.stats.timeouts["write"] == 2)
        await until(lambda: proxy.stats.in_flight == 0)
        await asyncio.wait_for(aborted.wait(), 10)
        assert sent[0] < 64 * 1024 * KIB  # back-pressure held the upstream meanwhile
        for _, w in stuck:
            w.close()
        reader, writer = await connect(port)
        writer.write(b"GET /plain HTTP/1.1\r\nHost: x\r\n\r\n")
        status, _, _ = await response(reader)
        assert status.startswith(b"HTTP/1.1 200")
        writer.close()


async def test_a_trickled_body_is_408_after_body_timeout() -> None:
    async with proxied(body_timeout=0.5, idle_timeout=60) as (side, port):
        assert side.proxy is not None
        reader, writer = await connect(port)
        writer.write(upload_head(100))
        started = asyncio.get_running_loop().time()

        async def trickle() -> None:
            for _ in range(100):  # one byte every 0.1 s: never idle, never done in time
                await asyncio.sleep(0.1)
                writer.write(b"x")

        dripping = asyncio.create_task(trickle())
        status, headers, body = await response(reader)
        dripping.cancel()
        assert status.startswith(b"HTTP/1.1 408") and headers["connection"] == "close"
        assert b"request body not received in time" in body
        assert asyncio.get_running_loop().time() - started < 5
        assert side.proxy.stats.timeouts["body"] == 1 and side.proxy.budget.held == 0
        writer.close()


async def test_trailer_fields_never_reach_the_upstream_as_headers() -> None:
    async with proxied() as (_, port):
        reader, writer = await connect(port)
        writer.write(
            b"POST /v1/models HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"2\r\n{}\r\n0\r\nAuthorization: Bearer stolen\r\nX-Route: voice\r\n\r\n"
        )
        status, _, echoed = await response(reader)
        writer.close()
    assert status.startswith(b"HTTP/1.1 200")
    head = echoed.partition(b"\r\n\r\n")[0].lower()
    assert b"authorization" not in head and b"x-route" not in head
    assert echoed.endswith(b"\r\n\r\n{}")


async def test_only_chunked_is_taken_as_a_transfer_coding() -> None:
    async with proxied() as (_, port):
        reader, writer = await connect(port)
        writer.write(
            b"POST /v1/models HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n"
            b"2\r\n{}\r\n0\r\n\r\n"
        )
        status, headers, _ = await response(reader)
        writer.close()
    assert status.startswith(b"HTTP/1.1 501") and headers["connection"] == "close"


async def test_both_parser_paths_refuse_more_than_128_header_fields() -> None:
    """The quick path (an OpenAI client's shape) and llhttp's (chunked) keep the same limit."""
    fields = b"".join(b"X-%d: v\r\n" % i for i in range(300))
    async with proxied() as (_, port):
        for extra in (b"", b"Transfer-Encoding: chunked\r\n"):
            reader, writer = await connect(port)
            writer.write(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n" + extra + fields + b"\r\n")
            status, _, body = await response(reader)
            writer.close()
            assert status.startswith(b"HTTP/1.1 400") and b"too many headers" in body


async def test_tls_and_binary_bytes_get_400_at_once() -> None:
    hello = bytes.fromhex("16030100f4010000f00303") + bytes(range(32))  # a TLS ClientHello
    async with proxied(header_timeout=30) as (side, port):
        assert side.proxy is not None
        for junk in (hello, b"\x00\x01\x02binary"):
            reader, writer = await connect(port)
            writer.write(junk)
            started = asyncio.get_running_loop().time()
            status, _, _ = await response(reader)
            writer.close()
            assert status.startswith(b"HTTP/1.1 400")
            assert asyncio.get_running_loop().time() - started < 5  # not the head's 30 s
        assert side.proxy.stats.timeouts["head"] == 0


async def test_headers_named_in_connection_are_not_forwarded_either_way() -> None:
    async def upstream(request: bytes, writer: asyncio.StreamWriter) -> bool:
        if b"/metrics" in request:
            writer.write(ok(b""))
            return True
        writer.write(
            b"HTTP/1.1 200 OK\r\nConnection: X-Hop\r\nX-Hop: upstream-only\r\n"
            b"Content-Length: %d\r\n\r\n%b" % (len(request), request)
        )
        return True

    async with proxied(upstream) as (_, port):
        reader, writer = await connect(port)
        writer.write(
            b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: keep-alive, X-Secret\r\n"
            b"X-Secret: client-only\r\nX-Kept: yes\r\n\r\n"
        )
        status, headers, echoed = await response(reader)
        writer.close()
    assert status.startswith(b"HTTP/1.1 200")
    assert b"x-secret" not in echoed.lower() and b"X-Kept: yes" in echoed
    assert "x-hop" not in headers


async def test_the_exact_path_prefix_maps_to_the_root_and_keeps_its_query() -> None:
    async with proxied() as (_, port):
        targets = []
        for sent in (b"/agent", b"/agent?x=1", b"/agent/v1/models?y=2"):
            reader, writer = await connect(port)
            writer.write(b"GET %b HTTP/1.1\r\nHost: x\r\n\r\n" % sent)
            _, _, echoed = await response(reader)
            writer.close()
            targets.append(echoed.split(b" ", 2)[1])
    assert targets == [b"/", b"/?x=1", b"/v1/models?y=2"]


async def test_bodies_routing_cannot_read_are_relayed_untouched_and_counted() -> None:
    """Deep nesting, UTF-16, invalid JSON: the bytes the client sent reach the upstream as
    they are (no splice), counted by reason; no internal error moves."""
    bodies = {
        "too_deep": b'{"stream": true, "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
        "not_utf8": json.dumps({"stream": True, "messages": []}).encode("utf-16"),
        "invalid_json": b'{"stream": true,',
        "not_an_object": b"[1, 2]",
    }
    async with proxied() as (side, port):
        assert side.proxy is not None
        for reason, body in bodies.items():
            reader, writer = await connect(port)
            writer.write(upload_head(len(body)) + body)
            status, _, echoed = await response(reader)
            writer.close()
            assert status.startswith(b"HTTP/1.1 200"), reason
            assert echoed.endswith(b"\r\n\r\n" + body), reason
        assert side.proxy.stats.unreadable == dict.fromkeys(bodies, 1)
        assert sum(side.faults.counts.values()) == 0


async def _timed_requests(port: int, n: int) -> list[tuple[bytes, float]]:
    """n small completions, one after the other, each on a new connection: (status, seconds)."""
    out = []
    body = b'{"model":"m","messages":[{"role":"user","content":"hi"}]}'
    for _ in range(n):
        started = asyncio.get_running_loop().time()
        reader, writer = await connect(port)
        writer.write(upload_head(len(body)) + body)
        status, _, _ = await response(reader)
        writer.close()
        out.append((status, asyncio.get_running_loop().time() - started))
    return out


async def test_stalled_max_size_uploaders_deny_no_one_else() -> None:
    """N connections declare max_body_bytes bodies and stall (N = 4, and max_connections / 2):
    their holds may fill what large uploads may take, never the reserve that ordinary requests
    get, so every small completion from another client is answered, about as fast as idle.
    (Before: four such uploads held the whole 64 MiB and every other request got 503.)"""
    mib = 1 << 20
    async with proxied(max_connections=64) as (side, port):
        assert side.proxy is not None
        idle = await _timed_requests(port, 10)
        for n in (4, 32):  # 32 = max_connections / 2
            stalled = []
            for _ in range(n):
                reader, writer = await connect(port)
                writer.write(upload_head(16 * mib) + b"x" * KIB)
                stalled.append((reader, writer))
            await until(lambda: side.proxy is not None and side.proxy.budget.held >= 48 * mib)
            busy = await _timed_requests(port, 10)
            for _, writer in stalled:
                writer.close()
            await until(lambda: side.proxy is not None and side.proxy.budget.held == 0)
            assert [s for s, _ in busy if not s.startswith(b"HTTP/1.1 200")] == [], n
            p50 = sorted(t for _, t in busy)[5]
            assert p50 <= 2 * max(sorted(t for _, t in idle)[5], 0.005), (n, p50, idle)


async def test_under_pressure_a_stalled_upload_gives_its_hold_back() -> None:
    """Uploads that stop sending hold bytes only until someone needs them: past the budget, the
    upload stalled longest gets a 408 and its hold goes to the new request."""
    body = 100 * KIB
    async with proxied(max_body_bytes=128 * KIB, max_buffered_bytes=256 * KIB) as (side, port):
        assert side.proxy is not None
        budget = side.proxy.budget
        budget.stall = 0.2
        stalled = []
        for _ in range(2):  # one after the other: the first is the one stalled longest
            reader, writer = await connect(port)
            writer.write(upload_head(body) + b"x" * KIB)
            stalled.append((reader, writer))
            await until(lambda: budget.held == len(stalled) * body)
        await until(lambda: all(u.stalled_for() >= 0.2 for u in budget.uploads))
        reader, writer = await connect(port)
        writer.write(upload_head(body) + b"y" * body)
        status, _, answer = await response(reader)
        assert status.startswith(b"HTTP/1.1 200"), (status, answer)
        cut = [await response(r) for r, _ in stalled[:1]]
        assert cut[0][0].startswith(b"HTTP/1.1 408")
        assert side.proxy.stats.timeouts["stalled_body"] == 1
        for _, w in stalled:
            w.close()
        writer.close()
