"""`specdec derive BEFORE.prom AFTER.prom`: the offline /metrics delta the published
measurement used, per (model_name, engine) and in total, with vLLM's definitions."""

from __future__ import annotations

import json
from typing import Any

from exporter.core.counts import Counts, ratios, total
from exporter.scrape.families import EngineFamilies, SeriesKey, read_page
from exporter.scrape.totals import RunningTotals


def delta(before: str, after: str, fams: EngineFamilies) -> dict[SeriesKey, Counts]:
    """Per series, the work done between two pages (a restart in between is handled)."""
    store = RunningTotals()
    store.feed(read_page(before, fams))
    start = store.snapshot()
    store.feed(read_page(after, fams))
    return {
        key: counts - start.get(key, Counts(None if counts.drafts is None else 0.0))
        for key, counts in sorted(store.snapshot().items())
    }


def report(deltas: dict[SeriesKey, Counts]) -> dict[str, Any]:
    """The `--json` document: {"series": [...], "total": {...}}."""
    series = [
        {"model_name": model, "engine": engine, **_figures(c)}
        for (model, engine), c in deltas.items()
    ]
    # the issue's contract: "total" has the series' keys except engine, so model_name too (the
    # one model's name; null when the series span several models)
    models = {model for model, _ in deltas}
    model_name = next(iter(models)) if len(models) == 1 else None
    return {
        "series": series,
        "total": {"model_name": model_name, **_figures(total(list(deltas.values())))},
    }


def _figures(c: Counts) -> dict[str, Any]:
    r = ratios(c)
    return {
        "drafts": c.drafts,
        "draft_tokens": c.draft_tokens,
        "accepted_tokens": c.accepted,
        "acceptance_rate": r.acceptance,
        "mean_acceptance_length": r.mean_acceptance_length,
        "per_position": list(r.per_position) if r.per_position is not None else None,
    }


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
                " ".join(_pct(p) for p in row["per_position"] or []) or "-",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows
    )


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"
