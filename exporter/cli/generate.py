"""`specdec rules` and `specdec dashboards`: the generated Prometheus rules and Grafana JSON."""

from __future__ import annotations

import argparse
from pathlib import Path

from exporter.cli.common import Verbs


def register(verbs: Verbs) -> None:
    p = verbs.add_parser(
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
    p.set_defaults(run=rules)
    dashboards_verb = verbs.add_parser(
        "dashboards",
        add_help=False,  # its own parser (dashboards/build.py) explains --check, --preview, ...
        help="generate, check or preview the Grafana dashboards (see `specdec dashboards --help`)",
    )
    dashboards_verb.set_defaults(run=lambda _: dashboards([]))


def rules(args: argparse.Namespace) -> int:
    from dashboards.rules import write

    stale = write(args.root, args.check)
    for path in stale:
        print(f"{'stale' if args.check else 'wrote'}: {path}")
    return 1 if args.check and stale else 0


def dashboards(argv: list[str]) -> int:
    """`specdec dashboards ...` is dashboards/build.py's own command line."""
    from dashboards.build import main as build

    return build(argv)
