"""Restart-safe running sums of engine counters.

vLLM's counters restart from zero with the engine. The sidecar keeps its own sums, fed with
the increase since the previous scrape, so its counters never decrease and `rate()` over them
equals the engine's work even when Prometheus never saw the restart. A restart is a counter
that went down or a changed `_created` stamp; the increase since a restart is the new value.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from exporter.core.counts import Counts
from exporter.scrape.families import Page, RawSeries, SeriesKey


@dataclass(slots=True)
class SeriesTotals:
    """Running sums for one (model_name, rank) series."""

    last: RawSeries
    counts: Counts
    rejected: float | None  # a running maximum; None while no draft tokens are counted
    restarts: int = 0
    first: RawSeries = field(default_factory=lambda: RawSeries(Counts(), ()))

    @property
    def since_first_sight(self) -> Counts:
        """The work done since the sidecar first saw the series (its running sum started at the
        engine's lifetime value then)."""
        return self.counts - self.first.counts


class RunningTotals:
    """Running sums per series of one target, fed one page at a time."""

    def __init__(self) -> None:
        self.series: dict[SeriesKey, SeriesTotals] = {}

    def feed(self, page: Page) -> list[SeriesKey]:
        """Add the page's increases to the sums; return the series that restarted."""
        restarted = []
        for key, raw in page.series.items():
            totals = self.series.get(key)
            if totals is None:  # first sight: the engine's lifetime value is our starting point
                self.series[key] = SeriesTotals(raw, raw.counts, raw.counts.rejected, first=raw)
                continue
            restart = is_restart(totals.last, raw)
            if not restart and len(raw.counts.per_position) < len(totals.last.counts.per_position):
                continue  # positions vanished without a restart: an incomplete page, wait
            increase = raw.counts if restart else raw.counts - totals.last.counts
            if restart:
                totals.restarts += 1
                restarted.append(key)
            totals.last = raw
            totals.counts = totals.counts + increase
            # a torn read (draft tokens counted before accepted) must not make this go down, nor
            # leave it too high for good once the read is whole (summing clipped increases did)
            now = totals.counts.rejected
            totals.rejected = None if now is None else max(totals.rejected or 0.0, now)
        return restarted

    def snapshot(self) -> dict[SeriesKey, Counts]:
        return {key: totals.counts for key, totals in self.series.items()}


def is_restart(before: RawSeries, after: RawSeries) -> bool:
    """True when any counter went down or any `_created` stamp seen in both pages changed."""
    b, a = before.counts, after.counts
    pairs = (
        (a.draft_tokens, b.draft_tokens),
        (a.accepted, b.accepted),
        (a.drafts, b.drafts),
        (a.generated, b.generated),
    )
    if any(x is not None and y is not None and x < y for x, y in pairs):
        return True
    if any(x < y for x, y in zip(a.per_position, b.per_position, strict=False)):
        return True
    stamps = dict(before.created)
    return any(name in stamps and stamps[name] != value for name, value in after.created)
