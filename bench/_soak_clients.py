"""The soak's clients and how each request ended, as the client saw it.

Every request gets one outcome, and each outcome has the proxy counter that must have counted
it (`COUNTER`): a request is answered whole, refused with a status (a 503 past a limit, or the
408 of a connection the proxy closed as it came), or failed by the upstream; "lost" (no status
line, or a 200 cut while the engine was up) has no counter and fails the soak. The raw
clients (bursts, slow readers, churners) send `Connection: close` and read to EOF, then judge
the bytes; a reset is judged on what arrived before it.
"""

from __future__ import annotations

import asyncio
import json
import random
import socket
from dataclasses import dataclass, field

MODEL = "sim-27b"
# outcome -> the proxy's counter that counts it: (family, label, value)
COUNTER = {
    "whole": ("specdec_route_requests_total", "status", "200"),
    "hung_up": ("specdec_route_requests_total", "status", "499"),
    "upstream_502": ("specdec_route_requests_total", "status", "502"),
    "upstream_504": ("specdec_route_requests_total", "status", "504"),
    "refused_connections": ("specdec_proxy_shed_requests_total", "limit", "connections"),
    "refused_in_flight": ("specdec_proxy_shed_requests_total", "limit", "in_flight"),
    "closed_silent": ("specdec_proxy_shed_requests_total", "limit", "connections_silent_closed"),
    "closed_idle": ("specdec_proxy_crossed_close_requests_total", "", ""),  # at least: UNSEEN
    "closed_slow_head": ("specdec_proxy_shed_requests_total", "limit", "connections_slow_head"),
    "timeout_head": ("specdec_proxy_client_timeouts_total", "phase", "head"),
}
# The one outcome the proxy cannot always count: a client may read the 408 of a keep-alive
# connection the proxy closed between requests after the proxy's socket is gone (aiohttp keeps
# bytes that come on an idle pooled connection, stops reading it, and reuses it later: the 408
# is its next request's answer), so its request reaches no socket of the proxy. Such an outcome
# is bounded instead: at least the requests the proxy saw cross its close, at most the 408s it
# wrote to keep-alive connections it closed to make room.
UNSEEN = {
    "closed_idle": ("specdec_proxy_shed_requests_total", "limit", "connections_idle_closed"),
}
ANSWERS = {  # (status, a word of its message) -> its outcome
    (503, "client connections"): "refused_connections",
    (503, "requests in flight"): "refused_in_flight",
    (408, "new connection"): "closed_silent",
    (408, "idle keep-alive"): "closed_idle",
    (408, "too slowly"): "closed_slow_head",
    (408, "not received in time"): "timeout_head",
}


@dataclass
class Tally:
    """Outcomes as the clients saw them: of requests, and of connections that sent none."""

    requests: dict[str, int] = field(default_factory=dict)
    silent: dict[str, int] = field(default_factory=dict)  # the churners' connections
    examples: list[str] = field(default_factory=list)
    ttft: dict[str, list[float]] = field(default_factory=lambda: {"proxy": [], "direct": []})

    def count(self, outcome: str, *, request: bool = True, example: str = "") -> None:
        into = self.requests if request else self.silent
        into[outcome] = into.get(outcome, 0) + 1
        if outcome not in COUNTER and len(self.examples) < 10:
            self.examples.append(f"{outcome}: {example}"[:300])

    def refused(self) -> int:
        """Requests answered with a status that says they were not served."""
        served = ("whole", "hung_up", "upstream_502", "upstream_504")
        return sum(n for o, n in self.requests.items() if o in COUNTER and o not in served)

    def lost(self) -> int:
        return sum(n for outcome, n in self.requests.items() if outcome not in COUNTER)


def body(rng: random.Random, stream: bool, tokens: tuple[int, int] = (16, 96)) -> bytes:
    """A chat request of a random length in `tokens`; a long one (over 100 tokens) runs to
    its max_tokens (`ignore_eos`), so a client that hangs up early finds it under way."""
    words = " ".join(rng.choice(("alpha", "beta", "gamma", "delta")) for _ in range(8))
    return json.dumps(
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": words}],
            "max_tokens": rng.randrange(*tokens),
            "ignore_eos": tokens[0] > 100,
            "stream": stream,
        }
    ).encode()


def request(payload: bytes, route: str = "voice") -> bytes:
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: soak\r\nX-Route: %b\r\n"
        b"Content-Type: application/json\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%b"
        % (route.encode(), len(payload), payload)
    )


def refusal(status: int, text: bytes) -> str:
    """The outcome of a whole answer other than a 200, by its status and vLLM-shaped message."""
    if status in (502, 504):
        return f"upstream_{status}"
    try:
        message = json.loads(text)["error"]["message"]
    except (ValueError, KeyError, TypeError):
        message = ""
    found = (o for (s, word), o in ANSWERS.items() if s == status and word in message)
    return next(found, f"status_{status}")


def judge(raw: bytes, stream: bool) -> str:
    """One response read to EOF (or to a reset): its outcome; "cut" when a 200 is not whole."""
    head, sep, rest = raw.partition(b"\r\n\r\n")
    if not sep or not head.startswith(b"HTTP/1.1 "):
        return "lost"
    status = int(head.split(b" ", 2)[1])
    fields = {
        k.strip().lower(): v.strip()
        for k, _, v in (line.partition(b":") for line in head.split(b"\r\n")[1:])
    }
    if b"chunked" in fields.get(b"transfer-encoding", b""):
        whole = rest.endswith(b"0\r\n\r\n")
    else:
        whole = len(rest) == int(fields.get(b"content-length", b"-1"))
    if status != 200:
        return refusal(status, rest) if whole else "cut"
    if not whole:
        return "cut"
    return "whole" if (b"data: [DONE]" in rest if stream else b'"usage"' in rest) else "cut"


async def exchange(port: int, data: bytes, stream: bool, slow: float = 0.0) -> str:
    """`data` sent on a new connection at once, the answer read to EOF: its outcome.
    `slow`: seconds between reads of 512 bytes, with a small receive buffer (a slow reader)."""
    loop = asyncio.get_running_loop()
    sock = socket.socket()
    sock.setblocking(False)
    if slow:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    got = bytearray()
    try:
        await asyncio.wait_for(loop.sock_connect(sock, ("127.0.0.1", port)), 30)
        await loop.sock_sendall(sock, data)
        while chunk := await asyncio.wait_for(loop.sock_recv(sock, 512 if slow else 65536), 60):
            got += chunk
            if slow:
                await asyncio.sleep(slow)
    except (OSError, TimeoutError):
        pass  # judged on what came before the reset or the timeout
    finally:
        sock.close()
    return judge(bytes(got), stream)


async def silent(port: int) -> str:
    """A connection that sends nothing and reads to EOF: the 503 or 408 it is answered."""
    return await exchange(port, b"", stream=False)
