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
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RequestMoments:
    """Sums over the requests that proposed at least one draft token: m, A, T and the second
    moments S_aa, S_tt, S_at. Monotonic and additive, so windows are differences."""

    requests: float = 0.0
    accepted: float = 0.0
    draft_tokens: float = 0.0
    accepted_squared: float = 0.0
    draft_tokens_squared: float = 0.0
    accepted_times_draft_tokens: float = 0.0

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
        )

    def __sub__(self, other: RequestMoments) -> RequestMoments:
        return RequestMoments(
            self.requests - other.requests,
            self.accepted - other.accepted,
            self.draft_tokens - other.draft_tokens,
            self.accepted_squared - other.accepted_squared,
            self.draft_tokens_squared - other.draft_tokens_squared,
            self.accepted_times_draft_tokens - other.accepted_times_draft_tokens,
        )

    def stderr(self) -> float | None:
        """The cluster-robust standard error of A / T over these requests; None below two
        requests (no spread to estimate)."""
        m, total = self.requests, self.draft_tokens
        if m < 2 or total <= 0:
            return None
        p = self.accepted / total
        residual = (
            self.accepted_squared
            - 2 * p * self.accepted_times_draft_tokens
            + p * p * self.draft_tokens_squared
        )
        return math.sqrt(m / (m - 1) * max(0.0, residual)) / total
