"""Request-level statistics of a route's acceptance as PromQL, from the per-request moment
counters (exporter/core/stats.py has the same formula in Python).

Over a window, with d_x the increase of counter x between the first and the last sample in the
window (last_over_time - min_over_time, summed by route and model_name: no extrapolation, so
every sum describes the same requests, those the scrapes saw end inside the window):

    p     = d_A / d_T
    n_eff = d_T^2 / d_tt                                          (effective requests)
    kept  = 1 - 2 d_ttt / (d_T d_tt) + 1 / n_eff                  (small-sample factor: 1 / kept)
    SE    = sqrt(max(0, d_aa - 2 p d_at + p^2 d_tt) / kept) / d_T
    half-width (95 %) = t(0.975, n_eff - 1) * SE                  (none below n_eff = 3)

`rate()` or `increase()` would extrapolate each sum to the window's edges: with 15 s scrapes a
1m window's SE came out 0.84-0.87 of the true one. A sidecar whose counters reset in the window
(a restart) counts from the reset, the other sidecars the whole window: every counter of a
sidecar restarts together, so each sum still describes the same requests, and one replica's
restart never blinds the fleet's interval. Requests are the independent units (cluster-robust), so a
window of few long requests gets the wide interval it deserves. All sums are counters: summed
across replicas first, as always. A route's drop against its own day is judged by
z = (p_1d - p) / SE, where SE is the larger of the window's own and the one the day's
per-request spread predicts for the window's requests (a few alike requests must not make a
tiny SE).
"""

from __future__ import annotations

from dashboards.queries import spec
from dashboards.queries.labels import ROUTE
from dashboards.queries.promql import by, rate, ratio, sum_rate
from exporter.core.stats import MIN_EFFECTIVE_REQUESTS, T_975_TERMS

EXACT = 'source="exact"'


def rule_name(figure: str, op: str, window: str) -> str:
    """A route figure's recorded name, e.g. rule_name("exact_acceptance", "ratio_rate", "1m")."""
    return spec.ROUTES.rule_name(figure, f"{op}{window}")


def _rate(counter: str, window: str, sel: str = "") -> str:
    return sum_rate(counter, window, ROUTE, sel)


def _moments(window: str, sel: str = "") -> dict[str, str]:
    join = f"{sel}, " if sel else ""
    return {
        "A": _rate("specdec_route_accepted_tokens_total", window, f"{join}{EXACT}"),
        "T": _rate("specdec_route_draft_tokens_total", window, f"{join}{EXACT}"),
        "aa": _rate("specdec_route_request_accepted_tokens_squared_total", window, sel),
        "at": _rate("specdec_route_request_accepted_times_draft_tokens_total", window, sel),
        "tt": _rate("specdec_route_request_draft_tokens_squared_total", window, sel),
        "m": _rate("specdec_route_spec_requests_total", window, sel),
    }


def _delta(counter: str, window: str, sel: str = "", grouping: str = by(ROUTE)) -> str:
    """The counter's increase between the first and the last sample in the window, per series
    (one that reset in it: its last value, the increase since the reset), summed. Three scans
    of the window and one-to-one arithmetic: a counter's last sample is its largest until it
    resets, and the first is subtracted only where it did not."""
    series = f"{counter}{{{sel}}}[{window}]" if sel else f"{counter}[{window}]"
    return (
        f"sum {grouping} (\n  last_over_time({series})\n"
        f"  - min_over_time({series}) * (resets({series}) == bool 0)\n)"
    )


# The moment sums by key: (counter, selector, the recorded figure of its per-route delta).
_SUMS = {
    "A": ("specdec_route_accepted_tokens_total", EXACT, "exact_accepted_tokens"),
    "T": ("specdec_route_draft_tokens_total", EXACT, "exact_draft_tokens"),
    "aa": (
        "specdec_route_request_accepted_tokens_squared_total",
        "",
        "request_accepted_tokens_squared",
    ),
    "at": (
        "specdec_route_request_accepted_times_draft_tokens_total",
        "",
        "request_accepted_times_draft_tokens",
    ),
    "tt": ("specdec_route_request_draft_tokens_squared_total", "", "request_draft_tokens_squared"),
    "ttt": ("specdec_route_request_draft_tokens_cubed_total", "", "request_draft_tokens_cubed"),
    "m": ("specdec_route_spec_requests_total", "", "spec_requests"),
}
STDERR_SUMS = ("A", "T", "aa", "at", "tt", "ttt")  # what a window's own SE reads; "m" the drop's


