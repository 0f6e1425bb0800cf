"""No request is lost at max_connections. 1.5 x max_connections clients, each a thread with a
blocking socket, are released by one barrier: they connect at the same moment and send a whole
request at once. Every one of them gets a whole response: the streamed (or plain) completion, or
a whole 503 with Retry-After and Connection: close; never a reset or an EOF after its request
was sent (a client cannot know whether a cut POST ran, so it may not retry it). Twenty rounds,
on both event loops; and again with keep-alive clients idle in the slots, which are closed
cleanly (a FIN, never a reset) and whose next request on a new connection succeeds."""

from __future__ import annotations

import asyncio
import http.client
import json
import socket
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest

from harness.rig import sidecar, simulator

SLOTS = 8
BURST = SLOTS * 3 // 2
ROUNDS = 20
KEPT = SLOTS // 2  # keep-alive clients idle in the slots when the burst comes


def request(stream: bool, close: bool = True) -> bytes:
    body = json.dumps(
        {
            "model": "sim-27b",
            "max_tokens": 12,
            "stream": stream,
            "messages": [{"role": "user", "content": "こんにちは"}],
        }
    ).encode()
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Route: voice\r\n"
        b"Content-Type: application/json\r\n"
    )
    if close:
        head += b"Connection: close\r\n"
    return head + b"Content-Length: %d\r\n\r\n%b" % (len(body), body)


def answer(sock: socket.socket, stream: bool) -> str:
    """What the client saw: "whole" (a 200 with the whole body), "503" (a whole 503 that
    says when to come back and closes), or how it was cut."""
    response = http.client.HTTPResponse(sock)
    try:
        response.begin()
        body = response.read()
    except (OSError, http.client.HTTPException) as exc:
        return f"cut: {type(exc).__name__}"
    if response.status == 200:
        done = body.endswith(b"data: [DONE]\n\n") if stream else b'"usage"' in body
        return "whole" if done else "cut: incomplete body"
    if response.status == 503:
        retry = response.getheader("Retry-After") == "1"
        closes = (response.getheader("Connection") or "").lower() == "close"
        whole = json.loads(body)["error"]["code"] == 503
        return "503" if retry and closes and whole else "cut: a 503 without its fields"
    return f"status {response.status}"


def burst(port: int, stream: bool, barrier: threading.Barrier) -> str:
    barrier.wait()
    try:
        sock = socket.create_connection(("127.0.0.1", port))
    except OSError as exc:  # never expected: the backlog holds a burst
        return f"connect: {exc}"
    with sock:
        sock.settimeout(30)
        try:
            sock.sendall(request(stream))
        except OSError as exc:
            return f"cut: {type(exc).__name__} while sending"
        return answer(sock, stream)


