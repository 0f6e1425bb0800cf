"""Requests with realistic spread for the coverage benchmarks, drawn fast (numpy).

Each request draws its own acceptance from Beta(mean c, (1 - mean) c), its verify steps from a
heavy-tailed lognormal (median 100, sigma 0.77, clipped to 17-667: draft tokens 3 x steps,
51-2,001, median 300; the effective requests of a window are ~0.55 of them), and its accepted
drafts step by step with the simulator's own chain (exporter.sim.profiles: position i is
reached only if 0..i-1 were accepted), summed over its steps as one multinomial draw. Lengths
do not depend on acceptance, so the draft-token-weighted acceptance the interval targets,
E[a] / E[t], is the mean of the per-request acceptances: the Beta's mean (rounding to the grid
is symmetric; its bias is below 1e-6).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from exporter.sim.profiles import Profile

K = 3
GRID = 1000  # per-request acceptances are rounded to 1/GRID: the chain is solved once per value


@dataclass(frozen=True)
class Requests:
    """n requests: their accepted drafts, draft tokens and verify steps."""

    accepted: np.ndarray
    draft_tokens: np.ndarray
    steps: np.ndarray


@functools.cache
def _outcomes() -> np.ndarray:
    """P(a step accepts exactly j drafts), j = 0..K, for each acceptance on the grid."""
    table = np.zeros((GRID + 1, K + 1))
    for i in range(GRID + 1):
        chain = Profile("x", 0.5).conditional(K, i / GRID)
        reach = [1.0]
        for q in chain:
            reach.append(reach[-1] * q)
        for j in range(K + 1):
            table[i, j] = reach[j] - (reach[j + 1] if j < K else 0.0)
    return np.clip(table, 0.0, 1.0)


def draw(rng: np.random.Generator, n: int, mean: float, c: float) -> Requests:
    p = rng.beta(mean * c, (1 - mean) * c, size=n)
    grid = np.rint(p * GRID).astype(int)
    steps = np.clip(np.rint(rng.lognormal(np.log(100), 0.77, size=n)), 17, 667).astype(int)
    probs = _outcomes()[grid]
    probs /= probs.sum(axis=1, keepdims=True)
    counts = rng.multinomial(steps, probs)
    accepted = counts @ np.arange(K + 1)
    return Requests(accepted, K * steps, steps)
