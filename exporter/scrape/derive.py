"""`specdec derive BEFORE.prom AFTER.prom`: the offline /metrics delta the published
measurement used, per (model_name, rank) and in total, with vLLM's definitions. What the delta
means is `scrape.figures`', the sidecar's live windows' too; here it is formatted."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from exporter.core.counts import Counts
from exporter.core.table import aligned
from exporter.scrape.families import EngineFamilies, RawSeries, SeriesKey, read_page
from exporter.scrape.figures import Figures, read_span
from exporter.scrape.totals import RunningTotals


@dataclass(frozen=True)
class Delta:
    """The work between two pages per series, and what the pages said about themselves."""

    series: dict[SeriesKey, Counts]
    restarted: list[SeriesKey]  # counters lower in AFTER: taken as an engine restart
    swapped: list[SeriesKey]  # lower in AFTER with the same `_created`: the files are swapped
    before_empty: bool  # a page without any spec-decode series (not a vLLM page, or spec off)
    after_empty: bool


def delta(before: str, after: str, fams: EngineFamilies) -> Delta:
    """Per series, the work done between two pages (a restart in between is handled; a series
    first seen in AFTER counts from zero)."""
    store = RunningTotals()
    first, last = read_page(before, fams), read_page(after, fams)
    store.feed(first)
    start = store.snapshot()
    restarted = store.feed(last)
    swapped = [key for key in restarted if _same_start(first.series[key], last.series[key])]
    series = {
        key: counts - start.get(key, Counts(None if counts.drafts is None else 0.0))
        for key, counts in sorted(store.snapshot().items())
    }
    return Delta(series, restarted, swapped, not first.series, not last.series)


def _same_start(before: RawSeries, after: RawSeries) -> bool:
    """Both pages stamp the series with the same `_created`: one engine life, so counters that
    went down were read in the wrong order."""
    stamps = dict(before.created)
    shared = [name for name, _ in after.created if name in stamps]
    return bool(shared) and all(
        stamps[name] == value for name, value in after.created if name in stamps
    )


def report(deltas: dict[SeriesKey, Counts]) -> dict[str, Any]:
    """The `--json` document: {"series": [...], "total": {...}}."""
    span = read_span(deltas)
    series = [{"model_name": f.model_name, "engine": f.rank, **_figures(f)} for f in span.series]
    # the issue's contract: "total" has the series' keys except engine, so model_name too (the
    # one model's name; null when the series span several models)
    models = {model for model, _ in deltas}
    model_name = next(iter(models)) if len(models) == 1 else None
    return {"series": series, "total": {"model_name": model_name, **_figures(span.total)}}


def _figures(f: Figures) -> dict[str, Any]:
    c = f.counts
    return {
        "drafts": c.drafts,
        "draft_tokens": c.draft_tokens,  # None: the engine counts none (SGLang)
        "accepted_tokens": c.accepted,
        "acceptance_rate": f.acceptance,
        "mean_acceptance_length": f.mean_acceptance_length,
        "per_position": _per_position(f),
    }


def _per_position(f: Figures) -> list[float | None] | None:
    """k ratios; k nulls when there were no drafts to divide by (a consumer can still index
    it); null for an engine that counts no verify steps (TensorRT-LLM) or no accepted tokens
    (SGLang)."""
    c = f.counts
    if c.drafts is None or c.accepted is None:
        return None
    return [None] * len(c.per_position) if f.per_position is None else list(f.per_position)


def to_json(doc: dict[str, Any]) -> str:
    return json.dumps(doc, indent=2)


def to_table(doc: dict[str, Any]) -> str:
    header = (
        "model_name",
        "engine",
        "drafts",
        "draft_tokens",
        "accepted",
        "acceptance",
        "tokens/step",
        "per position",
    )
    rows = [header]
    for row in [*doc["series"], {**doc["total"], "model_name": "TOTAL", "engine": ""}]:
        rows.append(
            (
                row["model_name"],
                row["engine"],
                _num(row["drafts"]),
                _num(row["draft_tokens"]),
                _num(row["accepted_tokens"]),
                _pct(row["acceptance_rate"]),
                "-"
                if row["mean_acceptance_length"] is None
                else f"{row['mean_acceptance_length']:.2f}",
                _positions(row["per_position"]),
            )
        )
    return "\n".join(aligned(rows))


def _positions(values: list[float | None] | None) -> str:
    return " ".join(map(_pct, values)) if values and any(v is not None for v in values) else "-"


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"
