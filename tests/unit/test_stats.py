"""Request-level statistics: the exported standard error equals the direct formula over the
requests (with the small-sample factor of the effective requests), no interval below three
effective requests, and on simulated windows of heterogeneous traffic with heavy-tailed lengths
the 95 % interval covers the truth about 95 % of the time from three requests on, where the
token-binomial interval covers far less. The whole grid: bench/coverage.py."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.core.stats import RequestMoments, t_975
from exporter.sim.profiles import Profile, draw

K = 3


def direct_stderr(requests: list[tuple[int, int]]) -> float:
    """The cluster-robust SE written out over the requests themselves, with the small-sample
    factor 1 / (1 - 2 sum t^3 / (T sum t^2) + sum t^2 / T^2)."""
    accepted = sum(a for a, _ in requests)
    tokens = sum(t for _, t in requests)
    squared = sum(t * t for _, t in requests)
    cubed = sum(t**3 for _, t in requests)
    p = accepted / tokens
    squares = sum((a - p * t) ** 2 for a, t in requests)
    kept = 1 - 2 * cubed / (tokens * squared) + squared / tokens**2
    return math.sqrt(squares / kept) / tokens


def test_equal_lengths_give_the_classic_factor() -> None:
    requests = [(10, 30), (20, 30), (5, 30), (25, 30)]
    m, tokens = 4, 120
    p = 60 / tokens
    classic = math.sqrt(m / (m - 1) * sum((a - p * t) ** 2 for a, t in requests)) / tokens
    interval = moments(requests).interval()
    assert interval is not None and interval.stderr == pytest.approx(classic)


def moments(requests: list[tuple[int, int]]) -> RequestMoments:
    total = RequestMoments()
    for a, t in requests:
        total = total.with_request(a, t)
    return total


@given(
    st.lists(
        st.integers(1, 400).flatmap(lambda t: st.tuples(st.integers(0, t), st.just(t))),
        min_size=2,
        max_size=60,
    )
)
@settings(max_examples=300, deadline=None)
def test_the_stderr_equals_the_direct_formula(requests: list[tuple[int, int]]) -> None:
    interval = moments(requests).interval()
    tokens = [t for _, t in requests]
    if sum(tokens) ** 2 / sum(t * t for t in tokens) < 3:
        assert interval is None
        return
    assert interval is not None
    assert interval.halfwidth == pytest.approx(
        t_975(interval.effective_requests - 1) * interval.stderr
    )
    got = interval.stderr
    # the sums cancel to rounding when every request has the same acceptance (SE ~ 0): an
    # absolute 1e-7 is far below any standard error that matters (>= 1e-3)
    assert got == pytest.approx(direct_stderr(requests), rel=1e-9, abs=1e-7)


def test_windows_are_differences_of_the_running_sums() -> None:
    first, second = [(10, 30), (20, 30)], [(5, 60), (40, 60), (12, 30), (20, 30)]
    window = moments(first + second) - moments(first)
    assert window.requests == 4 and window.accepted == 77 and window.draft_tokens == 180
    interval = window.interval()
    assert interval is not None and interval.stderr == pytest.approx(direct_stderr(second))


def test_no_interval_below_three_effective_requests_or_without_drafts() -> None:
    assert moments([(3, 9)]).interval() is None
    assert moments([(3, 9), (4, 9)]).interval() is None  # 2 effective requests
    assert moments([(3, 9), (4, 9), (1, 9)]).interval() is not None
    assert moments([(3, 9), (4, 9), (90, 300)]).interval() is None  # 3 requests, 1.2 effective
    assert RequestMoments().with_request(0, 0) == RequestMoments()
    assert RequestMoments().interval() is None


def test_the_t_quantile_is_within_1_percent_of_the_table() -> None:
    table = {2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 10: 2.228, 30: 2.042, 100: 1.984}
    for df, exact in table.items():
        assert t_975(df) == pytest.approx(exact, rel=0.008), df


def simulated_window(rng: random.Random, mean: float, c: float, n: int) -> list[tuple[int, int]]:
    """n requests of a route: each its own acceptance ~ Beta(mean c, (1 - mean) c), its own
    length, heavy-tailed as real traffic is (lognormal verify steps, median 100, 17-667: draft
    tokens 51-2,001, median 300), its steps drawn with the simulator's chain."""
    profile = Profile("x", mean, concentration=c)
    out = []
    for _ in range(n):
        p = round(profile.request_acceptance(rng), 3)  # the chain's solver caches by value
        chain = profile.conditional(K, p)
        steps = min(667, max(17, round(rng.lognormvariate(math.log(100), 0.77))))
        out.append((sum(draw(rng, chain) for _ in range(steps)), K * steps))
    return out


def coverage(c: float, n: int, seed: int, windows: int) -> tuple[float, float]:
    """How often the interval, and the token-binomial one, cover the truth over windows of n
    requests. The truth is the profile's mean: every request's steps are drawn at its own
    acceptance, whose mean is the profile's, and lengths do not depend on it, so the
    draft-token-weighted acceptance the estimator targets is that mean too."""
    rng = random.Random(seed)
    mean = 0.71
    robust = binomial = shown = 0
    for _ in range(windows):
        stats = moments(simulated_window(rng, mean, c, n))
        interval = stats.interval()
        if interval is None:
            continue
        shown += 1
        p = interval.estimate
        robust += abs(p - mean) <= interval.halfwidth
        binomial += abs(p - mean) <= 1.96 * math.sqrt(p * (1 - p) / stats.draft_tokens)
    return robust / shown, binomial / shown


@pytest.mark.parametrize("n", [5, 30])
def test_the_interval_covers_the_truth_about_95_percent(n: int) -> None:
    """One cell each of bench/coverage.py's grid (c = 15, heavy-tailed lengths): 93-97 %."""
    windows = 1500
    robust, binomial = coverage(15.0, n, seed=17, windows=windows)
    print(
        f"c=15, n={n}: the interval covers the truth in {robust:.1%} of the windows that show "
        f"one; the token-binomial interval in {binomial:.1%}"
    )
    assert 0.93 <= robust <= 0.97
    assert binomial < 0.8  # tokens are not the units: far too narrow
