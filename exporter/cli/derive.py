"""`specdec derive BEFORE AFTER`: acceptance between two saved /metrics pages."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from exporter.engines import DEFAULT_KIND, KINDS
from exporter.scrape.families import families
from exporter.verbs import EXIT_USAGE, AddVerb

EXIT_NO_DATA = 1  # a page without spec-decode counters


def register(add_verb: AddVerb) -> None:
    p = add_verb(
        "derive",
        help="acceptance between two saved /metrics pages",
        description="Compute drafts, draft tokens, accepted tokens, acceptance rate, "
        "mean acceptance "
        "length (tokens per step) and per-position acceptance between two saved /metrics pages "
        "(e.g. `curl -s URL/metrics > before.prom`), per model_name and engine and in total.",
    )
    p.add_argument("before", type=Path, help="the /metrics page saved before the run")
    p.add_argument("after", type=Path, help="the /metrics page saved after the run")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument(
        "--engine",
        default=DEFAULT_KIND,
        choices=KINDS,
        help=f"which engine's counter names to read (default {DEFAULT_KIND})",
    )
    p.add_argument(
        "--prefix",
        help="metric name prefix if re-labelled, e.g. kserve_vllm: "
        "(default: the engine's own, vllm:)",
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from exporter.scrape.derive import delta, report, to_json, to_table

    try:
        before, after = (
            p.read_text(encoding="utf-8", errors="replace") for p in (args.before, args.after)
        )
    except OSError as exc:
        print(f"specdec derive: cannot read {exc.filename}: {exc.strerror}", file=sys.stderr)
        return EXIT_USAGE
    fams = families(args.engine, args.prefix)
    found = delta(before, after, fams)
    if found.after_empty:
        print(
            f"specdec derive: {args.after} has no speculative-decoding counters "
            f"({fams.lead}*_total): not a /metrics page of {args.engine} with speculation "
            "on (see --engine, --prefix)",
            file=sys.stderr,
        )
        return EXIT_NO_DATA
    if found.before_empty:
        print(
            f"specdec derive: warning: BEFORE ({args.before}) has no counters: taken as zero — "
            "the engine started with speculation between the two pages?",
            file=sys.stderr,
        )
    if found.swapped:
        print(
            f"specdec derive: counters are lower in {args.after} than in {args.before} with "
            "the same _created stamps (the same engine run): the files are swapped; give "
            "BEFORE first",
            file=sys.stderr,
        )
        return EXIT_NO_DATA
    if found.restarted:
        print(
            f"specdec derive: warning: counters are lower in {args.after} than in {args.before} "
            f"({', '.join(f'{m} engine {e}' for m, e in found.restarted)}): treated as an engine "
            "restart, the increase being AFTER's value; if the engine did not restart, the files "
            "are swapped",
            file=sys.stderr,
        )
    if not any(c.drafts or c.draft_tokens or c.generated for c in found.series.values()):
        print(
            f"specdec derive: nothing changed between {args.before} and {args.after}: no "
            "verify step in between (the same page twice, or no traffic)",
            file=sys.stderr,
        )
    doc = report(found.series)
    print(to_json(doc) if args.json else to_table(doc))
    return 0
