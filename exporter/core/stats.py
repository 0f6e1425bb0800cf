"""Request-level statistics of acceptance: the per-request moments and the standard error they
give.

A draft token is not an independent coin flip: acceptance is correlated within a step, across
the steps of a request and across a route's requests, so the noise of a window's acceptance
comes from its requests. Treating requests as the independent units (a cluster-robust or
linearisation estimate) over the m requests of a window, with A = sum a_i accepted drafts and
T = sum t_i draft tokens:

    p = A / T,   Var(p) ~= m / (m - 1) * (S_aa - 2 p S_at + p^2 S_tt) / T^2

where S_aa = sum a_i^2, S_at = sum a_i t_i, S_tt = sum t_i^2. Every sum is additive over
requests, so each is a monotonic counter and any window's (or replica set's) p and Var(p)
follow from the counters' increases, in PromQL as here.

Small windows: weighted by draft tokens, a window behaves like fewer requests than it holds,
n_eff = T^2 / S_tt (about 0.55 m for heavy-tailed lengths), and the residuals of its long
requests are pulled toward zero by their own weight in p. With a request's spread growing with
its length (Var(a_i - p t_i) ~ s^2 t_i^2, what a per-request acceptance gives), the sum of
squared residuals has expectation s^2 (S_tt - 2 S_ttt / T + S_tt^2 / T^2), so the unbiased
small-sample factor is

    1 / (1 - 2 S_ttt / (T S_tt) + 1 / n_eff)          (S_ttt = sum t_i^3)

which is m / (m - 1) for equal lengths and larger for heavy-tailed ones; the 95 % half-width is
Student's t(0.975, n_eff - 1) times SE, not 1.96 SE. Below MIN_EFFECTIVE_REQUESTS there is no
interval at all. (m/(m-1) and 1.96 covered 53-59 % of windows at m = 2 and 83-87 % at m = 10;
this covers 93-97 % at c >= 5: docs/ALERTS.md, `bench/coverage.py`.) The estimate targets the
draft-token-weighted acceptance E[a] / E[t] of the route's requests, not their mean per-request
acceptance.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from exporter.core.fieldwise import Fieldwise

MIN_EFFECTIVE_REQUESTS = 3.0  # below: no interval (its own spread is too noisy to use)
LOW_CONFIDENCE_REQUESTS = 30  # below: an interval is shown, marked "low confidence"
Z_975 = 1.959963984540054
# Cornish-Fisher terms of t(0.975, df) in powers of 1/df: within 0.8 % of the exact quantile at
# df = 2, within 0.01 % from df = 5 (PromQL evaluates the same polynomial: dashboards/queries)
T_975_TERMS = (
    Z_975,
    (Z_975**3 + Z_975) / 4,
    (5 * Z_975**5 + 16 * Z_975**3 + 3 * Z_975) / 96,
    (3 * Z_975**7 + 19 * Z_975**5 + 17 * Z_975**3 - 15 * Z_975) / 384,
    (79 * Z_975**9 + 776 * Z_975**7 + 1482 * Z_975**5 - 1920 * Z_975**3 - 945 * Z_975) / 92160,
)


def t_975(df: float) -> float:
    """Student's t quantile at 0.975 for `df` degrees of freedom (df >= 2)."""
    return sum(term / df**power for power, term in enumerate(T_975_TERMS))


@dataclass(frozen=True, slots=True)
class Interval:
    """A window's acceptance with its 95 % interval: estimate +- halfwidth."""

    estimate: float
    stderr: float
    halfwidth: float
    effective_requests: float


@dataclass(frozen=True, slots=True)
class RequestMoments(Fieldwise):
    """Sums over the requests that proposed at least one draft token: m, A, T, the second
    moments S_aa, S_tt, S_at and S_ttt. Monotonic and additive, so windows are differences."""

    requests: float = 0.0
    accepted: float = 0.0
    draft_tokens: float = 0.0
    accepted_squared: float = 0.0
    draft_tokens_squared: float = 0.0
    accepted_times_draft_tokens: float = 0.0
    draft_tokens_cubed: float = 0.0

    def with_request(self, accepted: float, draft_tokens: float) -> RequestMoments:
        """These sums plus one request (unchanged when it proposed no draft token)."""
        if draft_tokens <= 0:
            return self
        return RequestMoments(
            self.requests + 1,
            self.accepted + accepted,
            self.draft_tokens + draft_tokens,
            self.accepted_squared + accepted * accepted,
            self.draft_tokens_squared + draft_tokens * draft_tokens,
            self.accepted_times_draft_tokens + accepted * draft_tokens,
            self.draft_tokens_cubed + draft_tokens**3,
        )

    @property
    def effective_requests(self) -> float:
        """T^2 / S_tt: how many requests of equal length would weigh as these do."""
        tt = self.draft_tokens_squared
        return self.draft_tokens * self.draft_tokens / tt if tt > 0 else 0.0

    def interval(self) -> Interval | None:
        """The cluster-robust 95 % interval of A / T over these requests, with the small-sample
        factor and Student's t of their effective number; None below MIN_EFFECTIVE_REQUESTS."""
        n_eff, total = self.effective_requests, self.draft_tokens
        if n_eff < MIN_EFFECTIVE_REQUESTS or total <= 0:
            return None
        p = self.accepted / total
        residual = (
            self.accepted_squared
            - 2 * p * self.accepted_times_draft_tokens
            + p * p * self.draft_tokens_squared
        )
        kept = 1 - 2 * self.draft_tokens_cubed / (total * self.draft_tokens_squared) + 1 / n_eff
        if kept <= 0:
            return None
        se = math.sqrt(max(0.0, residual) / kept) / total
        return Interval(p, se, t_975(n_eff - 1) * se, n_eff)