class Kept:
    """A keep-alive client: one request answered, then idle on its connection."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.settimeout(30)
        self.sock.sendall(request(stream=False, close=False))
        assert answer(self.sock, stream=False) == "whole"

    def closed_cleanly(self) -> bool | None:
        """True: the proxy closed it (a 408 that says so, then a FIN); False: still open;
        None: reset, or bytes that are not that 408."""
        self.sock.setblocking(False)
        try:
            got = self.sock.recv(65536)
        except BlockingIOError:
            return False
        except ConnectionResetError:
            return None
        finally:
            self.sock.settimeout(30)
        if got:  # the 408 came: the FIN follows it
            got += b"".join(iter(lambda: self.sock.recv(65536), b""))
            return idle_closed(got) or None
        return True

    def next_request(self) -> str:
        """On a new connection if the proxy closed this one, else on this one."""
        closed = self.closed_cleanly()
        if closed is None:
            return "reset"
        if closed:
            self.sock.close()
            self.sock = socket.create_connection(("127.0.0.1", self.port))
            self.sock.settimeout(30)
        self.sock.sendall(request(stream=False, close=False))
        return answer(self.sock, stream=False)


def idle_closed(got: bytes) -> bool:
    """A whole 408 that closes an idle keep-alive connection."""
    head, _, body = got.partition(b"\r\n\r\n")
    return (
        head.startswith(b"HTTP/1.1 408 ")
        and b"\r\nConnection: close" in head
        and "idle keep-alive" in json.loads(body)["error"]["message"]
    )


async def rounds(port: int, stream: bool, kept: int) -> tuple[Counter[str], list[str]]:
    loop = asyncio.get_running_loop()
    seen: Counter[str] = Counter()
    keep_alive: list[str] = []
    with ThreadPoolExecutor(BURST + kept) as threads:
        for _ in range(ROUNDS):
            clients = [
                await loop.run_in_executor(threads, Kept, port) for _ in range(kept)
            ]  # their requests answered: between requests in their slots
            barrier = threading.Barrier(BURST)
            got = await asyncio.gather(
                *(loop.run_in_executor(threads, burst, port, stream, barrier) for _ in range(BURST))
            )
            assert got.count("whole") >= SLOTS - kept, got
            seen.update(got)
            for client in clients:
                keep_alive.append(await loop.run_in_executor(threads, client.next_request))
                client.sock.close()
    return seen, keep_alive


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "plain"])
async def test_a_burst_at_max_connections_loses_no_request(stream: bool) -> None:
    async with simulator() as (_, upstream), sidecar(upstream, max_connections=SLOTS) as rig:
        side, proxy, _ = rig
        seen, _ = await rounds(int(proxy.rsplit(":", 1)[1]), stream, kept=0)
        assert side.proxy is not None
        shed = side.proxy.stats.shed
    assert set(seen) <= {"whole", "503"}, seen
    assert seen["whole"] >= SLOTS * ROUNDS and seen["503"] == shed["connections"], (seen, shed)


async def test_keep_alive_clients_in_the_slots_are_closed_cleanly_and_come_back() -> None:
    async with simulator() as (_, upstream), sidecar(upstream, max_connections=SLOTS) as rig:
        side, proxy, _ = rig
        seen, keep_alive = await rounds(int(proxy.rsplit(":", 1)[1]), True, kept=KEPT)
        assert side.proxy is not None
        shed = side.proxy.stats.shed
    assert set(seen) <= {"whole", "503"}, seen
    assert keep_alive == ["whole"] * (KEPT * ROUNDS), Counter(keep_alive)
    assert shed["connections_idle_closed"] >= ROUNDS, shed  # the kept ones made room


async def test_a_request_that_crosses_the_close_of_its_keep_alive_connection_reads_a_408() -> None:
    """The race no server can close: a keep-alive client sends its next request just as the
    proxy closes the connection to make room. The proxy wrote a 408 before its FIN (RFC 9110
    §15.5.9), so the client reads a whole answer that says the request was not served (the
    lingering close drops it unread, never forwarded), never a bare EOF or a reset."""
    async with simulator() as (_, upstream), sidecar(upstream, max_connections=1) as rig:
        side, proxy, _ = rig
        port = int(proxy.rsplit(":", 1)[1])
        loop = asyncio.get_running_loop()
        with ThreadPoolExecutor(2) as threads:
            kept = await loop.run_in_executor(threads, Kept, port)
            address = ("127.0.0.1", port)
            newcomer = await loop.run_in_executor(threads, socket.create_connection, address)
            assert side.proxy is not None
            while side.proxy.stats.shed["connections_idle_closed"] < 1:
                await asyncio.sleep(0.01)  # the kept one made way for the newcomer
            kept.sock.sendall(request(stream=False, close=False))  # crossing the close
            got = await loop.run_in_executor(threads, kept.sock.recv, 65536)
            got += await loop.run_in_executor(threads, kept.sock.recv, 65536)  # the FIN: b""
            assert idle_closed(got), got
            while side.proxy.stats.crossed_close < 1:
                await asyncio.sleep(0.01)  # counted when its bytes reach the lingering close
            newcomer.sendall(request(stream=False))
            assert await loop.run_in_executor(threads, answer, newcomer, False) == "whole"
            kept.sock.close()
            newcomer.close()
        assert side.proxy.stats.shed["connections"] == 0
        assert sum(side.proxy.accounting.requests.values()) == 2  # the crossing one: never sent
