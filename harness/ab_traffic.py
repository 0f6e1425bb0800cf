"""Closed-loop A/B traffic of the two routes (Japanese voice chat, a coding agent): the same
requests against a speculative endpoint (through the proxy, routed by header) and a plain one,
measured as the clients see them, and the same routes as `specdec measure`'s scenarios, its
curve as the config takes it. Used by tests/integration/test_payoff_at_load.py,
test_curve_drift.py and bench/payoff_real_vllm.py."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import aiohttp

from exporter.measure.scenarios import builtin
from exporter.measure.stream_client import stream_chat
from exporter.measure.workload import WORKLOADS
from harness.helpers import child, free_port, http_get, specdec, wait_for

# the two routes, each request's cap heavy-tailed around its route's mean (on the simulator
# with long prompts, one cap per route split the routes' A/B figures 10 % around their tokens
# per step: a route's requests ended together)
ROUTES = {w.name: w for w in WORKLOADS}
T = TypeVar("T")


@dataclass
class Decoded:
    """Tokens after the first and the seconds from the first content token to the last."""

    tokens: float = 0.0
    seconds: float = 0.0

    @property
    def rate(self) -> float:
        return self.tokens / self.seconds

    def __iadd__(self, other: Decoded) -> Decoded:
        self.tokens += other.tokens
        self.seconds += other.seconds
        return self


class AbTrafficError(Exception):
    """A request of the A/B's traffic failed: `str()` names the server and the moment."""


async def traffic(
    base: str, model: str, concurrency: int, seconds: float, proxied: bool, longer: int = 0
) -> dict[str, Decoded]:
    """Closed-loop clients, half per route (one alternating at concurrency 1), for `seconds`;
    per route the decode tokens after the first and their seconds as the clients saw them.
    `longer`: every request with about that many words of context more."""
    found = {route: Decoded() for route in ROUTES}
    deadline = time.monotonic() + seconds
    names = list(ROUTES)

    async def client(worker: int, session: aiohttp.ClientSession) -> None:
        i = 0
        while time.monotonic() < deadline:
            route = names[(worker + i) % 2] if concurrency == 1 else names[worker % 2]
            work = ROUTES[route]
            pack = builtin(work.scenario)
            body = {
                "model": model,
                "messages": (pack.lengthened(longer) if longer else pack).messages(i),
                "max_tokens": work.tokens(f"{worker}/{i}"),
            }
            headers = work.headers if proxied else None
            try:
                r = await stream_chat(session, f"{base}/v1/chat/completions", body, headers)
            except aiohttp.ClientError as exc:  # which server, when: the proxy's or the plain
                raise AbTrafficError(
                    f"{base} ({'proxy' if proxied else 'plain'}), c = {concurrency}, worker "
                    f"{worker}, request {i}, {deadline - time.monotonic():.1f} s before the "
                    f"phase's end: {exc!r}"
                ) from exc
            if r.decode_seconds > 0:
                found[route] += Decoded(r.completion_tokens - 1, r.decode_seconds)
            i += 1

    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(client(w, session) for w in range(concurrency)))
    return found


def alternate(
    spec: str,
    plain: str,
    model: str,
    concurrency: int,
    phase: float,
    read: Callable[[], T],
    rounds: list[tuple[dict[str, Decoded], dict[str, Decoded]]] | None = None,
    longer: int = 0,
) -> tuple[dict[str, Decoded], dict[str, Decoded], T]:
    """spec, plain, spec, plain (a 2-core machine's load drifts): the clients' decode per
    route on each side, and what `read()` returned right after the last speculative phase.
    `rounds`, if given, gets each round's own (spec, plain): the A/B's repeatability."""
    on = {route: Decoded() for route in ROUTES}
    off = {route: Decoded() for route in ROUTES}
    seen: T | None = None
    for round_ in range(2):
        this: list[dict[str, Decoded]] = []
        for into, url, proxied in ((on, spec, True), (off, plain, False)):
            if round_ == 1 and not proxied:
                seen = read()
            found = asyncio.run(traffic(url, model, concurrency, phase, proxied, longer))
            this.append(found)
            for route, d in found.items():
                into[route] += d
        if rounds is not None:
            rounds.append((this[0], this[1]))
    assert seen is not None
    return on, off, seen


