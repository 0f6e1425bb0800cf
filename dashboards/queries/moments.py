"""Request-level statistics of a route's acceptance as PromQL, from the per-request moment
counters (exporter/core/stats.py has the same formula in Python).

Over a window, with d_x the increase of counter x between the first and the last sample in the
window (max_over_time - min_over_time, summed by route and model_name: no extrapolation, so
every sum describes the same requests, those the scrapes saw end inside the window):

    p     = d_A / d_T
    n_eff = d_T^2 / d_tt                                          (effective requests)
    kept  = 1 - 2 d_ttt / (d_T d_tt) + 1 / n_eff                  (small-sample factor: 1 / kept)
    SE    = sqrt(max(0, d_aa - 2 p d_at + p^2 d_tt) / kept) / d_T
    half-width (95 %) = t(0.975, n_eff - 1) * SE                  (none below n_eff = 3)

`rate()` or `increase()` would extrapolate each sum to the window's edges: with 15 s scrapes a
1m window's SE came out 0.84-0.87 of the true one. A window across a reset of the sidecar's
counters (a restart) has no interval. Requests are the independent units (cluster-robust), so a
window of few long requests gets the wide interval it deserves. All sums are counters: summed
across replicas first, as always. A route's drop against its own day is judged by
z = (p_1d - p) / SE, where SE is the larger of the window's own and the one the day's
per-request spread predicts for the window's requests (a few alike requests must not make a
tiny SE).
"""

from __future__ import annotations

from dashboards.queries import spec
from dashboards.queries.labels import ROUTE
from dashboards.queries.promql import by, ratio, sum_rate
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


def _delta(counter: str, window: str, sel: str = "") -> str:
    """The counter's increase between the first and the last sample in the window, summed."""
    series = f"{counter}{{{sel}}}[{window}]" if sel else f"{counter}[{window}]"
    return f"sum {by(ROUTE)} (max_over_time({series}) - min_over_time({series}))"


def _deltas(window: str) -> dict[str, str]:
    return {
        "A": _delta("specdec_route_accepted_tokens_total", window, EXACT),
        "T": _delta("specdec_route_draft_tokens_total", window, EXACT),
        "aa": _delta("specdec_route_request_accepted_tokens_squared_total", window),
        "at": _delta("specdec_route_request_accepted_times_draft_tokens_total", window),
        "tt": _delta("specdec_route_request_draft_tokens_squared_total", window),
        "ttt": _delta("specdec_route_request_draft_tokens_cubed_total", window),
        "m": _delta("specdec_route_spec_requests_total", window),
    }


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
    """d_T^2 / d_tt, the requests the window weighs as; absent across a counter reset."""
    d = _deltas(window)
    resets = f"sum {by(ROUTE)} (resets(specdec_route_spec_requests_total[{window}]))"
    return f"{d['T']} ^ 2\n/\n({d['tt']} > 0)\nunless on (route, model_name) ({resets} > 0)"


def acceptance_stderr(window: str) -> str:
    """The window's own cluster-robust SE of the exact acceptance, with the small-sample
    factor of its lengths; absent below MIN_EFFECTIVE_REQUESTS effective requests."""
    d = _deltas(window)
    n = f"({rule_name('effective_requests', 'delta', window)} >= {MIN_EFFECTIVE_REQUESTS:g})"
    p = f"({d['A']}\n/ ({d['T']} > 0))"
    residual = f"(\n{d['aa']}\n- 2 * {p} * {d['at']}\n+ {p} ^ 2 * {d['tt']}\n)"
    kept = f"(1 - 2 * {d['ttt']} / ({d['T']} * {d['tt']}) + on (route, model_name) 1 / {n})"
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
    d = _deltas(window)
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
