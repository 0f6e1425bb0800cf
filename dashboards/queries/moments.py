"""Request-level statistics of a route's acceptance as PromQL, from the per-request moment
counters (exporter/core/stats.py has the same formula in Python).

Over a window of w seconds, with r_x = sum by (route, model_name) (rate(x[w])) of the exact
counters and m the requests in the window:

    p  = r_A / r_T
    SE = sqrt(m / (m - 1) * max(0, r_aa - 2 p r_at + p^2 r_tt) / w) / r_T

Requests are the independent units (cluster-robust), so a window of few long requests gets
the wide interval it deserves. All sums are counters: summed across replicas first, as always.
A route's drop against its own day is judged by z = (p_1d - p) / SE, where SE is the larger of
the window's own and the one the day's per-request spread predicts for the window's m requests
(a few alike requests must not make a tiny SE).
"""

from __future__ import annotations

from dashboards.mixin import seconds
from dashboards.promql import by, ratio, sum_rate
from dashboards.selectors import ROUTE

LEVEL = "route_model_name"
EXACT = 'source="exact"'


def rule(figure: str, op: str, window: str) -> str:
    """The recorded name of a figure, e.g. rule("exact_acceptance", "ratio_rate", "1m")."""
    return f"{LEVEL}:specdec_route_{figure}:{op}{window}"


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


def acceptance_stderr(window: str) -> str:
    """The window's own cluster-robust SE of the exact acceptance (needs m >= 2)."""
    p, m = rule("exact_acceptance", "ratio_rate", window), rule("spec_requests", "increase", window)
    total = _moments(window)["T"]
    return (
        f"sqrt(\n  clamp_min({residual(p, window)}, 0) / {seconds(window)}\n"
        f"  * {m} / ({m} - 1 > 0)\n)\n/ ({total} > 0)"
    )


def residual_variance_1d() -> str:
    """The day's per-request variance of a_i - p t_i (p the day's acceptance): what one
    request adds to a window's sum of squares when nothing has changed."""
    p = rule("exact_acceptance", "ratio_rate", "1d")
    return f"{residual(p, '1d')}\n/\n({_moments('1d')['m']} > 0)"


def baseline_stderr(window: str) -> str:
    """The SE the day's per-request spread predicts for the window's m requests:
    sqrt(m q) / T, T the window's draft tokens."""
    m = rule("spec_requests", "increase", window)
    q = rule("request_residual_variance", "ratio_rate", "1d")
    total = _moments(window)["T"]
    return f"sqrt({m} * on (route, model_name) {q})\n/ ({total} * {seconds(window)} > 0)"


def drop_zscore(window: str) -> str:
    """(day's acceptance - window's) / the larger of the window's own and predicted SE."""
    own = rule("acceptance_stderr", "rate", window)
    predicted = rule("acceptance_stderr_baseline", "rate", window)
    p, p0 = (rule("exact_acceptance", "ratio_rate", w) for w in (window, "1d"))
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
