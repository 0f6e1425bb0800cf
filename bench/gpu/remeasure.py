"""A recorded GPU run's `measure` read again from the servers' own clocks, with the old and the
new estimator (issue 62): a recomputation, not a run.

A run's OUT folder keeps measure's log (each phase's label and its requests) and both
llama-servers' logs (each request's prompt and decode milliseconds and tokens, and a
speculative request's accepted drafts: `print_timing`). measure's phases ran one after another
on each server, so the server's requests, in the order they began, after its warm-up, are
measure's phases in the order its log names them. Per phase the steady span is measure's
(from the `workers`-th request's end to the last request's start, when the first worker
found nothing left), each request's decode counted pro rata inside it, on the server's clock
(no client, network or streaming delay in it). Then per level and side:

- old: the replicates that agree pooled (the closest two and any within 5 % of their mean:
  the rule measure had until issue 62);
- new: the fastest replicate and those within 3 % of it (`exporter.measure.steps.fastest`),
  with its error over the run (`spread`).

measure ran its replicates back to back in those runs; the new measure spreads them over the
run, which no recomputation can do. The sidecar's estimate is tokens per step / measure's
cost ratio at the batch, so with the A/B's truth and the sidecar's recorded error the error
with the new steps follows: (1 + old error) x (old cost / new cost) - 1 (the pages the
sidecar served did not come back from those runs). And the drift the sidecar would have
exported: the A/B's speculative phases at the level (the server's decode seconds over its
steps, the whole phases: the A/B's clients are cut at a phase's end, not drained) over
measure's new verify step, against its spread.

    python -m bench.gpu.remeasure OUT_b OUT_c [--record]
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
import statistics
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench._run import add_outputs, keep
from exporter.core.payoff import DRIFT_FLOOR
from exporter.measure.steps import AGREE, Steady, fastest, per_step, pooled, spread

STAMP = r"(\d+)\.(\d+)\.(\d+)\.(\d+) I slot print_timing: id +\d+ \| task (\d+) \|\s+"
TIMING = re.compile(STAMP + r"(prompt eval|eval) time =\s+([\d.]+) ms /\s+(\d+) tokens")
ACCEPTED = re.compile(STAMP + r"draft acceptance = [\d.]+ \(\s*(\d+) accepted")
# a phase's progress line: `c=4 plain, replicate 2: s: 16 request(s) done`; since issue 60 the
# scenario names its endpoint: `... 2: s on http://127.0.0.1:8002: 16 request(s) done`
DONE = re.compile(r"specdec measure: (c=(\d+) [^:]+): .+?: (\d+) request")


@dataclass(frozen=True)
class Timed:
    """One request on the server's clock: its decode's span (seconds since the server
    started), its decode tokens and its accepted drafts (0 on a plain server)."""

    start: float  # when its prompt began
    decode_start: float
    end: float
    tokens: int
    accepted: int


def timed(lines: Iterable[str]) -> list[Timed]:
    """The requests of a server's log, in the order they began."""
    prompts: dict[int, float] = {}
    decodes: dict[int, tuple[float, float, int]] = {}
    accepted: dict[int, int] = {}
    for line in lines:
        if m := TIMING.match(line):
            minutes, seconds, ms, us = (int(g) for g in m.groups()[:4])
            at = 60 * minutes + seconds + ms / 1e3 + us / 1e6
            task, took, tokens = int(m[5]), float(m[7]) / 1e3, int(m[8])
            if m[6] == "prompt eval":
                prompts[task] = took
            else:
                decodes[task] = (at - took, at, tokens)
        elif a := ACCEPTED.match(line):
            accepted[int(a[5])] = int(a[6])
    found = [
        Timed(begin - prompts.get(task, 0.0), begin, end, tokens, accepted.get(task, 0))
        for task, (begin, end, tokens) in decodes.items()
    ]
    return sorted(found, key=lambda r: r.start)


def labelled(log: Iterable[str]) -> list[tuple[str, int, int]]:
    """measure's phases in order: (label, concurrency, requests)."""
    out: list[tuple[str, int, int]] = []
    for line in log:
        if m := DONE.match(line):
            label, level, n = m[1], int(m[2]), int(m[3])
            if out and out[-1][0] == label:
                out[-1] = (label, level, out[-1][2] + n)
            else:
                out.append((label, level, n))
    return out


def steady(requests: Sequence[Timed], workers: int, plain: bool) -> Steady:
    """measure's steady span on the server's clock: each request's decode pro rata inside it
    (steps: decode tokens less accepted drafts)."""
    ends = sorted(r.end for r in requests)
    begin = ends[min(workers, len(ends)) - 1]
    dry = max(r.start for r in requests)
    tokens = seconds = steps = 0.0
    for r in requests:
        spent = r.end - r.decode_start
        inside = min(dry, r.end) - max(begin, r.decode_start) if dry > begin else spent
        if spent <= 0 or inside <= 0:
            continue
        share = inside / spent
        tokens += r.tokens * share
        seconds += inside
        steps += (r.tokens - r.accepted) * share
    return Steady(tokens, seconds, None if plain else steps, None, None)


