"""The measurement as the published table, JSON, CSV or a plot; plus what it implies for the
sidecar's config (step cost ratio, break-even acceptance) and the bandwidth roofline."""

from __future__ import annotations

import csv
import io
import json
import statistics
from dataclasses import dataclass
from typing import Any

from exporter.core.payoff import breakeven_acceptance, decode_ceiling
from exporter.core.table import aligned

Row = dict[str, Any]


@dataclass(frozen=True)
class Roofline:
    bytes_per_token: float
    bandwidth: float

    @property
    def ceiling(self) -> float:
        return decode_ceiling(self.bandwidth, self.bytes_per_token)


def comparison(spec: Row, plain: Row | None) -> Row | None:
    """Speedup against the plain run, and the step cost and break-even that implies."""
    if plain is None:
        return None
    fast, slow = spec["decode_tokens_per_second_median"], plain["decode_tokens_per_second_median"]
    if not fast or not slow:
        return None
    speedup = fast / slow
    row: Row = {
        "name": spec["name"],
        "speedup": speedup,
        "step_cost_ratio": None,
        "breakeven_acceptance_rate": None,
    }
    length, draft_length = spec["mean_acceptance_length"], spec.get("draft_length")
    if length and draft_length:
        cost = length / speedup  # tokens per step / speedup = one step's cost in plain steps
        row["step_cost_ratio"] = cost
        row["breakeven_acceptance_rate"] = breakeven_acceptance(cost, draft_length)
    return row


def document(rows: list[Row], baseline: list[Row] | None, roofline: Roofline | None) -> Row:
    """The `--json` document."""
    by_name = {r["name"]: r for r in baseline or []}
    base: Row | None = None
    if baseline is not None:
        comparisons = [c for r in rows if (c := comparison(r, by_name.get(r["name"]))) is not None]
        base = {"scenarios": baseline, "comparison": comparisons}
    roof: Row | None = None
    if roofline is not None:
        roof = {
            "bytes_per_token": roofline.bytes_per_token,
            "bandwidth_bytes_per_second": roofline.bandwidth,
            "ceiling_tokens_per_second": roofline.ceiling,
            "scenarios": [
                {
                    "name": r["name"],
                    "utilization": _share(r["decode_tokens_per_second_median"], roofline.ceiling),
                    "plain_utilization": _share(
                        by_name.get(r["name"], {}).get("decode_tokens_per_second_median"),
                        roofline.ceiling,
                    ),
                }
                for r in rows
            ],
        }
    return {"scenarios": rows, "baseline": base, "roofline": roof}


def to_json(doc: Row) -> str:
    return json.dumps(doc, indent=2, ensure_ascii=False)


