"""Per-route counts through the proxy add up to the engine's, and match each workload's truth."""

from __future__ import annotations

import aiohttp
import pytest

from exporter.core.counts import Counts, ratios, total
from exporter.scrape.families import families, read_page
from exporter.sidecar import Sidecar
from harness.pages import apportioned, promtool_clean, read, route_counts
from harness.rig import mixed_traffic, sidecar, simulator, truth


async def engine_totals(upstream: str) -> Counts:
    async with aiohttp.ClientSession() as session, session.get(upstream + "/metrics") as resp:
        page = read_page(await resp.text(), families("vllm"))
    return total([s.counts for s in page.series.values()])


async def test_exact_routes_sum_to_engine_and_match_truth() -> None:
    async with simulator("summary") as (_, upstream), sidecar(upstream) as (_, proxy, metrics):
        await mixed_traffic(proxy)
        routes = route_counts(await read(metrics), "exact")
        engine = await engine_totals(upstream)
        assert set(routes) == {"voice_chat", "coding_agent"}
        assert routes["voice_chat"] + routes["coding_agent"] == engine  # exactly, every field
        real = await truth(upstream)
        assert routes["voice_chat"] == real["ja_chat"]
        assert routes["coding_agent"] == real["code_agent"]
        voice, agent = (
            r.accepted / r.draft_tokens for r in (routes["voice_chat"], routes["coding_agent"])
        )
        assert 0.30 < voice < 0.42 and 0.65 < agent < 0.77
        await promtool_clean(metrics)


async def test_a_varying_draft_length_keeps_every_figure_exact() -> None:
    """vLLM's adaptive draft length: each step drafts 1..k tokens, so draft tokens are not
    k x steps. The per-request objects still sum to the engine's counters and the truth, and
    tokens per step and per-position acceptance come out as the engine's own."""
    async with (
        simulator("summary", adaptive=True) as (_, upstream),
        sidecar(upstream) as (_, proxy, metrics),
    ):
        await mixed_traffic(proxy, count=120)
        routes = route_counts(await read(metrics), "exact")
        engine = await engine_totals(upstream)
        real = await truth(upstream)
    assert engine.drafts is not None and engine.draft_tokens < 3 * engine.drafts * 0.8
    assert routes["voice_chat"] + routes["coding_agent"] == engine
    assert routes["voice_chat"] == real["ja_chat"] and routes["coding_agent"] == real["code_agent"]
    for route, profile in (("voice_chat", "ja_chat"), ("coding_agent", "code_agent")):
        got, want = ratios(routes[route]), ratios(real[profile])
        assert got.mean_acceptance_length == want.mean_acceptance_length
        assert got.per_position == want.per_position and got.acceptance == want.acceptance


async def test_estimates_without_per_request_objects_are_within_2_points() -> None:
    async with simulator("none") as (_, upstream), sidecar(upstream) as (side, proxy, metrics):
        await mixed_traffic(proxy)
        engine = await engine_totals(upstream)
        routes = await apportioned(metrics, engine)
        assert route_counts(await read(metrics), "exact") == {}
        real = await truth(upstream)
        for route, profile in (("voice_chat", "ja_chat"), ("coding_agent", "code_agent")):
            got = routes[route].accepted / routes[route].draft_tokens
            want = real[profile].accepted / real[profile].draft_tokens
            assert got == pytest.approx(want, abs=0.02), (route, got, want)
        assert_coverage_full(side)


def assert_coverage_full(side: Sidecar) -> None:
    """Everything went through the proxy: the routes account for all the engine's drafts."""
    assert side.proxy is not None and side.fronted is not None
    acc = side.proxy.accounting
    assert total(list(acc.summed().values())).drafts == pytest.approx(
        total([t.counts for t in side.fronted.store.series.values()]).drafts
    )
