"""Under vLLM's dynamic speculative decoding (k by the batch, 0 at large batches), the routes'
decode steps by draft length equal what the simulator ran, step for step, at c = 1, 8 and 32:
per step from `detailed` objects, plain steps from the completion tokens."""

from __future__ import annotations

import aiohttp
import pytest

from exporter.core.schedule import Schedule
from harness.pages import samples
from harness.rig import mixed_traffic, sidecar, simulator

SCHEDULE = Schedule.parse([[1, 3, 3], [4, 15, 2], [16, 256, 0]])
PROFILES = {"voice_chat": "ja_chat", "coding_agent": "code_agent"}


async def by_draft_length(metrics: str) -> dict[str, dict[str, float]]:
    async with aiohttp.ClientSession() as session, session.get(metrics) as resp:
        page = samples(await resp.text())
    out: dict[str, dict[str, float]] = {}
    for (name, labels), value in page.items():
        if name == "specdec_route_steps_total":
            ls = dict(labels)
            out.setdefault(ls["route"], {})[ls["draft_length"]] = value
    return out


@pytest.mark.parametrize(("concurrency", "expect"), [(1, "3"), (8, "2"), (32, "0")])
async def test_steps_by_draft_length_equal_the_simulators_under_a_schedule(
    concurrency: int, expect: str
) -> None:
    async with (
        # 50x: a request lasts tens of ms, so the batch is the clients' concurrency rather than
        # their per-request overhead (at 500x a request is over in a few ms on a busy host)
        simulator("detailed", schedule=SCHEDULE, speed=50) as (_, upstream),
        sidecar(upstream) as (_, proxy, metrics),
    ):
        await mixed_traffic(
            proxy, count=4 * concurrency + 8, concurrency=concurrency, seed=concurrency
        )
        async with aiohttp.ClientSession() as session:
            async with session.get(upstream + "/admin/truth") as resp:
                truth = await resp.json()
        routes = await by_draft_length(metrics)
        for route, profile in PROFILES.items():
            real = {k: float(n) for k, n in truth[profile]["steps_by_draft_length"].items()}
            assert routes[route] == real, (route, routes[route], real)
        steps = {k: sum(r.get(k, 0.0) for r in routes.values()) for k in ("0", "1", "2", "3")}
        assert max(steps, key=lambda k: steps[k]) == expect  # the schedule's k at that load
        if concurrency == 1:
            assert steps["0"] == steps["2"] == 0  # batch 1: k = 3 always
