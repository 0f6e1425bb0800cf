"""An upstream that sends what vLLM never would: names that cannot be encoded, per-request
objects that cannot be true, header bytes that would split the client's response, bytes on an
idle connection, CRLF-framed streams, bodies and events larger than the budget. The sidecar's
/metrics stays whole and bounded, counts stay exact or are refused, the client gets the bytes
as sent or a clean 502, and nothing of it is an internal error."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import subprocess
import threading
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp

from exporter.proxy.upstream import UpstreamPool
from exporter.sidecar import Sidecar
from harness.helpers import http_get, need_tool, until
from harness.rig import sidecar
from harness.scripted import Respond, ok, scripted
from harness.wire import connect, response
from tests.receiver import Gather

CHAT = b"/v1/chat/completions"
KIB = 1024


@asynccontextmanager
async def proxied(respond: Respond, **config: Any) -> AsyncIterator[tuple[Sidecar, str, str]]:
    async with scripted(respond) as (url, _), sidecar(url, **config) as (side, proxy, metrics):
        yield side, proxy, metrics


def answering(body: bytes | dict[str, Any], head: bytes = b"") -> Respond:
    """Every completion answered with `body` (JSON, Content-Length); /metrics empty."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()

    async def respond(request: bytes, writer: asyncio.StreamWriter) -> bool:
        if b"/metrics" in request:
            writer.write(ok(b""))
            return True
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n%bContent-Length: %d\r\n\r\n%b"
            % (head, len(data), data)
        )
        return True

    return respond