def agreeing(figures: list[float]) -> list[int]:
    """The rule measure had until issue 62: with three or more, the closest two and any other
    within AGREE of their mean; with fewer, all."""
    if len(figures) < 3:
        return list(range(len(figures)))
    ordered = sorted(range(len(figures)), key=figures.__getitem__)
    a, b = min(itertools.pairwise(ordered), key=lambda ab: figures[ab[1]] - figures[ab[0]])
    centre = (figures[a] + figures[b]) / 2
    return [i for i, f in enumerate(figures) if i in (a, b) or abs(f / centre - 1) <= AGREE]


def phases(out: Path, side: str) -> dict[int, list[Steady]]:
    """Per level, the replicates' steady spans of one side ("speculative" or "plain") of
    measure's phases in a run's OUT folder, read from that server's log."""
    log = (out / "measure.log").read_text(encoding="utf-8", errors="replace").splitlines()
    server = "spec" if side == "speculative" else "plain"
    with (out / "logs" / f"{server}.log").open(encoding="utf-8", errors="replace") as f:
        requests = timed(f)
    mine = [p for p in labelled(log) if p[0].split(" ", 1)[1].startswith(side)]
    total = sum(n for _, _, n in mine)
    # the warm-up came first: measure's requests are the `total` after it, in order
    first = _after_warm_up(requests)
    requests = requests[first : first + total]
    found: dict[int, list[Steady]] = {}
    at = 0
    for label, level, n in mine:
        phase, at = requests[at : at + n], at + n
        if "draft(s)" in label or "longer" in label:
            continue  # the shorter draft lengths and the longer context: not the curve's step
        found.setdefault(level, []).append(steady(phase, level, side == "plain"))
    return found


def _after_warm_up(requests: Sequence[Timed]) -> int:
    """The index of the first request after the warm-up: the first after an idle second."""
    last_end = requests[0].end
    for i, r in enumerate(requests[1:], 1):
        if r.start > last_end + 1.0:
            return i
        last_end = max(last_end, r.end)
    return 0


def ab_verify_steps(out: Path, results: dict[str, Any]) -> dict[int, float]:
    """Per level, the A/B's speculative phases on the server's clock: decode seconds / steps.
    They follow measure's on the speculative server, a round each (results.json's rounds)."""
    log = (out / "measure.log").read_text(encoding="utf-8", errors="replace").splitlines()
    measured = sum(n for label, _, n in labelled(log) if " speculative" in label)
    with (out / "logs" / "spec.log").open(encoding="utf-8", errors="replace") as f:
        requests = timed(f)
    rest = requests[_after_warm_up(requests) + measured :]
    runs, last_end = [], -float("inf")  # the A/B's phases: runs with an idle second between
    for r in rest:
        if not runs or r.start > last_end + 1.0:
            runs.append([])
        runs[-1].append(r)
        last_end = max(last_end, r.end)
    found: dict[int, float] = {}
    for row in results["levels"]:
        rounds = len(next(iter(row["routes"].values()))["rounds"])
        mine, runs = runs[:rounds], runs[rounds:]
        seconds = sum(r.end - r.decode_start for phase in mine for r in phase)
        steps = sum(r.tokens - r.accepted for phase in mine for r in phase)
        if steps:
            found[row["concurrency"]] = seconds / steps
    return found


def level_figures(replicates: list[Steady], plain: bool) -> dict[str, Any]:
    figures = [per_step(s, plain) or 0.0 for s in replicates]
    old = per_step(pooled([replicates[i] for i in agreeing(figures)]), plain)
    kept = fastest(list[float | None](figures))
    new = per_step(pooled([replicates[i] for i in kept]), plain)
    error = None
    if len(kept) > 1:
        mine = [figures[i] for i in kept]
        error = statistics.stdev(mine) / len(mine) ** 0.5 / statistics.fmean(mine)
    return {
        "replicates_ms": [round(1e3 * f, 3) for f in figures],
        "old_ms": None if old is None else round(1e3 * old, 3),
        "new_ms": None if new is None else round(1e3 * new, 3),
        "new_spread": None if new is None else round(spread(new, figures, error) or 0.0, 4),
    }


