"""Per-route counts through the proxy add up to the engine's, and match each workload's truth."""

from __future__ import annotations

import subprocess
from typing import Any

import aiohttp
import pytest

from exporter.core.counts import Counts, ratios, total
from exporter.scrape.families import families, read_page
from exporter.sidecar import Sidecar
from harness.helpers import eventually, need_tool, samples
from harness.rig import mixed_traffic, sidecar, simulator


async def engine_totals(upstream: str) -> Counts:
    async with aiohttp.ClientSession() as session, session.get(upstream + "/metrics") as resp:
        page = read_page(await resp.text(), families("vllm"))
    return total([s.counts for s in page.series.values()])


async def truth(upstream: str) -> dict[str, Counts]:
    async with aiohttp.ClientSession() as session, session.get(upstream + "/admin/truth") as resp:
        data = await resp.json()
    return {
        k: Counts(v["drafts"], v["draft_tokens"], v["accepted"], tuple(v["per_position"]))
        for k, v in data.items()
    }


COUNT_FIELDS = ("drafts", "draft_tokens", "accepted_tokens", "accepted_tokens_per_position")


async def route_counts(metrics_url: str, source: str) -> dict[str, Counts]:
    async with aiohttp.ClientSession() as session, session.get(metrics_url) as resp:
        page = samples(await resp.text())
    out: dict[str, dict[str, Any]] = {}
    for (name, labels), value in page.items():
        ls = dict(labels)
        if not name.startswith("specdec_route_") or ls.get("source") != source:
            continue
        field = name.removeprefix("specdec_route_").removesuffix("_total")
        if field not in COUNT_FIELDS:
            continue  # the decode families carry a source too
        entry = out.setdefault(ls["route"], {"per_position": {}})
        if field == "accepted_tokens_per_position":
            entry["per_position"][int(ls["position"])] = value
        else:
            entry[field] = value
    return {
        route: Counts(
            e["drafts"],
            e["draft_tokens"],
            e["accepted_tokens"],
            tuple(e["per_position"][i] for i in sorted(e["per_position"])),
        )
        for route, e in out.items()
    }


async def apportioned(metrics_url: str, engine: Counts) -> dict[str, Counts]:
    """The two routes' estimated counts once they add up to `engine` (polled: each second the
    sidecar hands out the engine's unexplained work)."""

    async def summed() -> dict[str, Counts] | None:
        routes = await route_counts(metrics_url, "estimated")
        if len(routes) == 2 and close(routes["voice_chat"] + routes["coding_agent"], engine):
            return routes
        return None

    return await eventually(summed, timeout=10)


def close(a: Counts, b: Counts, tol: float = 1e-6) -> bool:
    fields = [
        (a.drafts or 0) - (b.drafts or 0),
        a.draft_tokens - b.draft_tokens,
        a.accepted - b.accepted,
    ]
    fields += [x - y for x, y in zip(a.per_position, b.per_position, strict=True)]
    return all(abs(f) <= tol * max(1.0, b.draft_tokens) for f in fields)


async def test_exact_routes_sum_to_engine_and_match_truth() -> None:
    async with simulator("summary") as (_, upstream), sidecar(upstream) as (_, proxy, metrics):
        await mixed_traffic(proxy)
        routes = await route_counts(metrics, "exact")
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
        routes = await route_counts(metrics, "exact")
        engine = await engine_totals(upstream)
        real = await truth(upstream)
    assert engine.drafts is not None and engine.draft_tokens < 3 * engine.drafts * 0.8
    assert routes["voice_chat"] + routes["coding_agent"] == engine
    assert routes["voice_chat"] == real["ja_chat"] and routes["coding_agent"] == real["code_agent"]
    for route, profile in (("voice_chat", "ja_chat"), ("coding_agent", "code_agent")):
        got, want = ratios(routes[route]), ratios(real[profile])
        assert got.mean_acceptance_length == want.mean_acceptance_length
        assert got.per_position == want.per_position and got.acceptance == want.acceptance


async def promtool_clean(metrics_url: str) -> None:
    """`promtool check metrics` finds nothing to say about the sidecar with its proxy families."""
    promtool = need_tool("promtool")
    async with aiohttp.ClientSession() as session, session.get(metrics_url) as resp:
        text = await resp.text()
    assert "specdec_route_acceptance_ratio" in text and "specdec_route_ttft_seconds_bucket" in text
    result = subprocess.run(
        [promtool, "check", "metrics"], input=text.encode(), capture_output=True
    )
    assert result.returncode == 0 and not result.stdout.strip() and not result.stderr.strip(), (
        result
    )


async def test_estimates_without_per_request_objects_are_within_2_points() -> None:
    async with simulator("none") as (_, upstream), sidecar(upstream) as (side, proxy, metrics):
        await mixed_traffic(proxy)
        engine = await engine_totals(upstream)

        async def apportioned() -> dict[str, Counts] | None:
            routes = await route_counts(metrics, "estimated")
            if len(routes) == 2 and close(routes["voice_chat"] + routes["coding_agent"], engine):
                return routes
            return None

        routes = await eventually(apportioned, 10.0)
        assert await route_counts(metrics, "exact") == {}
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
