"""Every ```promql block of docs/promql.md returns data from a live Prometheus scraping the
simulator + sidecar + proxy (`specdec demo`), with the rules exactly as shipped (live.py)."""

from __future__ import annotations

import re
import time

import pytest

from exporter.core.durations import parse_duration
from tests.integration.live import REPO, Live

pytestmark = pytest.mark.promtool

COOKBOOK = REPO / "docs" / "promql.md"
BLOCK = re.compile(r"^```promql\n(.*?)^```$", re.S | re.M)
HEADING = re.compile(r"^## (.+)$", re.M)


def blocks() -> list[tuple[str, str]]:
    """(section heading, query) for every promql block, in order."""
    text = COOKBOOK.read_text(encoding="utf-8")
    out = []
    for match in BLOCK.finditer(text):
        headings = HEADING.findall(text[: match.start()])
        out.append((headings[-1] if headings else "intro", match.group(1).strip()))
    return out


QUERIES = blocks()


def test_the_cookbook_has_the_promised_sections() -> None:
    assert len(QUERIES) >= 25, len(QUERIES)
    sections = {section for section, _ in QUERIES}
    for wanted in (
        "Voice vs agent acceptance, side by side",
        "Tokens per step against the k + 1 ceiling",
        "Payoff vs break-even",
        "Waste: rejected draft tokens",
        "Decode rate and TTFT per route",
        "Aggregating across replicas and sidecars",
        "Attribution coverage: does traffic bypass the proxy?",
    ):
        assert wanted in sections, (wanted, sections)
    text = " ".join(query for _, query in QUERIES)
    for metric in (
        "specdec_model_num_speculative_tokens",
        "specdec_breakeven_acceptance_ratio",
        "estimated_speedup",
        "rejected_draft_tokens",
        "specdec_route_ttft_seconds_bucket",
        "specdec_attribution_coverage_ratio",
    ):
        assert metric in text, metric


@pytest.mark.parametrize(
    "query", [q for _, q in QUERIES], ids=[f"{i:02d}-{s[:30]}" for i, (s, _) in enumerate(QUERIES)]
)
def test_query_returns_data(live: Live, query: str) -> None:
    # the shipped rule groups evaluate every 15 s and 1 m: the first block may wait for them;
    # a sidecar gauge of a window longer than the stack has run is read over 1m instead (it
    # appears once the sidecar holds the window's history)
    age = time.time() - live.started
    query = re.sub(
        r'window="([0-9a-z]+)"',
        lambda m: m.group(0) if parse_duration(m.group(1)) <= age + 60 else 'window="1m"',
        query,
    )
    result = live.poll(lambda: live.query(query), 120, f"data from\n{query}")
    assert all(len(sample["value"]) == 2 for sample in result), result
    values = [float(sample["value"][1]) for sample in result]
    assert not any(v != v for v in values), (query, result)  # no NaN: the `> 0` guards hold
