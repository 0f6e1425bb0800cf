"""A SIGHUP that adds a window, a target and a route under traffic: the 1m acceptance gauges
(the target's and the route's) stay on the page through the reload, every scrape of the
sidecar, with the figure they had. `specdec sim` and `specdec serve` are child processes; the
reload is a real signal."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path

import aiohttp

from harness.helpers import child, eventually, free_port, specdec
from harness.pages import samples, value

ROUTES = "    - {name: voice_chat, when: {header: {X-Route: voice}}}\n"
NEW_ROUTE = "    - {name: coding_agent, when: {header: {X-Route: agent}}}\n"
JA = [{"role": "user", "content": "今日の天気について教えてください。"}]


def config_text(sim: str, proxy_port: int, metrics_port: int, windows: str, extra: str) -> str:
    return f"""\
listen: 127.0.0.1:{metrics_port}
windows: [{windows}]
targets:
  - name: sim
    url: {sim}/metrics
    interval: 1s
{extra}proxy:
  listen: 127.0.0.1:{proxy_port}
  upstream: {sim}
  target: sim
  routes:
"""


async def traffic(session: aiohttp.ClientSession, proxy: str, stop: asyncio.Event) -> int:
    sent = 0
    while not stop.is_set():
        body = {"model": "sim-27b", "messages": JA, "max_tokens": 40}
        headers = {"X-Route": "voice" if sent % 2 == 0 else "agent"}
        async with session.post(f"{proxy}/v1/chat/completions", json=body, headers=headers) as r:
            assert r.status == 200, await r.text()
            await r.read()
        sent += 1
    return sent


async def test_the_1m_acceptance_is_continuous_across_a_sighup_that_adds_a_window_target_route(
    tmp_path: Path,
) -> None:
    sim_port, proxy_port, metrics_port = free_port(), free_port(), free_port()
    sim = f"http://127.0.0.1:{sim_port}"
    config = tmp_path / "specdec.yaml"
    config.write_text(config_text(sim, proxy_port, metrics_port, "1m", "") + ROUTES)
    metrics = f"http://127.0.0.1:{metrics_port}/metrics"
    sim_args = specdec("sim", "--listen", f"127.0.0.1:{sim_port}", "--speed", "50")
    with (
        child(sim_args, tmp_path / "sim.log"),
        child(specdec("serve", "--config", str(config)), tmp_path / "serve.log") as served,
    ):
        async with aiohttp.ClientSession() as session:

            async def gauges() -> tuple[float | None, float | None]:
                try:
                    async with session.get(metrics) as resp:
                        page = samples(await resp.text())
                except aiohttp.ClientError:
                    return None, None
                target = value(page, "specdec_acceptance_ratio", target="sim", window="1m",
                               engine="all")  # fmt: skip
                route = value(page, "specdec_route_acceptance_ratio", route="voice_chat",
                              window="1m")  # fmt: skip
                return target, route

            async def ready(url: str) -> bool:
                try:
                    async with session.get(url) as resp:
                        return resp.status == 200
                except aiohttp.ClientError:
                    return False

            # both children up before traffic: the sidecar's readiness says nothing of the sim
            await eventually(lambda: ready(f"{sim}/health"), timeout=30)
            await eventually(lambda: ready(metrics.replace("/metrics", "/-/ready")), timeout=30)
            stop = asyncio.Event()
            sender = asyncio.create_task(traffic(session, f"http://127.0.0.1:{proxy_port}", stop))
            deadline = time.monotonic() + 120
            while None in await gauges():  # the 1m window fills: a minute of history
                assert time.monotonic() < deadline, "no 1m gauges after 120 s"
                assert not sender.done(), sender
                await asyncio.sleep(0.5)
            before = await gauges()
            extra = f"  - name: sim-again\n    url: {sim}/metrics\n    interval: 1s\n"
            config.write_text(
                config_text(sim, proxy_port, metrics_port, "1m, 5m", extra) + ROUTES + NEW_ROUTE
            )
            served.send_signal(signal.SIGHUP)
            seen: list[tuple[float | None, float | None]] = []
            reloaded = False
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:  # every scrape, from just before to 20 s after
                seen.append(await gauges())
                async with session.get(metrics) as resp:
                    page = samples(await resp.text())
                reloaded = reloaded or value(page, "specdec_target_up", target="sim-again") == 1
                await asyncio.sleep(0.2)
            stop.set()
            sent = await sender
    assert reloaded, "the new target never came up"
    assert sent > 50
    assert len(seen) > 50 and all(None not in s for s in seen), seen  # never absent
    for now in seen:  # and the same figure within traffic's noise, not a reset window's
        assert abs(now[0] - before[0]) < 0.1 and abs(now[1] - before[1]) < 0.1, (before, now)
