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
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["dashboards"]:
        return _dashboards(argv[1:])
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
    _sim_parser(verbs)
    _demo_parser(verbs)
    _rules_parser(verbs)
    _measure_parser(verbs)
    dashboards = verbs.add_parser(
        "dashboards",
        add_help=False,  # its own parser (dashboards/build.py) explains --check, --preview, ...
        help="generate, check or preview the Grafana dashboards (see `specdec dashboards --help`)",
    )
    dashboards.set_defaults(run=lambda _: _dashboards([]))
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


def _sim_parser(verbs: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = verbs.add_parser(
        "sim",
        help="run the vLLM simulator (OpenAI API + vLLM /metrics)",
        description="An aiohttp server that behaves like vLLM's OpenAI-compatible server with "
        "speculative decoding: /v1/chat/completions, /v1/completions, /v1/models, /health, "
        "/metrics, and an admin API (/admin/restart, /admin/profile, /admin/fault, /admin/truth). "
        "Each request's acceptance comes from a profile chosen by its text: Japanese -> ja_chat "
        "(0.36), code or tools -> code_agent (0.71), else default (0.55).",
    )
    p.add_argument(
        "--listen",
        default="127.0.0.1:8000",
        metavar="HOST:PORT",
        help="where to serve (default 127.0.0.1:8000, vLLM's default port)",
    )
    p.add_argument("--model", default="sim-27b", help="the served model name (default sim-27b)")
    p.add_argument(
        "--engines",
        type=int,
        default=1,
        metavar="N",
        help="data-parallel engines: `engine` labels 0..N-1 (default 1)",
    )
    p.add_argument(
        "--num-speculative-tokens",
        type=int,
        default=3,
        metavar="K",
        help="draft tokens per verify step; 0 serves without speculation (default 3)",
    )
    p.add_argument(
        "--per-request-spec-decode-metrics",
        default="summary",
        choices=["none", "summary", "detailed"],
        help="per-request metrics.speculative_decoding object, as vLLM's flag (default summary)",
    )
    p.add_argument(
        "--speed",
        type=float,
        default=1.0,
        metavar="X",
        help="divide every simulated delay by X (tests use 50-1000; default 1 = "
        "real-time dense-27B single-stream: 72 tok/s plain)",
    )
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument(
        "--profile",
        action="append",
        default=[],
        metavar="NAME=ACCEPTANCE",
        help="set a profile's acceptance, e.g. ja_chat=0.36 (repeatable)",
    )
    p.set_defaults(run=_sim)


def _sim(args: argparse.Namespace) -> int:
    from aiohttp import web

    from exporter.sim.engine import SimEngine
    from exporter.sim.profiles import DEFAULT_PROFILES, Profile
    from exporter.sim.server import build_app

    logs.setup()
    profiles = dict(DEFAULT_PROFILES)
    try:
        host, port = from_flags([], args.listen, 1.0, None).listen
        for item in args.profile:
            name, _, value = item.partition("=")
            acceptance = float(value)
            if not name or not 0 <= acceptance <= 1:
                raise ValueError(item)
            profiles[name] = Profile(name, acceptance)
        if args.engines < 1 or args.num_speculative_tokens < 0 or args.speed <= 0:
            raise ValueError("--engines >= 1, --num-speculative-tokens >= 0, --speed > 0")
    except (ConfigError, ValueError) as exc:
        print(f"specdec sim: bad arguments: {exc}", file=sys.stderr)
        return EXIT_USAGE
    engine = SimEngine(
        args.model, args.num_speculative_tokens, args.engines, args.speed, args.seed, profiles
    )
    logs.get("sim").info("simulator listening", url=f"http://{host}:{port}", model=args.model)
    web.run_app(
        build_app(engine, args.per_request_spec_decode_metrics),
        host=host,
        port=port,
        print=None,
        access_log=None,
    )
    return 0


def _demo_parser(verbs: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = verbs.add_parser(
        "demo",
        help="simulator + sidecar + two workloads, all on this machine",
        description="Run the whole bundle on a laptop: the vLLM simulator, the sidecar scraping "
        "it, and traffic from a Japanese voice chat and an English coding agent sharing one "
        "engine. Prints the URLs, then every few seconds a line per workload and for the engine. "
        "Ctrl-C stops everything.",
    )
    p.add_argument(
        "--host", default="127.0.0.1", help="address to bind everything to (default 127.0.0.1)"
    )
    p.add_argument("--sim-port", type=int, default=8000, help="simulated vLLM port (default 8000)")
    p.add_argument(
        "--sidecar-port", type=int, default=10419, help="sidecar /metrics port (default 10419)"
    )
    p.add_argument(
        "--speed",
        type=float,
        default=1.0,
        metavar="X",
        help="run the simulated engine X times faster than real time (default 1)",
    )
    p.add_argument(
        "--concurrency",
        type=int,
        default=2,
        metavar="N",
        help="concurrent clients per workload (default 2)",
    )
    p.add_argument(
        "--report-every",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="seconds between progress lines (default 5)",
    )
    p.add_argument(
        "--duration",
        type=float,
        metavar="SECONDS",
        help="stop after this many seconds (default: run until Ctrl-C)",
    )
    p.add_argument(
        "--with-prometheus",
        action="store_true",
        help="also run Debian's `prometheus` with ./prometheus.yml if it is on PATH",
    )
    p.add_argument(
        "--prometheus-port",
        type=int,
        default=9090,
        help="port for --with-prometheus (default 9090)",
    )
    p.set_defaults(run=_demo)


def _demo(args: argparse.Namespace) -> int:
    from exporter import demo

    logs.setup("warning")
    options = demo.Options(
        host=args.host,
        sim_port=args.sim_port,
        sidecar_port=args.sidecar_port,
        speed=args.speed,
        concurrency=args.concurrency,
        report_every=args.report_every,
        duration=args.duration,
        with_prometheus=args.with_prometheus,
        prometheus_port=args.prometheus_port,
    )
    if options.speed <= 0 or options.concurrency < 1 or options.report_every <= 0:
        print(
            "specdec demo: --speed and --report-every must be > 0, --concurrency >= 1",
            file=sys.stderr,
        )
        return EXIT_USAGE
    demo.main(options)
    return 0


def _rules_parser(verbs: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
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
    p.set_defaults(run=_rules)


def _rules(args: argparse.Namespace) -> int:
    from dashboards.rules import write

    stale = write(args.root, args.check)
    for path in stale:
        print(f"{'stale' if args.check else 'wrote'}: {path}")
    return 1 if args.check and stale else 0


def _measure_parser(verbs: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = verbs.add_parser(
        "measure",
        help="the published per-scenario table against any endpoint",
        description="Replay scenarios (streaming chat completions) against an OpenAI-compatible "
        "endpoint and report per scenario: median TTFT and decode rate (completion tokens / "
        "seconds after the first token), draft acceptance from the engine's /metrics delta and "
        "from vLLM's per-request objects, tokens per step; with a baseline (the same model "
        "without speculation) the speedup, step cost ratio and break-even acceptance, printed as "
        "a ready `models:` block for the sidecar config.",
    )
    p.add_argument(
        "--base-url",
        required=True,
        metavar="URL",
        help="the server's base URL, e.g. http://127.0.0.1:8000 (without /v1)",
    )
    p.add_argument(
        "--metrics-url",
        metavar="URL",
        help="the engine's Prometheus page (default: BASE_URL/metrics, where vLLM serves it)",
    )
    p.add_argument(
        "--scenario",
        action="append",
        default=[],
        metavar="NAME",
        help="a built-in scenario pack: ja_chat or code_agent (repeatable)",
    )
    p.add_argument(
        "--scenario-file",
        action="append",
        default=[],
        type=Path,
        metavar="FILE",
        help="your own scenarios, YAML or JSONL with name, max_tokens, system, prompts "
        "(repeatable)",
    )
    p.add_argument(
        "--runs",
        type=int,
        default=1,
        metavar="N",
        help="how many times each prompt is sent (default 1)",
    )
    p.add_argument(
        "--concurrency",
        type=int,
        default=1,
        metavar="N",
        help="requests in flight at once (default 1: single-stream, as published)",
    )
    p.add_argument("--model", help="the model name to request (default: the first of /v1/models)")
    p.add_argument(
        "--temperature",
        type=float,
        metavar="T",
        help="sampling temperature sent with each request (default: the server's own; "
        "0 gives greedy, repeatable output)",
    )
    p.add_argument(
        "--baseline-url",
        metavar="URL",
        help="the same model served without speculation: adds plain decode and speedup",
    )
    p.add_argument(
        "--baseline-file",
        type=Path,
        metavar="FILE",
        help="an earlier `--json` output to use as the baseline instead of --baseline-url",
    )
    p.add_argument(
        "--bytes-per-token",
        type=float,
        metavar="B",
        help="bytes read per decoded token (about the weights' size), for the roofline",
    )
    p.add_argument(
        "--bandwidth",
        type=float,
        metavar="BPS",
        help="memory bandwidth in bytes/s, for the roofline (with --bytes-per-token)",
    )
    out = p.add_mutually_exclusive_group()
    out.add_argument(
        "--json", action="store_true", help="print the JSON document instead of a table"
    )
    out.add_argument("--csv", action="store_true", help="print CSV instead of a table")
    p.add_argument(
        "--plot",
        metavar="FILE.png",
        help="also draw decode tok/s and acceptance per scenario (needs matplotlib)",
    )
    p.set_defaults(run=_measure)


def _dashboards(argv: list[str]) -> int:
    """`specdec dashboards ...` is dashboards/build.py's own command line."""
    from dashboards.build import main as build

    return build(argv)


def _measure(args: argparse.Namespace) -> int:
    from exporter.measure.command import run

    return run(args)


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