def completion(spec: dict[str, Any] | None, model: str = "sim-27b", tokens: int = 5) -> bytes:
    doc = {
        "id": "c1",
        "object": "chat.completion",
        "model": model,
        "choices": [{"index": 0, "message": {"content": "hi"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": tokens, "total_tokens": 3 + tokens},
        "metrics": {"speculative_decoding": spec},
    }
    return json.dumps(doc).encode()  # ensure_ascii: a lone surrogate travels as \ud800


async def post(proxy: str, body: dict[str, Any]) -> tuple[int, bytes]:
    async with aiohttp.ClientSession() as session:
        async with session.post(proxy + CHAT.decode(), json=body) as resp:
            return resp.status, await resp.read()


SPEC = {"num_spec_steps": 2, "num_draft_tokens": 6, "num_accepted_draft_tokens": 3,
        "acceptance_histogram": [0, 1, 1, 0]}  # fmt: skip


async def test_a_model_name_that_cannot_be_encoded_never_breaks_metrics() -> None:
    async with proxied(answering(completion(SPEC, model="evil\ud800"))) as (side, proxy, metrics):
        status, body = await post(proxy, {"messages": []})
        assert status == 200 and b"evil\\ud800" in body  # relayed as sent
        page = await asyncio.to_thread(http_get, metrics)  # a 500 would raise
        assert 'model_name="_other"' in page and "evil" not in page
        status, _ = await post(proxy, {"messages": []})
        await asyncio.to_thread(http_get, metrics)
        assert sum(side.faults.counts.values()) == 0


async def test_impossible_counts_are_refused_not_counted_as_exact() -> None:
    """3,001 histogram entries for a k = 3 model, 10^15 steps for a 5-token completion, more
    drafts than k per step: each is `implausible`, none reaches the exact counters or the
    position labels."""
    huge = 10**15
    objects = [
        {**SPEC, "num_spec_steps": 3000, "acceptance_histogram": [1] * 3000 + [0]},
        {"num_spec_steps": huge, "num_draft_tokens": 3 * huge, "num_accepted_draft_tokens": huge,
         "acceptance_histogram": [0, huge, 0, 0]},
        {**SPEC, "num_draft_tokens": 7},  # 2 steps of at most 3 drafts
    ]  # fmt: skip
    served = iter([*objects, SPEC])

    async def respond(request: bytes, writer: asyncio.StreamWriter) -> bool:
        if b"/metrics" in request:
            writer.write(ok(b""))
            return True
        return await answering(completion(next(served)))(request, writer)

    async with proxied(respond) as (side, proxy, metrics):
        for _ in range(4):
            assert (await post(proxy, {"messages": []}))[0] == 200
        assert side.proxy is not None
        accounting = side.proxy.accounting
        await until(lambda: sum(accounting.requests.values()) == 4)
        exact = accounting.exact[("other", "sim-27b")]
        assert (exact.drafts, exact.draft_tokens, exact.accepted) == (2, 6, 3)  # the true one
        assert accounting.without_exact[("other", "sim-27b", "implausible")] == 3
        page = await asyncio.to_thread(http_get, metrics)
        positions = {line.split('position="')[1].split('"')[0]
                     for line in page.splitlines() if 'position="' in line}  # fmt: skip
        assert positions <= {"0", "1", "2"}


async def test_upstream_header_bytes_are_relayed_as_received() -> None:
    respond = answering(b"{}", head=b"X-Name: caf\xe9\r\nX-Utf8: \xe2\x9c\x93\r\n")
    async with proxied(respond) as (_, proxy, _):
        reader, writer = await connect(int(proxy.rsplit(":", 1)[1]))
        writer.write(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        writer.close()
    assert b"X-Name: caf\xe9\r\n" in head and b"X-Utf8: \xe2\x9c\x93\r\n" in head


async def test_a_cr_or_lf_inside_an_upstream_header_is_a_counted_502() -> None:
    for evil in (b"X-Evil: a\nSet-Cookie: stolen=1\r\n", b"X-Evil: a\rb\r\n"):
        async with proxied(answering(b"{}", head=evil)) as (side, proxy, _):
            reader, writer = await connect(int(proxy.rsplit(":", 1)[1]))
            writer.write(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
            status, headers, _ = await response(reader)
            writer.close()
            assert status.startswith(b"HTTP/1.1 502") and "set-cookie" not in headers
            assert side.proxy is not None and side.proxy.stats.upstream_errors["malformed"] == 1


async def test_bytes_an_upstream_writes_on_an_idle_connection_reach_no_client() -> None:
    """Late bytes on a pooled connection would be read as the next request's response. The
    worst case: they land while the proxy's loop is busy, so no read has seen them when the
    next request is sent; the pool's check finds them and takes a fresh connection."""
    listener = socket.create_server(("127.0.0.1", 0))
    forge, forged = threading.Event(), threading.Event()

    def serve() -> None:
        for n in range(2):
            conn, _ = listener.accept()
            with conn:
                request = conn.recv(65536)
                conn.sendall(ok(request.split(b" ", 2)[1]))
                if n == 0:
                    forge.wait(10)
                    conn.sendall(ok(b"FORGED"))  # unasked, while the connection is pooled
                    forged.set()
                    with contextlib.suppress(ConnectionError):
                        assert not conn.recv(65536), "a request written after the forgery"

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    pool = UpstreamPool(f"http://127.0.0.1:{listener.getsockname()[1]}", 5, 5)
    first, second = Gather(), Gather()
    pool.send("GET", "/first", [], b"", first)
    assert (await first.response())[1] == b"/first"
    await until(lambda: pool.idle_connections == 1)
    forge.set()
    assert forged.wait(10)  # the loop is held: no read of the forged bytes yet
    time.sleep(0.05)  # loopback delivery; the loop is deliberately not run meanwhile
    pool.send("GET", "/second", [], b"", second)
    assert (await second.response())[1] == b"/second"
    pool.close()
    listener.close()
    thread.join(10)


def sse_upstream(ending: bytes, got_first: asyncio.Event) -> Respond:
    """Three events framed with `ending` (line end); the second is only sent once the
    client has the first: a proxy that holds events would deadlock (the test times out)."""

    async def respond(request: bytes, writer: asyncio.StreamWriter) -> bool:
        if b"/metrics" in request:
            writer.write(ok(b""))
            return True
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n")  # fmt: skip
        for i in range(3):
            event = b'data: {"choices":[{"delta":{"content":"%d"}}]}%b%b' % (i, ending, ending)
            writer.write(b"%x\r\n%b\r\n" % (len(event), event))
            await writer.drain()
            if i == 0:
                await asyncio.wait_for(got_first.wait(), 10)
        writer.write(b"0\r\n\r\n")
        return True

    return respond


async def test_crlf_and_cr_framed_events_are_relayed_as_they_arrive() -> None:
    for ending in (b"\r\n", b"\r", b"\n"):
        got_first = asyncio.Event()
        async with proxied(sse_upstream(ending, got_first)) as (_, proxy, _):
            async with aiohttp.ClientSession() as session:
                body = {"messages": [], "stream": True}
                async with session.post(proxy + CHAT.decode(), json=body) as resp:
                    first = await asyncio.wait_for(
                        resp.content.readexactly(45 + 2 * len(ending)), 10
                    )
                    got_first.set()
                    rest = await resp.read()
        assert first.startswith(b'data: {"choices":[{"delta":{"content":"0"}}]}')
        assert (first + rest).count(ending * 2) == 3, ending


async def test_a_response_larger_than_the_budget_is_relayed_unread() -> None:
    big = completion(SPEC)[:-1] + b', "pad": "' + b"x" * (300 * KIB) + b'"}'
    config = {"max_body_bytes": 128 * KIB, "max_buffered_bytes": 256 * KIB}
    async with proxied(answering(big), **config) as (side, proxy, _):
        status, body = await post(proxy, {"messages": []})
        assert status == 200 and body == big
        assert side.proxy is not None
        await until(lambda: sum(side.proxy.accounting.requests.values()) == 1)  # type: ignore[union-attr]
        assert side.proxy.accounting.without_exact[("other", "", "unread")] == 1
        assert side.proxy.budget.held == 0


async def test_an_event_larger_than_max_event_passes_whole_and_unobserved() -> None:
    event = b'data: {"x":"' + b"y" * (2 * 1024 * KIB) + b'"}\n\n'

    async def respond(request: bytes, writer: asyncio.StreamWriter) -> bool:
        if b"/metrics" in request:
            writer.write(ok(b""))
            return True
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for start in range(0, len(event), 64 * KIB):
            piece = event[start : start + 64 * KIB]
            writer.write(b"%x\r\n%b\r\n" % (len(piece), piece))
            await writer.drain()
        writer.write(b"5\r\ndone!\r\n0\r\n\r\n")
        return True

    async with proxied(respond) as (side, proxy, _):
        status, body = await post(proxy, {"messages": [], "stream": True})
        assert status == 200 and body == event + b"done!"
        assert side.proxy is not None and side.proxy.budget.held == 0
        assert sum(side.faults.counts.values()) == 0


async def test_garbled_usage_from_upstream_is_no_internal_error() -> None:
    odd = json.loads(completion(SPEC))
    odd["usage"] = {"completion_tokens": "five", "prompt_tokens": None}
    odd["model"] = ["not", "a", "name"]
    async with proxied(answering(odd)) as (side, proxy, _):
        assert (await post(proxy, {"messages": []}))[0] == 200
        assert side.proxy is not None
        await until(lambda: sum(side.proxy.accounting.requests.values()) == 1)  # type: ignore[union-attr]
        assert sum(side.faults.counts.values()) == 0


async def test_a_collector_that_cannot_render_costs_its_own_families_not_the_page() -> None:
    """Whatever slips past the label checks: the families of the collector that holds it are
    left out of that scrape (counted), every other family is served, promtool-clean."""
    async with proxied(answering(completion(SPEC))) as (side, proxy, metrics):
        assert (await post(proxy, {"messages": []}))[0] == 200
        assert side.proxy is not None
        side.proxy.accounting.requests[("other", "evil\ud800", "200", "stop")] += 1  # planted
        page = await asyncio.to_thread(http_get, metrics)
        result = await asyncio.to_thread(
            subprocess.run,
            [need_tool("promtool"), "check", "metrics"],
            input=page.encode(),
            capture_output=True,
        )
    assert result.returncode == 0 and not result.stdout.strip(), result
    assert "specdec_route_requests_total" not in page  # that collector's families: out
    assert "specdec_build_info" in page and "specdec_route_spec_requests_total" in page  # others
    assert 'specdec_proxy_internal_errors_total{stage="collector"}' in page
    assert side.faults.counts["collector"] >= 1


async def test_an_overflowing_chunk_size_cuts_the_response_and_nothing_after_it_passes() -> None:
    """A chunk-size line of 24 hex digits is no size: Python's int would read it as a huge
    chunk and relay what follows as stream data. The response is cut at once (its head was
    sent: the client sees the break), counted under its reason."""
    got_first = asyncio.Event()
    event = b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n'
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"

    async def respond(request: bytes, writer: asyncio.StreamWriter) -> bool:
        if b"/metrics" in request:
            writer.write(ok(b""))
            return True
        writer.write(head + b"\r\n%x\r\n%b\r\n" % (len(event), event))
        await writer.drain()
        await asyncio.wait_for(got_first.wait(), 10)
        writer.write(b'ffffffffffffffffffffffff\r\nSMUGGLED: data: {"evil":1}\n\n\r\n0\r\n\r\n')
        return False

    async with proxied(respond) as (side, proxy, _):
        reader, writer = await connect(int(proxy.rsplit(":", 1)[1]))
        body = b'{"model":"m","messages":[],"stream":true}'
        request = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
        writer.write(request + b"Content-Length: %d\r\n\r\n%b" % (len(body), body))
        got = await asyncio.wait_for(reader.readuntil(b'"content":"a"'), 10)
        got_first.set()
        with contextlib.suppress(ConnectionError):
            got += await asyncio.wait_for(reader.read(), 10)  # ends: cut, or reset
        writer.close()
        assert side.proxy is not None
        assert side.proxy.stats.framing_errors["chunk_size"] == 1
        assert side.proxy.stats.upstream_errors["malformed"] == 1
    assert b"SMUGGLED" not in got and b"evil" not in got
    assert not got.endswith(b"0\r\n\r\n")  # no clean end: the client sees the cut


async def test_an_unasked_protocol_switch_fails_only_its_own_request() -> None:
    """The proxy forwards no Upgrade, so a 101 is no answer any client asked for: that request
    gets a 502 and its connection is dropped; the next client's request is answered."""
    answered = 0

    async def respond(request: bytes, writer: asyncio.StreamWriter) -> bool:
        nonlocal answered
        if b"/metrics" in request:
            writer.write(ok(b""))
            return True
        answered += 1
        if answered == 1:
            writer.write(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                         b"Connection: Upgrade\r\n\r\n\x81\x05hello")  # fmt: skip
            await writer.drain()
            return True  # keeps the connection: the proxy must not reuse it
        writer.write(ok(b'{"ok":true}'))
        return True

    async with proxied(respond) as (side, proxy, _):
        first = await post(proxy, {"model": "m", "messages": []})
        second = await post(proxy, {"model": "m", "messages": []})
        assert side.proxy is not None and side.proxy.stats.framing_errors["unasked_switch"] == 1
    assert first[0] == 502
    assert second == (200, b'{"ok":true}')


async def test_every_spelling_of_an_accounted_endpoint_is_accounted() -> None:
    """vLLM's server decodes %XX before it routes, so these are chat completions there; the
    proxy routes and accounts them as the upstream reads them, and forwards the bytes as sent."""
    paths = [
        b"/v1/chat%2Fcompletions",
        b"/v1/%63hat/completions",
        b"/v1/chat/completion%73",
        b"/v1//chat/completions",
        b"/v1/./chat/completions",
        b"/v1/x/../chat/completions",
    ]
    seen: list[bytes] = []

    async def respond(request: bytes, writer: asyncio.StreamWriter) -> bool:
        if b"/metrics" in request:
            writer.write(ok(b""))
            return True
        seen.append(request.split(b" ", 2)[1])
        body = completion(SPEC)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%b" % (len(body), body))  # fmt: skip
        return True

    async with proxied(respond) as (side, proxy, _):
        port = int(proxy.rsplit(":", 1)[1])
        for path in paths:
            reader, writer = await connect(port)
            body = b'{"model":"m","messages":[]}'
            writer.write(b"POST %b HTTP/1.1\r\nHost: x\r\nX-Route: voice\r\n" % path
                         + b"Content-Length: %d\r\n\r\n%b" % (len(body), body))  # fmt: skip
            status, _, _ = await response(reader)
            writer.close()
            assert status.startswith(b"HTTP/1.1 200"), path
        acc = side.proxy.accounting if side.proxy is not None else None
        assert acc is not None
        await until(lambda: sum(acc.requests.values()) == len(paths))
    assert seen == paths  # forwarded as the client sent them
    assert sum(n for (route, _, status, _), n in acc.requests.items() if status == "200") == 6
    assert sum((c.drafts or 0) for c in acc.exact.values()) == 6 * SPEC["num_spec_steps"]
