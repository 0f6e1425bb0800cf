"""What a span of an engine's counters means, in one place: per series (model_name, rank) the
work done over it and that work's figures by vLLM's definitions (`core.counts.ratios`:
acceptance, tokens per verify step, per position), each model's ranks summed, and every series
summed. The sidecar's live windows (`TargetState.read`, which the target collector formats and
the demo prints) and the offline delta of two saved pages (`specdec derive`, `measure`) read a
span through `read_span`; neither recomputes any part of it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from exporter.core.counts import Counts, ratios, total
from exporter.scrape.families import SeriesKey

ALL_RANKS = "all"  # the rank of a model's figures summed over its ranks (`engine="all"`)


@dataclass(frozen=True, slots=True)
class Figures:
    """One series' work over a span, and what it means; a ratio is None where its denominator
    is zero or not counted (no traffic is not 0 %)."""

    model_name: str  # "" for `Span.total`
    rank: str  # ALL_RANKS: the model's ranks summed; "" for `Span.total`
    counts: Counts
    acceptance: float | None
    mean_acceptance_length: float | None  # tokens per verify step
    per_position: tuple[float, ...] | None


@dataclass(frozen=True, slots=True)
class Span:
    """The work over one span, three ways."""

    series: tuple[Figures, ...]  # each series, in the order given
    by_model: tuple[Figures, ...]  # per model_name, its ranks summed (rank ALL_RANKS)
    total: Figures  # every series summed


def figures(counts: Counts, model_name: str = "", rank: str = "") -> Figures:
    r = ratios(counts)
    return Figures(model_name, rank, counts, r.acceptance, r.mean_acceptance_length, r.per_position)


def read_span(work: Mapping[SeriesKey, Counts]) -> Span:
    """The span's figures from each series' work over it."""
    by_model: dict[str, list[Counts]] = {}
    for (model_name, _), counts in work.items():
        by_model.setdefault(model_name, []).append(counts)
    return Span(
        tuple(figures(counts, model_name, rank) for (model_name, rank), counts in work.items()),
        tuple(figures(total(items), model, ALL_RANKS) for model, items in by_model.items()),
        figures(total(list(work.values()))),
    )


NO_WORK = read_span({})  # the work of a window whose reader asked for its batch only
