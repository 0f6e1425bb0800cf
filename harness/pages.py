"""A /metrics page as the tests read it: every sample by name and labels, one value, the
spec-decode counts it holds (the engine's, the sidecar's, per route), and promtool's verdict."""

from __future__ import annotations

import subprocess

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from exporter.core.counts import Counts
from harness.helpers import eventually, need_tool

Page = dict[tuple[str, tuple[tuple[str, str], ...]], float]  # (name, sorted labels) -> value
# the proxy's per-route counters, in `Counts`' order: drafts, draft tokens, accepted, per position
ROUTE_FAMILIES = tuple(
    f"specdec_route_{name}_total"
    for name in ("drafts", "draft_tokens", "accepted_tokens", "accepted_tokens_per_position")
)


def samples(text: str) -> Page:
    """{(name, sorted labels): value} for every sample of a page."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


async def read(url: str) -> Page:
    """The page at `url`, fetched without blocking the event loop."""
    async with aiohttp.ClientSession() as session, session.get(url) as resp:
        return samples(await resp.text())


def value(page: Page, name: str, **labels: str) -> float | None:
    """The value of the one sample `name` whose labels include `labels`, None if absent."""
    hits = [v for (n, ls), v in page.items() if n == name and set(labels.items()) <= set(ls)]
    assert len(hits) <= 1, f"{name}{labels} matches {len(hits)} samples"
    return hits[0] if hits else None


def counts_from_page(page: Page, drafts: str, tokens: str, accepted: str, per_pos: str) -> Counts:
    """Sum of every series of the four counters (per position by the `position` label)."""
    sums = {drafts: 0.0, tokens: 0.0, accepted: 0.0}
    positions: dict[int, float] = {}
    for (name, labels), v in page.items():
        if name in sums:
            sums[name] += v
        elif name == per_pos:
            pos = int(dict(labels)["position"])
            positions[pos] = positions.get(pos, 0.0) + v
    return Counts(
        sums[drafts], sums[tokens], sums[accepted], tuple(positions[i] for i in sorted(positions))
    )


def route_counts(page: Page, source: str = "exact") -> dict[str, Counts]:
    """Per route: the proxy's spec-decode counters of one `source` (routes without any: absent;
    the decode families carry a source too, and are not counts)."""
    per_route: dict[str, Page] = {}
    for (name, labels), v in page.items():
        ls = dict(labels)
        if name in ROUTE_FAMILIES and ls.get("source") == source:
            per_route.setdefault(ls["route"], {})[(name, labels)] = v
    return {route: counts_from_page(sub, *ROUTE_FAMILIES) for route, sub in per_route.items()}


def close(a: Counts, b: Counts, tol: float = 1e-6) -> bool:
    """Every field of `a` equals `b`'s within `tol` of b's draft tokens (sums of shares)."""
    fields = [
        (a.drafts or 0) - (b.drafts or 0),
        a.draft_tokens - b.draft_tokens,
        a.accepted - b.accepted,
    ]
    fields += [x - y for x, y in zip(a.per_position, b.per_position, strict=True)]
    return all(abs(f) <= tol * max(1.0, b.draft_tokens) for f in fields)


async def apportioned(metrics_url: str, engine: Counts) -> dict[str, Counts]:
    """The two routes' estimated counts once they add up to `engine` (polled: each second the
    sidecar hands out the engine's unexplained work)."""

    async def summed() -> dict[str, Counts] | None:
        routes = route_counts(await read(metrics_url), "estimated")
        if len(routes) == 2 and close(routes["voice_chat"] + routes["coding_agent"], engine):
            return routes
        return None

    return await eventually(summed, timeout=10)


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