def _deltas(window: str, grouping: str) -> dict[str, str]:
    """Every moment sum over the window, inline (grouped `grouping`)."""
    return {key: _delta(c, window, sel, grouping) for key, (c, sel, _) in _SUMS.items()}


def delta_rule(key: str, window: str) -> str:
    """The recorded name of a moment sum's per-route delta over the window."""
    return rule_name(_SUMS[key][2], "delta", window)


def window_delta(key: str, window: str) -> str:
    """A moment sum's per-route delta over the window, to record: each is read several times
    by the SE, its effective requests and the drop's z-score, and a reset-aware delta scans
    the window five times, so inline they made the route group's evaluation twice as long."""
    counter, sel, _ = _SUMS[key]
    return _delta(counter, window, sel)


def _recorded(window: str) -> dict[str, str]:
    return {key: delta_rule(key, window) for key in _SUMS}


def exact_acceptance(window: str, sel: str = "") -> str:
    """Accepted / draft tokens of the requests with per-request objects (the ones with moments)."""
    r = _moments(window, sel)
    return ratio(r["A"], r["T"])


def spec_requests(window: str, sel: str = "") -> str:
    """Requests with at least one draft token that ended in the window (m)."""
    selector = f"{{{sel}}}" if sel else ""
    return f"sum {by(ROUTE)} (increase(specdec_route_spec_requests_total{selector}[{window}]))"


def residual(p: str, window: str, sel: str = "") -> str:
    """r_aa - 2 p r_at + p^2 r_tt: the window's sum of (a_i - p t_i)^2, per second."""
    r = _moments(window, sel)
    return f"(\n{r['aa']}\n- 2 * {p} * {r['at']}\n+ {p} ^ 2 * {r['tt']}\n)"


def effective_requests(window: str) -> str:
    """d_T^2 / d_tt, the requests the window weighs as."""
    d = _recorded(window)
    return f"{d['T']} ^ 2\n/\n({d['tt']} > 0)"


def acceptance_stderr(window: str) -> str:
    """The window's own cluster-robust SE of the exact acceptance, with the small-sample
    factor of its lengths; absent below MIN_EFFECTIVE_REQUESTS effective requests."""
    n = f"({rule_name('effective_requests', 'delta', window)} >= {MIN_EFFECTIVE_REQUESTS:g})"
    return _stderr(_recorded(window), n, "on (route, model_name) ")


def _stderr(d: dict[str, str], n: str, match: str = "") -> str:
    """The SE from the window's sums `d` and its effective requests `n` (matched `match`)."""
    p = f"({d['A']}\n/ ({d['T']} > 0))"
    residual = f"(\n{d['aa']}\n- 2 * {p} * {d['at']}\n+ {p} ^ 2 * {d['tt']}\n)"
    kept = f"(1 - 2 * {d['ttt']} / ({d['T']} * {d['tt']}) + {match}1 / {n})"
    return f"sqrt(\n  clamp_min({residual}, 0)\n  / ({kept} > 0)\n)\n/ ({d['T']} > 0)"


def ci_halfwidth(window: str) -> str:
    """t(0.975, n_eff - 1) x SE: Student's quantile by its Cornish-Fisher series in 1 / df
    (the same terms as exporter/core/stats.py)."""
    df = f"({rule_name('effective_requests', 'delta', window)} - 1)"
    terms = " + ".join(
        f"{term:.10g}" if power == 0 else f"{term:.10g} / {df} ^ {power}"
        for power, term in enumerate(T_975_TERMS)
    )
    return f"({terms})\n* on (route, model_name) {rule_name('acceptance_stderr', 'rate', window)}"


def residual_variance_1d() -> str:
    """The day's per-request variance of a_i - p t_i (p the day's acceptance): what one
    request adds to a window's sum of squares when nothing has changed."""
    p = rule_name("exact_acceptance", "ratio_rate", "1d")
    return f"{residual(p, '1d')}\n/\n({_moments('1d')['m']} > 0)"


