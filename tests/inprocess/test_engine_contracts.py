"""Every engine in the registry (`exporter.engines.ENGINES`) through the same contracts: the
simulator speaking its kind, 200 mixed requests of two routes through the proxy, then

- scrape: the sidecar exports the engine's verify steps as its own page states them;
- proxy: every request is accounted, and the routes' steps add up to the engine's;
- per request: each count the engine states exactly (`Engine.exact_per_request`) is each
  route's own, equal to the simulator's truth for its profile.

A new engine module joins these by being in the registry (and exporter/sim/dialects.py)."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from exporter.core.counts import Counts, total
from exporter.engines import ENGINES
from exporter.engines.base import Role
from exporter.scrape.families import read_page
from harness.helpers import eventually
from harness.pages import route_counts, samples
from harness.rig import mixed_traffic, sidecar, simulator, truth

METRICS_PATH = {"trtllm": "/prometheus/metrics"}  # where each simulated kind serves its page
PROFILE = {"voice_chat": "ja_chat", "coding_agent": "code_agent"}  # route -> simulated profile
FIELD = {
    Role.DRAFTS: "drafts",
    Role.DRAFT_TOKENS: "draft_tokens",
    Role.ACCEPTED: "accepted",
    Role.PER_POSITION: "per_position",
}


async def text(url: str) -> str:
    async with aiohttp.ClientSession() as session, session.get(url) as resp:
        return await resp.text()


@pytest.mark.parametrize("kind", list(ENGINES))
async def test_every_engine_meets_the_scrape_and_proxy_contracts(kind: str) -> None:
    engine = ENGINES[kind]
    path = METRICS_PATH.get(kind, "/metrics")
    async with (
        simulator(kind=kind) as (_, upstream),
        sidecar(upstream, kind=kind, path=path) as (side, proxy, metrics),
    ):
        await mixed_traffic(proxy, seed=5)
        real = await truth(upstream)
        page = read_page(await text(upstream + path), engine.families())
        steps = total([s.counts for s in page.series.values()]).drafts
        assert steps is not None and steps > 300

        async def settled() -> tuple[dict[Any, float], dict[str, Counts]] | None:
            """The sidecar's page once its engine steps are the page's and the routes' steps
            (exact + apportioned, on its ticks) add up to them."""
            found = samples(await text(metrics))
            exported = sum(v for (n, _), v in found.items() if n == "specdec_drafts_total")
            exact, estimated = [route_counts(found, s) for s in ("exact", "estimated")]
            routes = {r: exact.get(r, Counts()) + estimated.get(r, Counts()) for r in PROFILE}
            summed = sum(c.drafts or 0.0 for c in routes.values())
            ok = exported == steps and abs(summed - steps) <= 1e-6 * steps
            return (found, exact) if ok else None

        _, exact = await eventually(settled, timeout=45)
        assert side.proxy is not None and side.proxy.settings.engine is engine
        assert sum(side.proxy.accounting.requests.values()) == 200
    for route, profile in PROFILE.items():
        for role in engine.exact_per_request:
            mine = getattr(exact[route], FIELD[role])
            assert mine == getattr(real[profile], FIELD[role]), (kind, route, role)
