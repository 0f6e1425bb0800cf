"""A /metrics page read for one engine's speculative-decoding series (`engines/`: which
families, and how a series of them reads as Counts), grouped by (model_name, rank), with its
bad lines counted. The engine's own gauges (acceptance length, the batch) ride along as gauges.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from exporter.core.counts import Counts
from exporter.engines import engine
from exporter.engines.base import RUNNING, EngineFamilies, Role
from exporter.scrape.exposition import scan

__all__ = ["RUNNING", "EngineFamilies", "Role", "families", "read_page"]


def families(kind: str, prefix: str | None = None) -> EngineFamilies:
    """The families of engine `kind` under `prefix` (the engine's own prefix when None)."""
    return engine(kind).families(prefix)


SeriesKey = tuple[str, str]
"""(model_name, rank): the labels vLLM puts on its spec-decode counters. The rank is the value
of the engine's own `engine` label (its data-parallel rank), passed through: not an `Engine`."""

MAX_POSITIONS = 32  # k beyond this is not a real deployment: treat as garbage, bound cardinality
MAX_SERIES = 64  # per target page, for the same reason


@dataclass(frozen=True, slots=True)
class RawSeries:
    """One series' counter values as the engine reports them, plus their `_created` stamps."""

    counts: Counts
    created: tuple[tuple[str, float], ...]


@dataclass(frozen=True, slots=True)
class Page:
    """The spec-decode series found on one /metrics page."""

    series: dict[SeriesKey, RawSeries]
    bad_lines: int
    gauges: dict[SeriesKey, dict[str, float]] = field(default_factory=dict)  # engine's own


def read_page(text: str, fams: EngineFamilies, model: str = "") -> Page:
    """Group the page's samples of `fams` by (model_name, rank); bad samples are counted.
    `model`: the model_name of samples without one (an engine serving one model unlabelled)."""
    found = scan(text, (fams.lead, *(g for g, _ in fams.gauges if not g.startswith(fams.lead))))
    grouped = _Grouped(fams, found.bad_lines)
    own = dict(fams.gauges)
    classify, counter = fams.classify, grouped.counter  # once per page, not per sample
    for sample in found.samples:
        name = sample.name
        if name in own:
            labels = dict(sample.labels)
            key = (labels.get("model_name") or model, labels.get("engine", ""))
            if sample.value == sample.value:  # NaN: nothing reported
                grouped.gauges.setdefault(key, {}).setdefault(own[name], []).append(sample.value)
            continue
        kind = classify(name)
        if kind is not None:
            labels = dict(sample.labels)
            key = (labels.get("model_name") or model, labels.get("engine", ""))
            counter(key, labels, kind[0], kind[1], sample.value)
    return grouped.page()


class _Grouped:
    """One page's counter samples per series as they are read, then checked into a Page."""

    def __init__(self, fams: EngineFamilies, bad: int) -> None:
        self.fams, self.bad = fams, bad
        self.values: dict[SeriesKey, dict[str, float]] = {}
        self.positions: dict[SeriesKey, dict[int, float]] = {}
        self.drafted: dict[SeriesKey, dict[int, float]] = {}  # TensorRT-LLM's, per position
        self.created: dict[SeriesKey, list[tuple[str, float]]] = {}
        self.broken: set[SeriesKey] = set()  # a bad sample leaves its series incomplete
        self.gauges: dict[SeriesKey, dict[str, list[float]]] = {}  # every rank's value

    def counter(
        self, key: SeriesKey, labels: dict[str, str], role: Role, is_created: bool, value: float
    ) -> None:
        if key not in self.values:
            if len(self.values) >= MAX_SERIES:
                self.bad += 1
                return
            self.values[key], self.positions[key], self.drafted[key] = {}, {}, {}
            self.created[key] = []
        per_position = role in (Role.PER_POSITION, Role.DRAFTED_PER_POSITION)
        position = _position(labels.get(self.fams.position_label)) if per_position else None
        if per_position and position is None:
            self.bad += 1
            self.broken.add(key)
        elif is_created:
            self.created[key].append((f"{role}{'' if position is None else position}", value))
        elif not (value >= 0 and value != float("inf")):
            self.bad += 1  # a counter is finite and non-negative; NaN fails the >= test too
            self.broken.add(key)
        elif position is not None:
            into = self.drafted if role is Role.DRAFTED_PER_POSITION else self.positions
            into[key][position] = value
        elif self.fams.engine.sums_series_labels:  # summed over its other labels
            self.values[key][role] = self.values[key].get(role, 0.0) + value
        else:
            self.values[key][role] = value

    def page(self) -> Page:
        engine = self.fams.engine
        series = {}
        for key, vals in self.values.items():
            if key in self.broken:  # counted; the rest would pass a bad last position off as k-1
                continue
            if not engine.speculates(vals):
                continue
            counts = engine.series_counts(vals, self.positions[key], self.drafted[key])
            if counts is None:
                self.bad += 1  # an incomplete series (truncated page) would look like a restart
                continue
            series[key] = RawSeries(counts, tuple(sorted(self.created[key])))
        # one figure per series: the mean over the scheduler ranks (SGLang: tp/pp/dp) reporting it
        means = {
            key: {name: sum(vs) / len(vs) for name, vs in found.items()}
            for key, found in self.gauges.items()
            if key in series
        }
        return Page(series, self.bad, means)


def _position(text: str | None) -> int | None:
    # isdigit() alone admits "²" (int() rejects it) and int() rejects > 4300 digits: both raised
    if text is None or not (text.isascii() and text.isdigit()) or len(text) > 9:
        return None
    return int(text) if int(text) < MAX_POSITIONS else None
