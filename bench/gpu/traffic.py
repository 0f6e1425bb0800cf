"""The bench's two routes and their closed-loop traffic.

Both routes share one speculative llama-server; each request carries its route's synthetic
per-position acceptance (`speculative.synth_rates`, the bench's patch to the server) and, in
the draft-length sweep, its draft length (`speculative.n_max`). Through the proxy a header
names the route; the plain server gets the same requests. `ignore_eos`: random weights would
end requests at random lengths.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import aiohttp

from bench.gpu.rounds import Rate
from exporter.engines.llamacpp import ENGINE
from exporter.measure import workload
from exporter.measure.scenarios import builtin
from exporter.measure.stream_client import RequestFailed
from exporter.measure.workload import SPREAD, Workload

MODEL = "bench"


@dataclass(frozen=True)
class Route(Workload):
    """A workload with its acceptance (unconditional per position: P(more than i drafts
    accepted), as llama.cpp's --spec-synth-rates reads them)."""

    rates: tuple[float, ...] = ()

    @property
    def acceptance(self) -> float:
        """Accepted / drafted tokens at k = 3 (the deployed draft length)."""
        return sum(self.rates[:3]) / 3

    def body(self, index: int, k: int | None) -> dict[str, Any]:
        """Request `index` of the route (its prompts in turn)."""
        found: dict[str, Any] = {
            "model": MODEL,
            "messages": builtin(self.scenario).messages(index),
            "max_tokens": self.tokens(index),
            "ignore_eos": True,
            # no prompt-cache reuse: a request whose prompt a slot holds whole takes llama-server's
            # "need to evaluate at least 1 token" path, which stalled the plain server for
            # seconds (its A/B rates at c = 16 fell 3-5x) and once hung it (docs/BENCHMARKS.md §11)
            "cache_prompt": False,
            "speculative.synth_rates": list(self.rates),
            "timings_per_token": True,  # the tokens each event brings (`_Stream`)
        }
        if k is not None:
            found["speculative.n_max"] = k
        return found


def spread(routes: Sequence[Route], sigma: float) -> tuple[Route, ...]:
    """The routes with per-request lengths of that spread (0: every request at the mean)."""
    return tuple(replace(r, spread=sigma) for r in routes)


def add_spread_flag(ap: argparse.ArgumentParser) -> None:
    """--length-spread, one flag for every script that sends the routes."""
    ap.add_argument("--length-spread", type=float, default=SPREAD,
                    help="sigma of ln(tokens) (0: every request at the mean)")  # fmt: skip


def spread_error(args: argparse.Namespace) -> str | None:
    """What is wrong with --length-spread, if anything (0..2: past 2 the cut takes most)."""
    sigma = args.length_spread
    return None if 0 <= sigma <= 2 else f"--length-spread takes 0..2, got {sigma}"


# the published workloads (36 % and 71 % acceptance at k = 3); positions 4-5 for the sweep
VOICE = Route(**asdict(workload.VOICE), rates=(0.60, 0.30, 0.18, 0.10, 0.06))
AGENT = Route(**asdict(workload.AGENT), rates=(0.85, 0.70, 0.58, 0.48, 0.40))
ROUTES = (VOICE, AGENT)


def assignment(routes: Sequence[Route], concurrency: int) -> list[list[Route]]:
    """Per client, the routes it sends in turn: one client alternates them; otherwise the
    clients are split between the routes (half each for two)."""
    if concurrency == 1:
        return [list(routes)]
    return [[routes[w % len(routes)]] for w in range(concurrency)]


async def phase(
    base_url: str,
    routes: Sequence[Route],
    concurrency: int,
    seconds: float,
    k: int | None = None,
    proxied: bool = False,
    timeline: list[Span] | None = None,
) -> tuple[dict[str, Rate], int]:
    """Closed-loop clients for `seconds`; per route the decode tokens (after each request's
    first) and their seconds inside the phase, and how many requests failed. Requests still
    in flight at its end are cancelled and count with what they decoded so far (each event
    states the tokens so far): without them a phase shorter than a request at that load
    would have no figure, and one only a little longer would count only the cohort that
    started together. `timeline`, where given, gets every request's `Span`."""
    found = {r.name: Rate() for r in routes}
    failed = 0
    url = f"{base_url}/v1/chat/completions"
    start = time.perf_counter()

    def record(route: Route, worker: int, sent: float, seen: _Stream, finished: bool) -> None:
        seen.count_into(found[route.name], finished)
        if timeline is not None and seen.first is not None and seen.last is not None:
            times = (sent - start, seen.first - start, seen.last - start)
            timeline.append(Span(route.name, worker, *times, seen.decoded, finished))

    async def client(mine: list[Route], offset: int, session: aiohttp.ClientSession) -> None:
        nonlocal failed
        i = offset
        while True:
            route = mine[i % len(mine)]
            headers = {"X-Route": route.header} if proxied else None
            seen = _Stream()
            sent = time.perf_counter()
            try:
                body = {**route.body(i, k), **ENGINE.worker_fields(offset)}
                await _stream(session, url, body, headers, seen)
            except asyncio.CancelledError:
                record(route, offset, sent, seen, finished=False)
                raise
            except (RequestFailed, aiohttp.ClientError):
                failed += 1
                await asyncio.sleep(0.05)  # not a busy loop against a failing server
            else:
                record(route, offset, sent, seen, finished=True)
            i += 1

    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=120)
    # llama-server closes a connection after a stream: never reuse one
    connector = aiohttp.TCPConnector(force_close=True, limit=0)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        tasks = [
            asyncio.create_task(client(mine, w, session))
            for w, mine in enumerate(assignment(routes, concurrency))
        ]
        await asyncio.sleep(seconds)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return found, failed


