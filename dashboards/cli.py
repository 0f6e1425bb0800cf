"""`specdec rules` and `specdec dashboards`: the generated Prometheus rules and Grafana JSON.

A plugin of the command line, found through the `specdec.verbs` entry point (pyproject.toml):
exporter/ never imports the mixin, which builds on its config reader. The PNG previews are a
docs tool outside the wheel: `python3 -m harness.previews` (a checkout)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from exporter.verbs import EXIT_USAGE, AddVerb

EXIT_STALE = 1
CONFIG_HELP = (
    "a mixin config (YAML): job names and selectors, alert thresholds, windows and `for` "
    "durations, the runbook URL, the dashboards' uid prefix, tags and data source; the "
    "defaults reproduce the committed files (docs/mixin.md)"
)


def register(add_verb: AddVerb) -> None:
    p = add_verb(
        "rules",
        help="generate the Prometheus recording rules and alerts",
        description="Write deploy/prometheus/rules/*.yml from the shared PromQL definitions "
        "(dashboards/queries) and alert definitions (dashboards/alerts.py).",
    )
    p.add_argument(
        "--root",
        type=Path,
        default=Path("."),
        help="the repository root to write under (default: the current directory)",
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 if a committed file differs from the generated one",
    )
    p.add_argument("--config", type=Path, metavar="FILE", help=CONFIG_HELP)
    p.set_defaults(run=rules)
    d = add_verb(
        "dashboards",
        help="generate or check the Grafana dashboards",
        description="Write the Grafana dashboards (dashboards/<uid>.json) from their grafanalib "
        "sources (dashboards/boards); --check compares instead of writing.",
    )
    d.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 listing the JSON files that differ from the sources",
    )
    d.add_argument(
        "--out",
        type=Path,
        metavar="DIR",
        help="where the JSON goes (default: dashboards/, where it is committed)",
    )
    d.add_argument("--config", type=Path, metavar="FILE", help=CONFIG_HELP)
    d.set_defaults(run=dashboards)


def _mixin(args: argparse.Namespace) -> Any:
    """The --config file's mixin, the defaults without one; None after printing its errors."""
    from dashboards.config import DEFAULT, load
    from exporter.config import ConfigError

    if args.config is None:
        return DEFAULT
    try:
        return load(args.config)
    except ConfigError as exc:
        for message in exc.messages:
            print(f"specdec {args.verb}: config error: {message}", file=sys.stderr)
        return None


def rules(args: argparse.Namespace) -> int:
    from dashboards.rules import write

    mix = _mixin(args)
    if mix is None:
        return EXIT_USAGE
    stale = write(args.root, args.check, mix)
    for path in stale:
        print(f"{_verdict(args.root / path) if args.check else 'wrote'}: {path}")
    if args.check and stale:
        print(f"(looked under {args.root.resolve()}; `specdec rules --root DIR` writes them)")
    return EXIT_STALE if args.check and stale else 0


def _verdict(path: Path) -> str:
    return "stale" if path.exists() else "missing"


def dashboards(args: argparse.Namespace) -> int:
    from dashboards.boards import build

    mix = _mixin(args)
    if mix is None:
        return EXIT_USAGE
    out = args.out or build.DIRECTORY
    changed = build.write(out, check=args.check, mix=mix)
    for path in changed:
        if not args.check:
            print(f"wrote {path}")
        elif not path.exists():
            print(f"{path}: missing; run `specdec dashboards --out {out}`")
        else:
            print(f"{path}: differs from the dashboard sources; run `specdec dashboards`")
    return EXIT_STALE if args.check and changed else 0