def baseline_stderr(window: str) -> str:
    """The SE the day's per-request spread predicts for the window's requests: sqrt(d_m q) /
    d_T, from the same samples as the window's own SE."""
    d = _recorded(window)
    q = rule_name("request_residual_variance", "ratio_rate", "1d")
    return f"sqrt({d['m']} * on (route, model_name) {q})\n/ ({d['T']} > 0)"


def drop_zscore(window: str) -> str:
    """(day's acceptance - window's) / the larger of the window's own and predicted SE."""
    own = rule_name("acceptance_stderr", "rate", window)
    predicted = rule_name("acceptance_stderr_baseline", "rate", window)
    p, p0 = (rule_name("exact_acceptance", "ratio_rate", w) for w in (window, "1d"))
    return f"({p0} - on (route, model_name) {p})\n/ on (route, model_name)\n(({own} >= {predicted}) or {predicted})"


def share(counter: str, window: str, sel: str = "") -> str:
    """Requests of a kind (a counter of them) / the requests with drafts, over the window."""
    return ratio(
        _rate(counter, window, sel), _rate("specdec_route_spec_requests_total", window, sel)
    )


def collapsed_share(window: str, sel: str = "", below: str = "0.05") -> str:
    """Share of requests whose own acceptance is at most `below` (a histogram bucket bound)."""
    join = f"{sel}, " if sel else ""
    return ratio(
        _rate("specdec_route_request_acceptance_ratio_bucket", window, f'{join}le="{below}"'),
        _rate("specdec_route_request_acceptance_ratio_count", window, sel),
    )


# --- per replica: SpecDecodeAcceptanceDrop's second half ----------------------------------
# A replica is every label a sidecar's series carries but `source`: the target's (job,
# instance, pod, ...) and the Prometheus server's external ones (cluster, ...), whatever the
# deployment names them. Nothing is recorded per replica: no series multiply by replicas.
REPLICA = "without (source)"


def replica_relative_drop(window: str) -> str:
    """Per replica: (the route's 1-day acceptance over the fleet - the replica's own over the
    window) / the former."""
    p0 = rule_name("exact_acceptance", "ratio_rate", "1d")
    return f"{_replica_gap(window)}\n/ on (route, model_name) group_left () {p0}"


def _replica_gap(window: str) -> str:
    p0 = rule_name("exact_acceptance", "ratio_rate", "1d")
    accepted = rate("specdec_route_accepted_tokens_total", window, EXACT)
    drafted = rate("specdec_route_draft_tokens_total", window, EXACT)
    own = ratio(f"sum {REPLICA} ({accepted})", f"sum {REPLICA} ({drafted})")
    return f"({p0} - on (route, model_name) group_right () (\n{own}\n))"


def replica_requests(window: str) -> str:
    return f"sum {REPLICA} (increase(specdec_route_spec_requests_total[{window}]))"


def replica_drop(window: str, fraction: float, z: float, min_requests: int) -> str:
    """Per replica, the fleet's drop test on the replica's own requests: its acceptance more
    than `fraction` below the route's 1-day level over the fleet, by more than `z` standard
    errors (the larger of its window's own and the one the fleet's day predicts for its
    requests, as `drop_zscore`) over at least `min_requests` requests. One replica with a
    broken drafter among many moves the fleet's figure too little to page; for one replica
    this is the fleet's test."""
    d = _deltas(window, REPLICA)
    n = f"(({d['T']} ^ 2\n/\n({d['tt']} > 0)) >= {MIN_EFFECTIVE_REQUESTS:g})"
    own = _stderr(d, n)
    q = rule_name("request_residual_variance", "ratio_rate", "1d")
    predicted = f"sqrt({d['m']} * on (route, model_name) group_left () {q})\n/ ({d['T']} > 0)"
    gap = _replica_gap(window)
    # gap / max(own, predicted) > z, as gap / predicted > z unless gap / own <= z (own absent
    # below the effective requests): each SE evaluated once, not the larger one twice
    return (
        f"{replica_relative_drop(window)} > {fraction}\n"
        f"and\n{gap}\n/ (\n{predicted}\n) > {z}\n"
        f"unless\n{gap}\n/ (\n{own}\n) <= {z}\n"
        f"and\n{replica_requests(window)} >= {min_requests}"
    )
