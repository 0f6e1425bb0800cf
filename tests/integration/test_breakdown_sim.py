"""On the simulator, through the proxy: when a route's acceptance falls, the split tells whether
its traffic moved or its engine changed.

The simulator's requests keep 1 - 0.4 min(T, 1.5) of their acceptance at temperature T
(`exporter.sim.decoder.sampled_share`). A closed loop of requests on one route, greedy and at
temperature 1 in a share that the test sets, runs through `specdec serve`'s proxy for a
baseline, then changes: either the clients move to sampling (the engine unchanged), or the
engine's drafter worsens (the mix unchanged). The sidecar's breakdown window and baseline are
also its rolling windows, so its own exact acceptance over the two gives the change that the
split must add up to, on every dimension: the baseline of the split ends where the window
begins, the rolling one holds the window too, so with steady draft tokens per second (a step's
drafts and time do not depend on what it accepts) the split's change is the rolling windows'
/ (1 - window / baseline)."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable

import aiohttp
import pytest

from exporter.config import Breakdown, Config, ModelConfig, ProxyConfig, Route, Target
from exporter.core.windows import parse_window
from exporter.sidecar import Sidecar
from exporter.sim.profiles import Profile
from harness.helpers import free_port
from harness.pages import samples
from harness.rig import CODE, simulator

WINDOW, BASELINE = parse_window("3s"), parse_window("30s")
BEFORE_SECONDS, AFTER_SECONDS = 29.0, 4.5
pytestmark = pytest.mark.timeout(300)


async def closed_loop(proxy: str, sampled: Callable[[], float], until: float) -> None:
    """Four clients sending coding requests, each at temperature 1 with probability
    `sampled()` (read per request: the share can change under them), else greedy."""
    rng = random.Random(7)

    async def client(session: aiohttp.ClientSession) -> None:
        while time.monotonic() < until:
            body = {
                "model": "sim-27b",
                "messages": CODE,
                "max_tokens": 60,
                "temperature": 1.0 if rng.random() < sampled() else 0.0,
            }
            async with session.post(f"{proxy}/v1/chat/completions", json=body) as resp:
                assert resp.status == 200
                await resp.read()

    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(client(session) for _ in range(4)))


async def split(metrics: str) -> tuple[dict[tuple[str, str], float], float]:
    """The sidecar's split per (dimension, part), and its exact acceptance change from the
    baseline window to the window (what the parts must add up to)."""
    async with aiohttp.ClientSession() as session, session.get(metrics) as resp:
        page = samples(await resp.text())
    parts, exact = {}, {}
    for (name, labels), value in page.items():
        ls = dict(labels)
        if name == "specdec_route_acceptance_change_ratio":
            parts[(ls["dimension"], ls["part"])] = value
        elif name == "specdec_route_exact_acceptance_ratio":
            exact[ls["window"]] = value
    return parts, exact[WINDOW.label] - exact[BASELINE.label]


@pytest.mark.parametrize("change", ["traffic", "engine"])
async def test_a_drop_is_split_into_what_moved(change: str) -> None:
    async with simulator(speed=40) as (engine, upstream):
        proxy_port, metrics_port = free_port(), free_port()
        config = Config(
            listen=("127.0.0.1", metrics_port),
            targets=(Target("sim", f"{upstream}/metrics", interval=0.2),),
            windows=(WINDOW, BASELINE),
            proxy=ProxyConfig(upstream, ("127.0.0.1", proxy_port), "sim", (Route("agent"),)),
            models=(ModelConfig("sim-27b", 3, 1.78, 72.0),),
            breakdown=Breakdown(WINDOW, BASELINE),
        )
        side = Sidecar(config)
        await side.start()
        try:
            proxy, metrics = f"http://127.0.0.1:{proxy_port}", f"http://127.0.0.1:{metrics_port}"
            share = [0.1 if change == "traffic" else 0.5]
            start = time.monotonic()
            loop = asyncio.create_task(
                closed_loop(proxy, lambda: share[0], start + BEFORE_SECONDS + AFTER_SECONDS)
            )
            while time.monotonic() < start + BEFORE_SECONDS:
                await asyncio.sleep(0.1)  # the baseline's traffic runs: not a synchronisation
            if change == "traffic":
                share[0] = 0.9  # the clients move to sampling; the engine as it was
            else:  # the drafter worsens; the mix as it was
                engine.profiles["code_agent"] = Profile("code_agent", 0.35)
            while time.monotonic() < start + BEFORE_SECONDS + AFTER_SECONDS - 0.3:
                await asyncio.sleep(0.1)
            parts, moved = await split(f"{metrics}/metrics")
            await loop
        finally:
            await side.stop()
    print(change, f"{moved:+.4f}", {k: round(v, 4) for k, v in sorted(parts.items())})
    assert moved < -0.1  # the route's acceptance fell
    before_the_window = moved / (1 - WINDOW.seconds / BASELINE.seconds)
    totals = {
        d: parts[(d, "mix")] + parts[(d, "within")]
        for d in ("temperature", "output", "prompt_tokens")
    }
    for dimension, total in totals.items():
        assert total == pytest.approx(totals["output"], abs=1e-9), (dimension, totals)
        assert total == pytest.approx(before_the_window, rel=0.05), (dimension, parts, moved)
    mix, within = parts[("temperature", "mix")], parts[("temperature", "within")]
    if change == "traffic":
        assert mix / moved >= 0.7, (mix, within, moved)
    else:
        assert within / moved >= 0.7, (mix, within, moved)
