"""In-process rigs for proxy tests: simulators and a sidecar with its proxy, on free ports, and
the two routes' traffic through it."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
from aiohttp import web

from exporter.config import Config, ModelConfig, ProxyConfig, Route, Target
from exporter.core.counts import Counts
from exporter.core.schedule import Schedule
from exporter.core.windows import DEFAULT_WINDOWS, Window
from exporter.sidecar import Sidecar
from exporter.sim.decoder import SimEngine
from exporter.sim.server import build_app
from harness.helpers import free_port

ROUTES = (
    Route("voice_chat", headers=(("x-route", "voice"),)),
    Route("coding_agent", path_prefix="/agent"),
)
JA = [{"role": "user", "content": "こんにちは！週末は何してた？"}]
CODE = [{"role": "user", "content": "Write a Python function that merges two sorted lists."}]


@asynccontextmanager
async def simulator(
    per_request: str = "summary",
    speed: float = 500,
    seed: int = 1,
    clock: Callable[[], float] | None = None,
    data_parallel_size: int = 1,
    adaptive: bool = False,
    kind: str = "vllm",
    schedule: Schedule | None = None,
) -> AsyncIterator[tuple[SimEngine, str]]:
    engine = SimEngine(
        "sim-27b",
        data_parallel_size=data_parallel_size,
        speed=speed,
        seed=seed,
        adaptive=adaptive,
        schedule=schedule,
    )
    app = build_app(engine, per_request, clock=clock or time.time, kind=kind)
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield engine, f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


SIM_MODEL = ModelConfig("sim-27b", 3, 1.78, 72.0, 20e9, 1.7e12)


@asynccontextmanager
async def sidecar(
    upstream: str,
    kind: str = "vllm",
    path: str = "/metrics",
    windows: tuple[Window, ...] = DEFAULT_WINDOWS,
    *,
    via: str | None = None,
    interval: float = 0.1,
    model: ModelConfig = SIM_MODEL,
    **proxy: Any,
) -> AsyncIterator[tuple[Sidecar, str, str]]:
    """A sidecar scraping `upstream` (a target of engine `kind`, at `path`) every `interval`
    seconds, with the proxy in front of it (reaching `upstream` `via` another address, a tap,
    where given; `proxy`: ProxyConfig fields). A window's gauges appear once the sidecar is
    that old: a test that reads them soon gives a short window."""
    proxy_port, metrics_port = free_port(), free_port()
    config = Config(
        listen=("127.0.0.1", metrics_port),
        targets=(Target("sim", f"{upstream}{path}", kind=kind, interval=interval),),
        windows=windows,
        proxy=ProxyConfig(
            via or upstream,
            ("127.0.0.1", proxy_port),
            "sim",
            proxy.pop("routes", ROUTES),
            **proxy,
        ),
        models=(model,),
    )
    side = Sidecar(config)
    await side.start()
    try:
        yield side, f"http://127.0.0.1:{proxy_port}", f"http://127.0.0.1:{metrics_port}/metrics"
    finally:
        await side.stop()


async def mixed_traffic(
    proxy: str, count: int = 200, concurrency: int = 20, seed: int = 3, **extra: list[Any]
) -> None:
    """`count` requests, half voice (header) half agent (path), streamed or not, with or without
    usage; `extra`: request fields some of them carry (the values to pick from; None: left out)."""
    rng = random.Random(seed)
    gate = asyncio.Semaphore(concurrency)

    async def one(session: aiohttp.ClientSession, i: int) -> None:
        voice = i % 2 == 0
        url = proxy + ("/v1/chat/completions" if voice else "/agent/v1/chat/completions")
        body: dict[str, Any] = {
            "model": "sim-27b",
            "messages": JA if voice else CODE,
            "max_tokens": rng.randint(20, 120),
        }
        style = rng.choice(["whole", "stream", "stream_usage"])
        if style != "whole":
            body["stream"] = True
        if style == "stream_usage":
            body["stream_options"] = {"include_usage": True}
        for name, choices in extra.items():
            value = rng.choice(choices)
            if value is not None:
                body[name] = value
        async with (
            gate,
            session.post(url, json=body, headers={"X-Route": "voice"} if voice else {}) as resp,
        ):
            assert resp.status == 200, await resp.text()
            await resp.read()

    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(one(session, i) for i in range(count)))


async def truth(upstream: str) -> dict[str, Counts]:
    """The simulator's own counts per workload profile (its /admin/truth), to check the
    proxy's per-route counts against."""
    async with aiohttp.ClientSession() as session, session.get(upstream + "/admin/truth") as resp:
        data = await resp.json()
    return {
        k: Counts(v["drafts"], v["draft_tokens"], v["accepted"], tuple(v["per_position"]))
        for k, v in data.items()
    }
