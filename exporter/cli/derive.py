"""`specdec derive BEFORE AFTER`: acceptance between two saved /metrics pages."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from exporter.cli.common import EXIT_USAGE, Verbs
from exporter.config import ENGINE_KINDS
from exporter.scrape.families import families


def register(verbs: Verbs) -> None:
    p = verbs.add_parser(
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
        default="vllm",
        choices=ENGINE_KINDS,
        help="which engine's counter names to read (default vllm)",
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
        print(f"specdec: {exc}", file=sys.stderr)
        return EXIT_USAGE
    doc = report(delta(before, after, families(args.engine, args.prefix)))
    print(to_json(doc) if args.json else to_table(doc))
    return 0