def recompute(out: Path) -> dict[str, Any]:
    """One run: per level, both sides by both estimators, and the sidecar's error recomputed."""
    spec, plain = phases(out, "speculative"), phases(out, "plain")
    results = json.loads((out / "results.json").read_text(encoding="utf-8"))
    live_steps = ab_verify_steps(out, results)
    recorded = {round(p["running"]): p for p in results["measure"]["curve"]}
    levels: dict[str, Any] = {}
    for level in sorted(plain):
        p, s = level_figures(plain[level], True), level_figures(spec.get(level, []), False)
        row: dict[str, Any] = {"plain": p, "verify": s}
        point = min(recorded.values(), key=lambda q: abs(q["running"] - level))
        row["measure_printed_ms"] = {
            "plain": round(1e3 * point["plain_seconds"], 3),
            "verify": round(1e3 * point["verify_seconds"], 3),
        }
        live = live_steps.get(level)
        if live is not None and s["new_ms"]:
            row["drift"] = {
                "live_verify_ms": round(1e3 * live, 3),
                "ratio": round(1e3 * live / s["new_ms"], 4),
                "tolerance": max(s["new_spread"] or 0.0, DRIFT_FLOOR),
            }
        if p["old_ms"] and p["new_ms"] and s["old_ms"] and s["new_ms"]:
            # the sidecar reads tokens per step / cost: its figure scales by old cost / new
            scale = (s["old_ms"] / p["old_ms"]) / (s["new_ms"] / p["new_ms"])
            row["sidecar"] = _sidecar(results, level, scale)
        levels[str(level)] = row
    return {"run": out.name, "levels": levels}


def _sidecar(results: dict[str, Any], level: int, scale: float) -> dict[str, Any]:
    """Per route at the level: the A/B truth, the sidecar's recorded error and the error its
    estimate would have had through the new steps' cost ratio."""
    found: dict[str, Any] = {}
    for row in results["levels"]:
        if row["concurrency"] != level:
            continue
        for route, r in row["routes"].items():
            truth, estimated = r.get("truth"), r.get("estimated")
            if not truth or not estimated:
                continue
            found[route] = {
                "truth": round(truth, 3),
                "old_error": round(estimated / truth - 1, 4),
                "new_error": round(estimated * scale / truth - 1, 4),
            }
    return found


def table(runs: list[dict[str, Any]]) -> list[str]:
    lines = [
        "RECOMPUTATION from the servers' logs (measure's phases back to back, as recorded)",
        "run  c   side    replicates ms               printed  old      new      spread  "
        "sidecar err old -> new (voice; agent)",
    ]
    for run in runs:
        for level, row in run["levels"].items():
            for side in ("plain", "verify"):
                f = row[side]
                reps = " ".join(f"{x:.2f}" for x in f["replicates_ms"])
                err = ""
                if side == "plain" and "sidecar" in row:
                    err = "; ".join(
                        f"{v['old_error']:+.1%} -> {v['new_error']:+.1%}"
                        for v in row["sidecar"].values()
                    )
                if side == "verify" and "drift" in row:
                    d = row["drift"]
                    err = f"drift x{d['ratio']:.3f} (tolerance {d['tolerance']:.1%})"
                lines.append(
                    f"{run['run']:<4} {level:<3} {side:<7} {reps:<28} "
                    f"{row['measure_printed_ms'][side]:<8.2f} {f['old_ms'] or 0:<8.2f} "
                    f"{f['new_ms'] or 0:<8.2f} {f['new_spread'] or 0:<7.1%} {err}"
                )
    return lines


def summary(runs: list[dict[str, Any]], levels: tuple[str, ...] = ("16", "32")) -> dict[str, Any]:
    """The doc's table: per run and level, the plain and verify steps by the old and the new
    estimator, the sidecar's error against the A/B both ways, and the drift it would export."""
    rows = []
    for run in runs:
        for level in levels:
            row = run["levels"].get(level)
            if row is None:
                continue
            p, v = row["plain"], row["verify"]
            errors = row.get("sidecar", {})
            drift = row.get("drift")
            steps = [f"{x['old_ms']:.2f} -> {x['new_ms']:.2f}" for x in (p, v)]
            moved = [f"{e['old_error']:+.1%} -> {e['new_error']:+.1%}" for e in errors.values()]
            read = "-" if drift is None else f"x{drift['ratio']:.3f} ({drift['tolerance']:.1%})"
            rows.append([run["run"], level, *steps, *moved, read])
    return {
        "title": "RECOMPUTATION of two recorded runs (2026-12-06, one H200, b and c): measure's "
        "steps old -> new estimator (ms), the sidecar's error vs the A/B old -> new, the drift",
        "columns": [
            "run",
            "c",
            "plain step",
            "verify step",
            "voice err",
            "agent err",
            "drift (tolerance)",
        ],
        "rows": rows,
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Every run given, the table printed; --json / --record keep the doc's table and the rest."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path, help="recorded OUT folders (measure.log, logs/)")
    add_outputs(ap)
    runs = [recompute(out) for out in ap.parse_args(argv).runs]
    print(*table(runs), sep="\n")
    keep(ap.parse_args(argv), "gpu_remeasure", {"tables": [summary(runs)], "reports": runs})
    return 0


if __name__ == "__main__":
    sys.exit(main())