def to_csv(doc: Row) -> str:
    out = io.StringIO()
    rows = doc["scenarios"]
    comparisons = {c["name"]: c for c in (doc["baseline"] or {}).get("comparison", [])}
    fields = (
        [*rows[0].keys(), "speedup", "step_cost_ratio", "breakeven_acceptance_rate"] if rows else []
    )
    writer = csv.DictWriter(out, fieldnames=fields, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        extra = comparisons.get(row["name"], {})
        writer.writerow({**row, **{k: extra.get(k) for k in fields[-3:]}})
    return out.getvalue()


def to_table(doc: Row, model: str | None = None) -> str:
    """The published table, what it could not say, the step cost and the roofline."""
    rows, base = doc["scenarios"], doc["baseline"]
    comparisons = {c["name"]: c for c in (base or {}).get("comparison", [])}
    lines = aligned(_scenario_rows(rows, base, comparisons))
    lines += _caveats(rows)
    if any(c.get("step_cost_ratio") for c in comparisons.values()):
        lines.append("")
        for c in comparisons.values():
            if c.get("step_cost_ratio"):
                lines.append(
                    f"{c['name']}: step cost ratio {c['step_cost_ratio']:.2f}, "
                    f"break-even acceptance {c['breakeven_acceptance_rate']:.1%}"
                )
        lines.append("\n" + models_block(doc, model or "MODEL"))
    if doc["roofline"] is not None:
        lines += _roofline(doc["roofline"], base is not None)
    return "\n".join(lines)


def _scenario_rows(
    rows: list[Row], base: Row | None, comparisons: dict[str, Row]
) -> list[list[str]]:
    """The header and one row per scenario (with the plain decode and speedup given a baseline)."""
    plain = {r["name"]: r for r in (base or {}).get("scenarios", [])}
    header = [
        "scenario",
        "requests",
        "TTFT p50",
        "decode p50",
        "acceptance (/metrics)",
        "per-request",
        "tokens/step",
    ]
    if base is not None:
        header += ["plain decode", "speedup"]
    table = [header]
    for r in rows:
        line = [
            r["name"],
            str(r["requests"]),
            _fmt(r["ttft_ms_median"], "{:.0f} ms"),
            _fmt(r["decode_tokens_per_second_median"], "{:.1f} tok/s"),
            _acceptance(r),
            _fmt(r["per_request_acceptance_rate"], "{:.1%}"),
            _fmt(r["mean_acceptance_length"], "{:.2f}"),
        ]
        if base is not None:
            plain_rate = plain.get(r["name"], {}).get("decode_tokens_per_second_median")
            line += [
                _fmt(plain_rate, "{:.1f} tok/s"),
                _fmt(comparisons.get(r["name"], {}).get("speedup"), "x{:.2f}"),
            ]
        table.append(line)
    return table


SHARED_MARGIN = 0.05  # the engine's draft tokens past the requests' own: other traffic
UNKNOWN_DRAFT_LENGTH = "<draft length>"  # in a `models:` block where no run showed it


def _caveats(rows: list[Row]) -> list[str]:
    """What the table cannot say: an interrupted run, an engine without the counters, an
    engine that served other traffic meanwhile (its /metrics delta is not measure's alone)."""
    out = []
    for r in rows:
        engine, own = r.get("draft_tokens"), r.get("per_request_draft_tokens")
        if engine is None or not own or r.get("interrupted"):
            continue
        if engine > own * (1 + SHARED_MARGIN):
            out.append(
                f"\n{r['name']}: the engine drafted {engine:.0f} tokens over the scenario, its "
                f"requests {own:.0f} (+{engine / own - 1:.0%}): other traffic shared the "
                "engine, so the /metrics acceptance and the engine's batch include it (the "
                "per-request column is measure's own); measure on an idle engine"
            )
    if any(r.get("interrupted") for r in rows):
        out.append(
            "\ninterrupted before the engine's counters were read again: acceptance from "
            "/metrics is not known for the last scenario (per-request objects, where vLLM "
            "sent them, still count)"
        )
    if any(r["drafts"] is None and not r.get("interrupted") for r in rows):
        out.append(
            "\nno speculative-decoding counters on /metrics: acceptance is not known "
            "(is the engine running with speculative decoding, and is --engine right?)"
        )
    return out


def _roofline(roof: Row, with_plain: bool) -> list[str]:
    out = [
        f"\nroofline: {roof['bandwidth_bytes_per_second']:.3g} B/s / "
        f"{roof['bytes_per_token']:.3g} B/token = "
        f"{roof['ceiling_tokens_per_second']:.1f} tok/s ceiling"
    ]
    for s in roof["scenarios"]:
        out.append(
            f"  {s['name']}: {_fmt(s['utilization'], '{:.0%}')} of the ceiling"
            + (f" (plain {_fmt(s['plain_utilization'], '{:.0%}')})" if with_plain else "")
        )
    return out


def models_block(doc: Row, model: str) -> str:
    """A ready `models:` entry for the sidecar config (step cost: median over scenarios)."""
    base = doc["baseline"] or {}
    costs = [c["step_cost_ratio"] for c in base.get("comparison", []) if c.get("step_cost_ratio")]
    lengths = [r["draft_length"] for r in doc["scenarios"] if r.get("draft_length")]
    plain = [
        r["decode_tokens_per_second_median"]
        for r in base.get("scenarios", [])
        if r["decode_tokens_per_second_median"]
    ]
    lines = [
        "models:   # for the sidecar config (specdec serve --config)",
        f"  - name: {model}",
        f"    num_speculative_tokens: {lengths[0] if lengths else UNKNOWN_DRAFT_LENGTH}",
        step_cost_line(statistics.median(costs)),
    ]
    if plain:
        lines.append(f"    plain_decode_tokens_per_second: {statistics.median(plain):.1f}")
    return "\n".join(lines)


def step_cost_line(cost: float) -> str:
    """The block's `step_cost_ratio` line: a verify step's seconds in plain steps, at least 1
    (the least the sidecar takes; an overhead-bound engine, or noise, can measure a verify
    step no dearer than a plain one), saying so when the measured value was lower."""
    if cost >= 1.0:
        return f"    step_cost_ratio: {cost:.2f}"
    return f"    step_cost_ratio: 1.00   # measured {cost:.2f}: no dearer than a plain step"


def plot(doc: Row, path: str) -> None:
    """Decode tok/s (plain vs speculative) and acceptance per scenario, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = doc["scenarios"]
    plain = {r["name"]: r for r in (doc["baseline"] or {}).get("scenarios", [])}
    names = [r["name"] for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    x = range(len(names))
    spec_rates = [r["decode_tokens_per_second_median"] or 0 for r in rows]
    left.bar([i - 0.2 for i in x], spec_rates, width=0.4, label="speculative")
    if plain:
        left.bar(
            [i + 0.2 for i in x],
            [plain.get(n, {}).get("decode_tokens_per_second_median") or 0 for n in names],
            width=0.4,
            label="plain",
        )
    left.set_xticks(list(x), names)
    left.set_ylabel("decode tok/s (median)")
    left.legend()
    right.bar(list(x), [r["acceptance_rate"] or 0 for r in rows], color="tab:green")
    right.set_xticks(list(x), names)
    right.set_ylim(0, 1)
    right.set_ylabel("draft acceptance (/metrics delta)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _acceptance(r: Row) -> str:
    if r["acceptance_rate"] is None:
        return "-"
    return f"{r['acceptance_rate']:.1%} ({r['accepted_tokens']:.0f}/{r['draft_tokens']:.0f})"


def _share(value: float | None, ceiling: float) -> float | None:
    return None if value is None else value / ceiling


def _fmt(value: float | None, pattern: str) -> str:
    return "-" if value is None else pattern.format(value)


def curve_table(levels: list[Row], model: str, draft_length: int | None) -> str:
    """The step-time curve per concurrency level (each step with its relative standard error,
    the context its requests held), then a ready `models:` block holding it."""
    header = [
        "concurrency",
        "running",
        "context",
        "s/step spec",
        "s/step plain",
        "tokens/step",
        "decode",
        "plain decode",
        "speedup",
    ]
    table = [header]
    for r in levels:
        table.append(
            [
                str(r["concurrency"]),
                _fmt(r["running"], "{:.1f}"),
                _fmt(r.get("context"), "{:.0f}"),
                _with_error(r["verify_seconds"], r.get("verify_error")),
                _with_error(r["plain_seconds"], r.get("plain_error")),
                _fmt(r["tokens_per_step"], "{:.2f}"),
                _fmt(r["decode_tokens_per_second"], "{:.1f} tok/s"),
                _fmt(r["plain_decode_tokens_per_second"], "{:.1f} tok/s"),
                _fmt(r["speedup"], "x{:.2f}"),
            ]
        )
    lines = aligned(table)
    lines.append(
        "(± one standard error of a step's seconds: the spread of the fastest replicates, "
        "those within 3 % of the fastest; with one, of its steady span in four blocks. A "
        "step's error over the whole run, to the farthest replicate: the *_spread below)"
    )
    lines += [f"  {line}" for r in levels for line in r.get("left_out") or ()]
    points = [r for r in levels if r["running"] is not None and r["plain_seconds"]]
    if not points:
        lines.append("\nno level has both a batch and a plain step time: no curve to configure")
        return "\n".join(lines)
    first = min(points, key=lambda r: r["running"])
    lines += [
        "",
        "models:   # for the sidecar config (specdec serve --config)",
        f"  - name: {model}",
        f"    num_speculative_tokens: {draft_length or UNKNOWN_DRAFT_LENGTH}",
    ]
    if first["verify_seconds"]:
        lines.append(step_cost_line(first["verify_seconds"] / first["plain_seconds"]))
    lines += [
        f"    plain_decode_tokens_per_second: {1 / first['plain_seconds']:.1f}",
        "    step_time:   # seconds per decode step against the engine's running requests",
    ]
    lines += [
        f"      - {{{_point(r, draft_length)}}}" for r in sorted(points, key=lambda r: r["running"])
    ]
    return "\n".join(lines)


def _with_error(seconds: float | None, error: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds:.4f}" + ("" if error is None else f" ±{100 * error:.1f}%")


def _point(r: Row, draft_length: int | None) -> str:
    """One step-time point as the config takes it: the steps with their error over the run
    (`*_spread`), the draft tokens per step of the verify step where not the draft length,
    the context and what a step gains per token of it."""
    out = [f"running: {r['running']:.2f}", f"plain_seconds: {r['plain_seconds']:.6f}"]
    if (error := r.get("plain_spread")) is not None:
        out.append(f"plain_spread: {error:.4f}")
    if r["verify_seconds"] and r.get("verify_drafts") != 0:
        out.append(f"verify_seconds: {r['verify_seconds']:.6f}")
        if (error := r.get("verify_spread")) is not None:
            out.append(f"verify_spread: {error:.4f}")
        drafts = r.get("verify_drafts")
        if drafts is not None and (draft_length is None or abs(drafts - draft_length) > 0.005):
            out.append(f"verify_drafts: {drafts:.3f}")
    if r.get("draft_seconds"):
        lengths = ", ".join(f"{j}: {x:.6f}" for j, x in sorted(r["draft_seconds"].items()))
        out.append(f"draft_seconds: {{{lengths}}}")
    if r.get("context") is not None:
        out.append(f"context_tokens: {r['context']:.0f}")
        for kind in ("plain", "verify"):
            slope = r.get(f"{kind}_per_context_token")
            if slope is not None:
                out.append(f"{kind}_seconds_per_context_token: {slope:.4g}")
    return ", ".join(out)


def curve_plot(levels: list[Row], path: str) -> None:
    """Seconds per step (spec and plain) and the speedup against running requests, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = sorted((r for r in levels if r["running"] is not None), key=lambda r: r["running"])
    x = [r["running"] for r in points]
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    left.plot(x, [r["verify_seconds"] for r in points], "o-", label="speculative (per step)")
    left.plot(x, [r["plain_seconds"] for r in points], "o-", label="plain (per step)")
    left.set_xlabel("running requests")
    left.set_ylabel("seconds per decode step")
    left.legend()
    right.plot(x, [r["speedup"] for r in points], "o-", color="tab:green")
    right.axhline(1.0, color="grey", linestyle="--")
    right.set_xlabel("running requests")
    right.set_ylabel("speedup (decode rate / plain)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
