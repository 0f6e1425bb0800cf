"""A /metrics page read for one engine's speculative-decoding series (`engines/`: which
families, and how a series of them reads as Counts), grouped by (model_name, engine), with its
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
"""(model_name, engine) — the labels vLLM puts on its spec-decode counters."""

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


def read_page(text: str, fams: EngineFamilies) -> Page:
    """Group the page's samples of `fams` by (model_name, engine); bad samples are counted."""
    found = scan(text, (fams.lead, *(g for g, _ in fams.gauges if not g.startswith(fams.lead))))
    bad = found.bad_lines
    values: dict[SeriesKey, dict[str, float]] = {}
    positions: dict[SeriesKey, dict[int, float]] = {}
    drafted: dict[SeriesKey, dict[int, float]] = {}  # TensorRT-LLM's drafted tokens per position
    created: dict[SeriesKey, list[tuple[str, float]]] = {}
    broken: set[SeriesKey] = set()  # a bad sample leaves its series incomplete
    gauges: dict[SeriesKey, dict[str, list[float]]] = {}  # every rank's value, averaged below
    own = dict(fams.gauges)
    for sample in found.samples:
        if sample.name in own and sample.value == sample.value:  # NaN: nothing reported
            labels = dict(sample.labels)
            key = (labels.get("model_name", ""), labels.get("engine", ""))
            gauges.setdefault(key, {}).setdefault(own[sample.name], []).append(sample.value)
            continue
        kind = fams.classify(sample.name)
        if kind is None:
            continue
        role, is_created = kind
        labels = dict(sample.labels)
        key = (labels.get("model_name", ""), labels.get("engine", ""))
        if key not in values:
            if len(values) >= MAX_SERIES:
                bad += 1
                continue
            values[key], positions[key], drafted[key], created[key] = {}, {}, {}, []
        per_position = role in (Role.PER_POSITION, Role.DRAFTED_PER_POSITION)
        position = _position(labels.get(fams.position_label)) if per_position else None
        if per_position and position is None:
            bad += 1
            broken.add(key)
        elif is_created:
            created[key].append((f"{role}{'' if position is None else position}", sample.value))
        elif not (sample.value >= 0 and sample.value != float("inf")):
            bad += 1  # a counter is finite and non-negative; NaN fails the >= test too
            broken.add(key)
        elif position is not None:
            (drafted if role is Role.DRAFTED_PER_POSITION else positions)[key][position] = (
                sample.value
            )
        elif fams.engine.sums_series_labels:  # summed over its other labels
            values[key][role] = values[key].get(role, 0.0) + sample.value
        else:
            values[key][role] = sample.value
    series = {}
    for key, vals in values.items():
        if key in broken:  # counted above; the rest would pass a bad last position off as k-1
            continue
        if not fams.engine.speculates(vals):
            continue
        counts = fams.engine.series_counts(vals, positions[key], drafted[key])
        if counts is None:
            bad += 1  # an incomplete series (truncated page) would look like a restart: skip it
            continue
        series[key] = RawSeries(counts, tuple(sorted(created[key])))
    # one figure per series: the mean over the scheduler ranks (SGLang: tp/pp/dp) that report it
    means = {
        key: {name: sum(vs) / len(vs) for name, vs in found.items()}
        for key, found in gauges.items()
        if key in series
    }
    return Page(series, bad, means)


def _position(text: str | None) -> int | None:
    # isdigit() alone admits "²" (int() rejects it) and int() rejects > 4300 digits: both raised
    if text is None or not (text.isascii() and text.isdigit()) or len(text) > 9:
        return None
    return int(text) if int(text) < MAX_POSITIONS else None
