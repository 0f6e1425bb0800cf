"""No peer hoards the connection slots. A hostile peer on another loopback address (127.0.0.2)
holds every one of max_connections, idle or trickling a request head a byte a second, and takes
each slot back as soon as it loses it; other clients' small completions are still all served,
about as fast as on an idle proxy: the address holding the most slots gives one to a newcomer
from an address holding fewer (a new connection that sent nothing gets a 503, a head a 408),
and its own reconnects are the ones refused. A keep-alive client closed between requests to
make room sends its next request on a new connection."""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import time
from collections.abc import Awaitable, Callable

import pytest

from harness.rig import JA, sidecar, simulator

SLOTS = 16
REQUESTS = 20
ROUNDS = 3  # of REQUESTS while the slots are hoarded
HOSTILE = "127.0.0.2"
BODY = b'{"model": "sim-27b", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}'
REQUEST = (
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Route: voice\r\n"
    b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%b" % (len(BODY), BODY)
)
assert JA  # the rig's prompts: here one short one


async def completion(host: str, port: int) -> tuple[bytes, float]:
    """One small completion on a new connection from 127.0.0.1: its status line and seconds."""
    started = time.monotonic()
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(REQUEST.replace(b"HTTP/1.1\r\n", b"HTTP/1.1\r\nConnection: close\r\n", 1))
        answer = await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()
    return answer.split(b"\r\n", 1)[0], time.monotonic() - started


async def hoard(host: str, port: int, behave: Callable[[asyncio.StreamWriter], Awaitable[None]],
                stop: asyncio.Event) -> None:  # fmt: skip
    """One hostile slot from 127.0.0.2: connect, `behave`, and when the proxy closes it,
    connect again at once, until `stop`."""
    while not stop.is_set():
        try:
            reader, writer = await asyncio.open_connection(host, port, local_addr=(HOSTILE, 0))
        except OSError:
            await asyncio.sleep(0.01)
            continue
        try:
            behaving = asyncio.create_task(behave(writer))
            closed = asyncio.create_task(reader.read())  # EOF or a 408, then EOF
            await asyncio.wait({closed, asyncio.create_task(stop.wait())},
                               return_when=asyncio.FIRST_COMPLETED)  # fmt: skip
            behaving.cancel()
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()


async def nothing(writer: asyncio.StreamWriter) -> None:
    await asyncio.Event().wait()


async def trickle(writer: asyncio.StreamWriter) -> None:
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\n")
    for byte in b"X-Slow: " + b"a" * 600:
        await asyncio.sleep(1.0)
        writer.write(bytes([byte]))


async def latencies(host: str, port: int) -> tuple[list[bytes], float]:
    found = [await completion(host, port) for _ in range(REQUESTS)]
    return [status for status, _ in found], statistics.median(t for _, t in found)


@pytest.mark.parametrize("behave", [nothing, trickle], ids=["idle", "trickled-heads"])
async def test_a_peer_holding_every_slot_denies_nobody(
    behave: Callable[[asyncio.StreamWriter], Awaitable[None]],
) -> None:
    async with simulator() as (_, upstream), sidecar(upstream, max_connections=SLOTS) as rig:
        side, proxy, _ = rig
        host, port = proxy.removeprefix("http://").split(":")
        await latencies(host, int(port))  # warm: the first connections cost more
        calm_statuses, calm = await latencies(host, int(port))
        stop = asyncio.Event()
        peers = [asyncio.create_task(hoard(host, int(port), behave, stop)) for _ in range(SLOTS)]
        try:
            while side.proxy is not None and side.proxy.client_connections < SLOTS:
                await asyncio.sleep(0.01)  # every slot taken
            if behave is trickle:  # heads below the rate for over a second
                started = time.monotonic()
                while time.monotonic() - started < 1.5:
                    await asyncio.sleep(0.1)
            # up to ROUNDS rounds while the hoarder holds on, the fastest median kept: a CI
            # host's other worker only ever adds time (seen once: 5.5 ms against 0.9 idle),
            # and a proxy that denied service would be slow in every round
            rounds = []
            for _ in range(ROUNDS):
                rounds.append(await latencies(host, int(port)))
                if rounds[-1][1] <= 2 * calm + 0.002:
                    break
        finally:
            stop.set()
            await asyncio.gather(*peers, return_exceptions=True)
        assert side.proxy is not None
        shed = dict(side.proxy.stats.shed)
    for statuses, _ in rounds:
        assert calm_statuses == statuses == [b"HTTP/1.1 200 OK"] * REQUESTS, statuses
    busy = min(median for _, median in rounds)
    print(f"{behave.__name__}: p50 {busy * 1000:.1f} ms, idle proxy {calm * 1000:.1f} ms")
    # the hoarder's 16 tasks reconnect in this process's loop, the proxy's: on uvloop, where
    # a completion takes under a millisecond, their churn alone is about that much again
    assert busy <= 2 * calm + 0.002, (busy, calm)
    # the hoarder gave its slots to the other address (a 503 or a 408 to it), and its own
    # reconnects were the ones refused: the other's 20 were all served
    reason = "connections_silent_closed" if behave is nothing else "connections_slow_head"
    assert shed[reason] >= 1, shed


async def test_a_keep_alive_client_between_requests_is_closed_cleanly_and_comes_back() -> None:
    async with simulator() as (_, upstream), sidecar(upstream, max_connections=2) as rig:
        side, proxy, _ = rig
        host, port = proxy.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(REQUEST)
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200")
        length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length")))  # fmt: skip
        await reader.readexactly(length)  # now keep-alive, between requests
        other = await asyncio.open_connection(host, int(port))  # the second slot, newer
        newcomer = await asyncio.open_connection(host, int(port))  # past the limit
        closed = await asyncio.wait_for(reader.read(), 5)  # a 408 that says so, then EOF
        assert closed.startswith(b"HTTP/1.1 408") and b"idle keep-alive" in closed
        writer.close()
        newcomer[1].write(REQUEST)
        assert (await newcomer[0].readuntil(b"\r\n")).startswith(b"HTTP/1.1 200")
        # its next request, on a new connection: `other` has sent nothing, the newcomer is
        # between requests; either may make way (not in the grace a new connection has)
        status, _ = await completion(host, int(port))
        assert status == b"HTTP/1.1 200 OK"
        for _, w in (other, newcomer):
            w.close()
        assert side.proxy is not None and side.proxy.stats.shed["connections_idle_closed"] >= 1
