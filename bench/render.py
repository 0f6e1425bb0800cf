#!/usr/bin/env python3
"""The benchmark record's tables, rendered from bench/results/ (one JSON file per recorded run:
bench, commit, command, machine, figures, and optional notes; `--record` on a bench writes one).

    python3 bench/render.py                          # each bench's latest run
    python3 bench/render.py --bench soak --all       # every run of one bench, oldest first
    python3 bench/render.py --bench gpu_payoff --all --notes   # with each run's account
    python3 bench/render.py --file bench/results/F.json        # one run, everything in it
    python3 bench/render.py --check docs/BENCHMARKS.md   # exit 1 if its rendered blocks are stale
    python3 bench/render.py --write docs/BENCHMARKS.md   # render them again

A result file's figures are rendered as they are: `tables` (each `{"title", "columns", "rows"}`)
as markdown tables, `printed` (a block of the bench's printed output, or a list of them) as text
blocks, and every other figure as a row of a figure/value table (nested keys joined with dots;
a list of objects as a table of its own). Raw per-round data (`BULK`) stays in the file. In a
doc, a block between `<!-- render: ARGS -->` and `<!-- /render -->` holds this script's output
for ARGS.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
BULK = frozenset({"args", "segments", "summaries", "reports"})  # in the file, never rendered
# figures left out of a bench's latest-run summary (shown with --all or --file)
SUMMARY_HIDES = {
    "bench_proxy": frozenset(
        {"sanity", "goals_quiet_rounds", "rss", "request_log"}
    ),  # in goals, §3
    "bench_relay": frozenset({"reads", "us_per_stream"}),
    "soak": frozenset(
        {
            "proxy_counted",
            "silent_connections",
            "lost_examples",
            "mismatches",  # among the problems
            "connections_idle_closed",
            "write_timeouts",
            "skipped_ticks",
            "ttft",  # its p99 added is shown
        }
    ),
    "gpu_payoff": frozenset({"out"}),
}
BLOCK = re.compile(r"(<!-- render: (?P<args>[^>]*?) -->\n)(?P<body>.*?)(<!-- /render -->)", re.S)

Record = dict[str, Any]


def load(where: Path = RESULTS) -> list[Record]:
    """Every result file under `where`, oldest first (a date-only run before the timed runs of
    its day; `order` keeps a day's converted runs in the order they were logged)."""
    records = []
    for path in sorted(where.glob("*.json")):
        record = json.loads(path.read_text(encoding="utf-8"))
        record["_file"] = path.name
        records.append(record)
    return sorted(records, key=lambda r: (r["started_utc"], r.get("order", 0), r["_file"]))


def latest(records: Iterable[Record]) -> dict[str, Record]:
    """Each bench's latest run."""
    out: dict[str, Record] = {}
    for record in records:  # oldest first: the last one stays
        out[record["bench"]] = record
    return dict(sorted(out.items()))


def number(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if value.is_integer() and abs(value) < 1e15:
            return str(int(value))
        return f"{value:.1f}" if abs(value) >= 100 else f"{value:.4g}"
    if isinstance(value, list):
        return ", ".join(number(v) for v in value)
    return str(value)


def cell(value: Any) -> str:
    return number(value).replace("|", "\\|").replace("\n", " ")


def table(columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> list[str]:
    lines = ["| " + " | ".join(cell(c) for c in columns) + " |"]
    lines.append("|" + "---|" * len(columns))
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return lines


def flat(value: Any, prefix: str = "") -> dict[str, Any]:
    """Nested objects as dotted keys; lists of scalars stay whole."""
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, inner in value.items():
            out.update(flat(inner, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: value}


def is_rows(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, dict) for v in value)


def figures(record: Record, hide: frozenset[str] = frozenset()) -> list[str]:
    """A run's figures as markdown: its tables, the scalar figures, then its printed output."""
    lines: list[str] = []
    found = record.get("figures", {})
    for t in found.get("tables", []):
        if t.get("title"):
            lines += [f"*{t['title']}*", ""]
        lines += [*table(t["columns"], t["rows"]), ""]
    scalars: dict[str, Any] = {}
    for key, value in found.items():
        if key in ("tables", "printed") or key in BULK or key in hide or value is None:
            continue
        if is_rows(value):
            rows = [flat(v) for v in value]
            columns = list(dict.fromkeys(k for row in rows for k in row))
            body = table(columns, ([r.get(c, "") for c in columns] for r in rows))
            lines += [f"*{key}*", "", *body, ""]
        else:
            scalars.update({k: v for k, v in flat(value, key).items() if v is not None})
    if scalars:
        lines += [*table(("figure", "value"), scalars.items()), ""]
    printed = found.get("printed") or []
    for block in [printed] if isinstance(printed, str) else printed:
        lines += ["```text", block.rstrip("\n"), "```", ""]
    return lines


def when(record: Record) -> str:
    """The run's date, and its time (or its session's hours) where known."""
    stamp = record["started_utc"]
    if len(stamp) > 10:
        return f"{stamp[:10]} {stamp[11:16]} UTC"
    return f"{stamp} {record['time_utc']} UTC" if record.get("time_utc") else stamp


def commit(record: Record) -> str:
    compares = record.get("compares")
    if compares:
        return f"{compares['before']} (before) against {compares['after']} (after)"
    return str(record.get("commit", "unknown"))


def machine(record: Record) -> str:
    m = record.get("machine", {})
    if "description" in m:
        return str(m["description"])
    return ", ".join(f"{k} {v}" for k, v in m.items())


def run(record: Record, notes: bool, summary: bool) -> list[str]:
    """One run: where and when, its command, its figures (and its notes)."""
    name = f"bench/results/{record['_file']}"
    if summary:
        head = (
            f"**{record['bench']}**, latest: {when(record)}, commit {commit(record)}, "
            f"{name}: `{record['command']}`"
        )
        lines = [head, ""]
    else:
        label = f" · {record['label']}" if record.get("label") else ""
        head = f"#### {when(record)} · {commit(record)}{label}"
        lines = [head, "", f"{name}; {machine(record)}", "", f"`{record['command']}`", ""]
    hide = SUMMARY_HIDES.get(record["bench"], frozenset()) if summary else frozenset()
    lines += figures(record, hide)
    if notes and record.get("notes"):
        lines += ["Notes:", "", record["notes"].rstrip("\n"), ""]
    return lines


def render(
    records: list[Record], benches: Sequence[str] = (), every: bool = False, notes: bool = False
) -> str:
    chosen = [r for r in records if not benches or r["bench"] in benches]
    lines: list[str] = []
    if every:
        for bench in sorted({r["bench"] for r in chosen}):
            lines += [f"### {bench}", ""]
            for record in (r for r in chosen if r["bench"] == bench):
                lines += run(record, notes, summary=False)
    else:
        for record in latest(chosen).values():
            lines += run(record, notes, summary=True)
    return "\n".join(lines).rstrip("\n") + "\n"


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--bench", action="append", default=[], help="only this bench (repeatable)")
    ap.add_argument("--all", action="store_true", help="every run, not only the latest")
    ap.add_argument("--notes", action="store_true", help="each run's notes too")
    ap.add_argument("--file", type=Path, action="append", default=[], help="these result files")
    ap.add_argument("--results", type=Path, default=RESULTS, help="the results directory")
    ap.add_argument("--check", type=Path, metavar="DOC", help="exit 1 if DOC's blocks are stale")
    ap.add_argument("--write", type=Path, metavar="DOC", help="render DOC's blocks again")
    return ap


def output(args: argparse.Namespace, records: list[Record]) -> str:
    if args.file:
        names = {p.name for p in args.file}
        picked = [r for r in records if r["_file"] in names]
        lines = [line for r in picked for line in run(r, args.notes, summary=False)]
        return "\n".join(lines).rstrip("\n") + "\n"
    return render(records, args.bench, args.all, args.notes)


def blocks(doc: str, records: list[Record]) -> str:
    """`doc` with every render block's body rendered again from `records`."""

    def again(match: re.Match[str]) -> str:
        args = parser().parse_args(shlex.split(match["args"]))
        return match.group(1) + "\n" + output(args, records) + "\n" + match.group(4)

    return BLOCK.sub(again, doc)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    records = load(args.results)
    for path in args.file:  # a file outside the results directory
        if not any(r["_file"] == path.name for r in records):
            record = json.loads(path.read_text(encoding="utf-8"))
            records.append({**record, "_file": path.name})
    doc = args.check or args.write
    if doc is not None:
        text = doc.read_text(encoding="utf-8")
        fresh = blocks(text, records)
        if args.write:
            doc.write_text(fresh, encoding="utf-8")
        elif fresh != text:
            print(f"{doc}: rendered blocks are stale: python3 bench/render.py --write {doc}")
            return 1
        return 0
    sys.stdout.write(output(args, records))
    return 0


if __name__ == "__main__":
    sys.exit(main())
