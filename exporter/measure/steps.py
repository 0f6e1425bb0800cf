"""A phase's decode in its steady span as seconds per step, and a level's replicates read as one
figure (`exporter/measure/curve.py` runs them, spread over the run).

The estimator is the fastest cluster: the fastest replicate and every other within TIE of it,
pooled (`fastest`). A disturbance of a phase on a real engine only ever adds time (a slow mode
of a start, a neighbour, a drain that runs long; nothing makes a step faster than the engine
can run it), so the fastest replicates are the nearest to the step the engine runs
undisturbed. On the GPU bench (2026-12-06, one H200, docs/BENCHMARKS.md), measure's plain
step at c = 16 read 15.59 ms in one start and 14.25 in the next, 9 % apart, though each run's
agreeing replicates were within ~1 %: in the first, two replicates ran in a slow mode and agreed
with each other, and the rule "the closest two agree" pooled them and left out the one at
x0.93, the one nearest the A/B's own plain step (13.8 ms). The mean, the median and the closest
pair all follow a slow mode that holds two of three replicates; the fastest cluster does not.
Its own bias is the other way and bounded by a phase's noise (the GPU's replicates within
~1 %, TIE 3 %: at most ~TIE / 2 low, where a slow mode puts the mean 7-13 % high).

The error covers the run: `spread` is the largest distance of any replicate, kept or not, from
the figure (at least twice the kept ones' standard error), so a live engine in a slow mode
that measure also met reads inside it."""

from __future__ import annotations

import itertools
import math
import statistics
from dataclasses import dataclass

AGREE = 0.05  # two replicates agree when their seconds per step are within this share
TIE = 0.03  # replicates within this share of the fastest are of its mode: pooled with it


@dataclass(frozen=True, slots=True)
class Steady:
    """A phase's decode in its steady span (steps and draft tokens None: not counted)."""

    tokens: float
    seconds: float
    steps: float | None
    draft_tokens: float | None
    context: float | None  # tokens a decoding request held in its KV, time-weighted


def pooled(parts: list[Steady]) -> Steady:
    """Phases' steady spans as one: their decode summed, the context by seconds."""
    counted = all(p.steps is not None for p in parts)
    known = [p for p in parts if p.context is not None]
    weight = sum(p.seconds for p in known)
    return Steady(
        sum(p.tokens for p in parts),
        sum(p.seconds for p in parts),
        sum(p.steps or 0.0 for p in parts) if counted else None,
        sum(p.draft_tokens or 0.0 for p in parts) if counted else None,
        sum(p.context * p.seconds for p in known if p.context) / weight if weight else None,
    )


def per_step(d: Steady, plain: bool) -> float | None:
    """Seconds per step (a plain step makes one token); None where nothing was counted."""
    per = d.tokens if plain else d.steps
    return d.seconds / per if per and d.seconds else None


def fastest(figures: list[float | None]) -> list[int]:
    """The replicates a side's figure pools: the fastest (fewest seconds a step) and every
    other within TIE of it; a replicate without a figure has nothing to pool."""
    have = [i for i, f in enumerate(figures) if f is not None and f > 0]
    if not have:
        return []
    low = min(figures[i] or 0.0 for i in have)
    return [i for i in have if (figures[i] or 0.0) <= low * (1 + TIE)]


def agree(figures: list[float | None]) -> bool:
    """Whether two of a side's figures are within AGREE of each other (one figure: no)."""
    values = sorted(f for f in figures if f is not None)
    return any(hi / lo - 1 <= AGREE for lo, hi in itertools.pairwise(values) if lo > 0)


def spread(figure: float, figures: list[float], error: float | None) -> float | None:
    """The error that covers the whole run: the largest distance of any replicate's figure
    from `figure`, as a share of it, at least twice `error` (the kept ones' standard error);
    None with one replicate and no error."""
    if figure <= 0:
        return None
    far = max((abs(f / figure - 1) for f in figures if f > 0), default=0.0)
    if len(figures) < 2 and error is None:
        return None
    return max(far, 2 * (error or 0.0))


def replicate_error(figures: list[float]) -> float | None:
    """The standard error of the pooled figure as a share of it, from the replicates' spread."""
    if len(figures) < 2:
        return None
    return statistics.stdev(figures) / math.sqrt(len(figures)) / statistics.fmean(figures)
