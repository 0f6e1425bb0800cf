"""`specdec <verb>`: the command line. Each verb's --help explains every flag."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from exporter import __version__, logs
from exporter.config import DEFAULT_LISTEN, Config, ConfigError, from_flags, load
from exporter.engines import ENGINE_KINDS, families

EXIT_USAGE = 2


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.verb is None:
        parser.print_help()
        return EXIT_USAGE
    result: int = args.run(args)
    return result


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="specdec",
        description="Live speculative-decoding payoff for vLLM: a Prometheus sidecar and tools.",
    )
    parser.add_argument("--version", action="version", version=f"specdec {__version__}")
    verbs = parser.add_subparsers(dest="verb", metavar="VERB")
    _serve_parser(verbs)
    _derive_parser(verbs)
    return parser


def _serve_parser(verbs: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = verbs.add_parser(
        "serve",
        help="scrape vLLM /metrics and export rolling acceptance",
        description="Scrape one or more vLLM /metrics endpoints continuously and serve derived "
        "speculative-decoding metrics (counters and rolling gauges) on the sidecar's own /metrics.",
    )
    p.add_argument(
        "--config",
        metavar="FILE",
        help="YAML config file (targets, listen, windows). Exclusive with --target.",
    )
    p.add_argument(
        "--target",
        action="append",
        default=[],
        metavar="URL",
        help="a vLLM /metrics URL to scrape, e.g. http://127.0.0.1:8000/metrics (repeatable; "
        "each target is named after its host:port)",
    )
    p.add_argument(
        "--listen",
        metavar="HOST:PORT",
        help=f"where the sidecar serves /metrics (default {DEFAULT_LISTEN[0]}:{DEFAULT_LISTEN[1]}; "
        "overrides the config file's listen)",
    )
    p.add_argument(
        "--interval",
        type=float,
        default=1.0,
        metavar="SECONDS",
        help="seconds between scrapes of each --target (default 1)",
    )
    p.add_argument(
        "--window",
        action="append",
        metavar="DURATION",
        help="a rolling window such as 1m, 5m, 15m (repeatable; default 1m, 5m and 15m)",
    )
    p.add_argument(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="log level (default info); logs are JSON lines unless stdout is a terminal",
    )
    p.set_defaults(run=_serve)


def _derive_parser(verbs: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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
    p.set_defaults(run=_derive)


def _serve(args: argparse.Namespace) -> int:
    logs.setup(args.log_level)
    try:
        config = _serve_config(args)
    except ConfigError as exc:
        print(f"specdec: config error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    from exporter.sidecar import serve

    serve(config)
    return 0


def _serve_config(args: argparse.Namespace) -> Config:
    if args.config and args.target:
        raise ConfigError(
            "command line", None, "--target", "give either --config or --target, not both"
        )
    if args.config:
        config = load(args.config)
        if args.listen:
            flags = from_flags([], args.listen, 1.0, None)
            config = Config(flags.listen, config.targets, config.windows)
        return config
    if not args.target:
        raise ConfigError(
            "command line", None, "--target", "give at least one --target URL or --config FILE"
        )
    return from_flags(args.target, args.listen, args.interval, args.window)


def _derive(args: argparse.Namespace) -> int:
    from exporter.derive import delta, report, to_json, to_table

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
