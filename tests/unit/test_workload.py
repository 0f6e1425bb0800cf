"""The routes' traffic, one type for the demo, the tests' A/B and the GPU bench: each request's
length heavy-tailed around its route's mean, the mean kept after the cut, the same on every
run; how the proxy tells the route."""

from __future__ import annotations

import statistics
from dataclasses import replace

import pytest

from exporter.measure.workload import AGENT, LONGEST, VOICE, WORKLOADS, Workload


@pytest.mark.parametrize("work", WORKLOADS, ids=lambda w: w.name)
def test_lengths_spread_heavy_tailed_around_the_mean_and_repeat(work: Workload) -> None:
    lengths = [work.tokens(i) for i in range(4000)]
    assert statistics.fmean(lengths) == pytest.approx(work.mean_tokens, rel=0.03)
    assert statistics.median(lengths) < 0.9 * work.mean_tokens  # skewed: a long tail
    assert max(lengths) == LONGEST * work.mean_tokens and min(lengths) >= 2
    assert [work.tokens(i) for i in range(50)] == lengths[:50]  # the same on every run
    assert len(set(lengths[:8])) >= 6  # consecutive requests (and clients) differ


@pytest.mark.parametrize("sigma", [0.3, 0.6, 1.2])
def test_the_cut_keeps_the_mean_whatever_the_spread(sigma: float) -> None:
    """The cut at LONGEST x the mean takes the tail's tokens; the lognormal's centre moves up
    to give them back, so a route's mean is what it says."""
    work = replace(AGENT, spread=sigma)
    caps = work.caps(2000)
    assert statistics.fmean(caps) == pytest.approx(work.mean_tokens, rel=0.02)
    assert caps == sorted(caps) and caps[-1] == LONGEST * work.mean_tokens


def test_no_spread_is_every_request_at_the_mean() -> None:
    fixed = replace(VOICE, spread=0)
    assert {fixed.tokens(i) for i in range(50)} == {VOICE.mean_tokens}
    assert fixed.caps(4) == [VOICE.mean_tokens]


def test_the_proxy_tells_a_workload_by_header_or_path_prefix() -> None:
    assert VOICE.headers == {"X-Route": "voice"} and VOICE.path == "/v1/chat/completions"
    by_path = replace(AGENT, header=None, path_prefix="/agent")
    assert by_path.headers == {} and by_path.path == "/agent/v1/chat/completions"
