"""A phase's decode in its steady span as seconds per step, and replicates pooled where they
agree: the A/B truth's rule for its rounds (the closest two agree, an outlier is named and never
averaged in), which `measure` holds each level's speculative and plain phases to
(`exporter/measure/curve.py`)."""

from __future__ import annotations

import itertools
import math
import statistics
from dataclasses import dataclass

AGREE = 0.05  # two replicates agree when their seconds per step are within this share


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


def agreeing(figures: list[float | None]) -> list[int]:
    """The replicates a side's figure pools: with three or more, the closest two and any
    other within AGREE of their mean (the A/B's rule: an outlier named, never averaged in);
    with fewer, all that have a figure."""
    have = [i for i, f in enumerate(figures) if f is not None]
    if len(have) < 3:
        return have
    values = {i: figures[i] or 0.0 for i in have}
    ordered = sorted(have, key=values.__getitem__)
    a, b = min(itertools.pairwise(ordered), key=lambda ab: values[ab[1]] - values[ab[0]])
    centre = (values[a] + values[b]) / 2
    return [i for i in have if i in (a, b) or abs(values[i] / centre - 1) <= AGREE]


def agree(figures: list[float | None]) -> bool:
    """Whether two of a side's figures are within AGREE of each other (one figure: no)."""
    values = sorted(f for f in figures if f is not None)
    return any(hi / lo - 1 <= AGREE for lo, hi in itertools.pairwise(values) if lo > 0)


def replicate_error(figures: list[float]) -> float | None:
    """The standard error of the pooled figure as a share of it, from the replicates' spread."""
    if len(figures) < 2:
        return None
    return statistics.stdev(figures) / math.sqrt(len(figures)) / statistics.fmean(figures)