def routes_pack(tmp: Path, longer: int) -> Path:
    """The two routes as measure's scenarios: their first 8 prompts, two to each of four caps
    at their spread's quantiles, each route weighed inverse to its mean cap so each holds half
    of measure's batch, as half the A/B's clients send each; `longer`: words of context more."""
    lines = []
    for route, work in ROUTES.items():
        pack = builtin(work.scenario).lengthened(longer) if longer else builtin(work.scenario)
        for j, tokens in enumerate(work.caps(4)):
            entry = {"name": f"{route}_{j}", "max_tokens": tokens, "system": pack.system,
                     "prompts": list(pack.prompts[2 * j : 2 * j + 2]),
                     "weight": 200 / work.mean_tokens}  # fmt: skip
            lines.append(json.dumps(entry, ensure_ascii=False))
    path = tmp / f"routes-{longer}.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def point(r: dict[str, Any]) -> str:
    """A step-time point of measure's JSON as the config takes it (with its error over the
    run, `*_spread`, where measure gives one)."""
    keys = {
        "running": "running",
        "plain_seconds": "plain_seconds",
        "verify_seconds": "verify_seconds",
        "verify_drafts": "verify_drafts",
        "context": "context_tokens",
        "plain_per_context_token": "plain_seconds_per_context_token",
        "verify_per_context_token": "verify_seconds_per_context_token",
        "plain_spread": "plain_spread",
        "verify_spread": "verify_spread",
    }
    if r.get("verify_drafts") == 0:  # a schedule's k = 0: its spec phase ran plain steps
        keys.pop("verify_seconds"), keys.pop("verify_drafts"), keys.pop("verify_spread")
    return ", ".join(f"{name}: {r[key]}" for key, name in keys.items() if r.get(key) is not None)


@contextlib.contextmanager
def sidecar(
    tmp: Path,
    spec_port: int,
    levels: list[dict[str, Any]],
    window: float,
    interval: float,
    schedule: str = "",
) -> Iterator[tuple[str, str]]:
    """`specdec serve` with `sidecar_config`, up: its proxy's base URL and its /metrics. Its
    ports are picked here, as it starts: one picked minutes before (ahead of measure) can be
    another process's by then, a client's own port among them."""
    proxy_port, side_port = free_port(), free_port()
    path = sidecar_config(tmp, (spec_port, proxy_port), levels, window, interval, schedule)
    serve = specdec("serve", "--config", str(path), "--listen", f"127.0.0.1:{side_port}")
    proxy, metrics = f"http://127.0.0.1:{proxy_port}", f"http://127.0.0.1:{side_port}/metrics"
    with child(serve, tmp / "serve.log"):
        wait_for(lambda: http_get(metrics), what="the sidecar up")
        wait_for(lambda: http_get(proxy + "/health") is not None, what="its proxy up")  # "": up
        yield proxy, metrics


def sidecar_config(
    tmp: Path,
    ports: tuple[int, int],
    levels: list[dict[str, Any]],
    window: float,
    interval: float,
    schedule: str = "",
) -> Path:
    """`specdec serve`'s config for a speculative simulator on ports[0] with the proxy on
    ports[1] (the two routes by header), the model's curve measure's `levels`, one window of
    `window` seconds, scraped every `interval`; `schedule`: the model's draft_length_schedule."""
    spec_port, proxy_port = ports
    points = "\n".join(f"      - {{{point(r)}}}" for r in levels)
    text = f"""targets:
  - name: sim
    url: http://127.0.0.1:{spec_port}/metrics
    interval: {interval * 1000:.0f}ms
windows: [{window:.0f}s]
proxy:
  upstream: http://127.0.0.1:{spec_port}
  listen: 127.0.0.1:{proxy_port}
  target: sim
  routes:
    - name: voice_chat
      when: {{header: {{x-route: voice}}}}
    - name: coding_agent
      when: {{header: {{x-route: agent}}}}
models:
  - name: sim-27b
    num_speculative_tokens: 3
    step_cost_ratio: {levels[0]["verify_seconds"] / levels[0]["plain_seconds"]:.3f}
    step_time:
{points}
""" + (f"    draft_length_schedule: {schedule}\n" if schedule else "")
    path = tmp / "specdec.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def measured(
    spec: str, plain: str, pack: Path, levels: tuple[int, ...], *extra: str
) -> list[dict[str, Any]]:
    """`specdec measure --concurrency LEVELS` of `pack`'s scenarios against the two endpoints
    (with `extra` flags): its --json levels, one per level asked."""
    args = ["measure", "--base-url", spec, "--baseline-url", plain, "--scenario-file", str(pack)]
    args += ["--concurrency", ",".join(map(str, levels)), "--json", *extra]
    out = subprocess.run(specdec(*args), capture_output=True, text=True, check=True, timeout=600)
    found: list[dict[str, Any]] = json.loads(out.stdout)["levels"]
    assert [r["concurrency"] for r in found] == list(levels)
    return found
