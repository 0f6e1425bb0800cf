"""A route's traffic, one type for whatever sends the two routes (the demo, the tests' A/B, the
GPU bench): its prompts (a built-in scenario), how the proxy tells it (a header value or a path
prefix) and its requests' lengths.

Lengths are lognormal around the route's mean (`spread`: sigma of ln(tokens)), cut at
`LONGEST` x the mean, with the mean kept after the cut, and each request's the same on every
run (drawn from its key). One length per route would keep a closed loop's clients in step: a
route's requests would end together, and their prefills land together in the other route's
steps."""

from __future__ import annotations

import functools
import math
import random
import statistics
from dataclasses import dataclass

SPREAD = 0.6  # sigma of ln(tokens): heavy-tailed, as chat and agent turns are
LONGEST = 2  # the cut, x the mean: what a server's slot of context holds
CHAT_PATH = "/v1/chat/completions"


@dataclass(frozen=True)
class Workload:
    name: str  # the route's
    scenario: str  # its prompts: a built-in scenario (`exporter.measure.scenarios.builtin`)
    mean_tokens: int  # of a request's completion (its max_tokens, reached with ignore_eos)
    header: str | None = None  # the X-Route value that routes it, or
    path_prefix: str | None = None  # the path prefix that does
    spread: float = SPREAD  # 0: every request at the mean

    @property
    def path(self) -> str:
        """Where its chat requests go through the proxy."""
        return (self.path_prefix or "") + CHAT_PATH

    @property
    def headers(self) -> dict[str, str]:
        return {} if self.header is None else {"X-Route": self.header}

    def tokens(self, key: object) -> int:
        """The length of the request drawn from `key` (the same on every run)."""
        if self.spread <= 0:
            return self.mean_tokens
        x = random.Random(f"{self.name}/{key}").lognormvariate(self._mu, self.spread)
        return self._cut(x)

    def caps(self, n: int) -> list[int]:
        """n lengths at the spread's quantiles (j + 1/2) / n: the spread as `measure`'s fixed
        caps (one where there is no spread)."""
        if self.spread <= 0:
            return [self.mean_tokens]
        z = [statistics.NormalDist().inv_cdf((j + 0.5) / n) for j in range(n)]
        return [self._cut(math.exp(self._mu + self.spread * x)) for x in z]

    @functools.cached_property
    def _mu(self) -> float:
        """The mean of ln(tokens) that puts the cut spread's mean at `mean_tokens`."""
        sigma, cut = self.spread, math.log(LONGEST * self.mean_tokens)
        unit = statistics.NormalDist()
        low, high = -10.0, cut
        for _ in range(80):  # bisection: the cut mean rises with mu
            mu = (low + high) / 2
            mean = math.exp(mu + sigma**2 / 2) * unit.cdf((cut - mu - sigma**2) / sigma)
            mean += math.exp(cut) * (1 - unit.cdf((cut - mu) / sigma))
            low, high = (mu, high) if mean < self.mean_tokens else (low, mu)
        return (low + high) / 2

    def _cut(self, x: float) -> int:
        return max(2, min(round(x), LONGEST * self.mean_tokens))


# the two routes of the mission: real-time Japanese voice chat and an English coding agent
VOICE = Workload("voice_chat", "ja_chat", 80, header="voice")
AGENT = Workload("coding_agent", "code_agent", 200, header="agent")
WORKLOADS = (VOICE, AGENT)
