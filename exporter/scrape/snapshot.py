"""One reading of a target, as a scrape of the sidecar shows it: its health, its running sums,
the engine's own gauges, its batch and every window's figures, copied at one instant into values
nobody can change (`TargetState.read`). The target collector formats one per target per scrape,
and the route collector and the demo take the engine's batch from it; none reaches into the
state, nor holds one across reads (the accounting's side is `accounting/snapshot.py`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from exporter.core.counts import Counts
from exporter.core.payoff import Batch
from exporter.core.windows import Window
from exporter.scrape.families import SeriesKey
from exporter.scrape.figures import Span


@dataclass(frozen=True, slots=True)
class SeriesSums:
    """One series' restart-safe running sums."""

    counts: Counts
    rejected: float | None  # None while no draft tokens are counted
    restarts: int


@dataclass(frozen=True, slots=True)
class TargetWindow:
    """One window ending at the reading's instant."""

    window: Window
    covered: float  # seconds of it the history covers (the window's length once full)
    work: Span  # the engine's work over it and its figures (`scrape.figures`); NO_WORK: unasked
    running: Mapping[str, float]  # per model_name, the mean batch its running requests saw


@dataclass(frozen=True, slots=True)
class TargetSnapshot:
    """A target at one instant."""

    name: str
    up: bool | None  # None until the first scrape ends
    last_duration: float | None
    errors: Mapping[str, int]  # failed scrapes by reason
    bad_lines: int
    series: Mapping[SeriesKey, SeriesSums]
    batch: Mapping[SeriesKey, Batch]  # running requests integrated over time
    gauges: Mapping[SeriesKey, Mapping[str, float]]  # the engine's own, last page
    curved: frozenset[str]  # the model_names with a step-time curve
    windows: tuple[TargetWindow, ...]

    def running(self, window: Window) -> Mapping[str, float]:
        """Per model_name, the engine's mean batch over `window` (empty: not one of its)."""
        return next((w.running for w in self.windows if w.window == window), {})