@dataclass(frozen=True)
class Span:
    """One request of a phase, for `bench/gpu/split.py`: its route, its client (the slot it is
    pinned to), when it was sent and its first and last content events (seconds from the
    phase's start), and the tokens it decoded between those two events."""

    route: str
    worker: int
    sent: float
    first: float
    last: float
    decoded: int
    finished: bool


class _Stream:
    """One streamed request as it goes: its content events' times and the tokens generated by
    each (llama-server's running `timings.predicted_n`, asked per event with
    `timings_per_token`). Events are not tokens: a token that ends inside a UTF-8 character
    or that the chat parser holds back sends none, so counting events undercounted a route by
    19-26 %, and by a different share on the plain and the speculative server (§11)."""

    def __init__(self) -> None:
        self.first: float | None = None
        self.last: float | None = None
        self.first_n: int | None = None
        self.last_n: int | None = None
        self.events = 0

    def content(self, chunk: dict[str, Any]) -> None:
        now = time.perf_counter()
        self.first = now if self.first is None else self.first
        self.last = now
        self.events += 1
        timings = chunk.get("timings")
        n = timings.get("predicted_n") if isinstance(timings, dict) else None
        if type(n) is int:
            self.first_n = n if self.first_n is None else self.first_n
            self.last_n = n

    @property
    def decoded(self) -> int:
        """Tokens after the first content event's: by the server's count where it sent one."""
        if self.first_n is not None and self.last_n is not None:
            return self.last_n - self.first_n
        return self.events - 1

    def count_into(self, rate: Rate, finished: bool) -> None:
        """Its decode (tokens after the first event's, first event to last) into `rate`."""
        if self.first is None or self.last is None or self.last <= self.first:
            return
        if finished:
            rate.add(float(self.decoded), self.last - self.first)
        else:
            rate.add_partial(float(self.decoded), self.last - self.first)


async def _stream(
    session: aiohttp.ClientSession,
    url: str,
    body: dict[str, Any],
    headers: dict[str, str] | None,
    seen: _Stream,
) -> None:
    payload = {**body, "stream": True}
    async with session.post(url, json=payload, headers=headers) as resp:
        if resp.status != 200:
            raise RequestFailed(f"HTTP {resp.status}: {(await resp.text())[:200]}")
        async for raw in resp.content:
            if raw.startswith(b"data: {") and b'"content":"' in raw and b'"content":""' not in raw:
                seen.content(json.loads(raw[6:]))


async def idle(metrics_url: str, timeout: float = 30.0) -> None:
    """Wait until the server's batch gauge reads 0 (cancelled requests released)."""
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < deadline:
            try:
                async with session.get(metrics_url) as resp:
                    text = await resp.text()
            except aiohttp.ClientError:
                text = ""
            for line in text.splitlines():
                if line.startswith("llamacpp:requests_processing ") and float(line.split()[1]) == 0:
                    return
            await asyncio.sleep(0.1)
