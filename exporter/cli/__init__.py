"""`specdec <verb>`: the command line, one module per verb, and the verbs other packages of
the distribution register under the `specdec.verbs` entry point (`specdec rules` and `specdec
dashboards`, from dashboards/cli.py). Each verb's --help explains every flag."""

from __future__ import annotations

import argparse
import importlib.metadata
import sys

from exporter import __version__
from exporter.verbs import EXIT_INTERRUPTED, EXIT_USAGE


def main(argv: list[str] | None = None) -> int:
    """The console script. The verbs are imported here, not at module level, so that a Ctrl-C
    while they load (about 0.4 s) is one line and exit 130 rather than an import traceback."""
    try:
        return _dispatch(sys.argv[1:] if argv is None else argv)
    except KeyboardInterrupt:  # before the verb put its own handling in place
        print("specdec: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


def _dispatch(argv: list[str]) -> int:
    parser = _parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # with the verb's own usage, not the top level's
        (parser if args.verb is None else args.parser).error(
            f"unrecognized arguments: {' '.join(unknown)}"
        )
    if args.verb is None:
        parser.print_help()
        return EXIT_USAGE
    result: int = args.run(args)
    return result


def _parser() -> argparse.ArgumentParser:
    from exporter.cli import advise, demo, derive, measure, serve, sim

    parser = argparse.ArgumentParser(
        prog="specdec",
        description="Live speculative-decoding payoff for vLLM: a Prometheus sidecar and tools.",
    )
    parser.add_argument("--version", action="version", version=f"specdec {__version__}")
    verbs = parser.add_subparsers(dest="verb", metavar="VERB")
    for verb in (serve, derive, sim, demo, measure, advise):
        verb.register(verbs.add_parser)
    for entry in importlib.metadata.entry_points(group="specdec.verbs"):
        entry.load()(verbs.add_parser)
    for name, sub in verbs.choices.items():
        sub.set_defaults(parser=sub, verb=name)
    return parser
