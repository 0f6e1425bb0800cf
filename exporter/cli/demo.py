"""`specdec demo`: simulator, sidecar, proxy and two workloads on this machine."""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

from exporter import logs
from exporter.core.schedule import BadSchedule, Schedule
from exporter.process import AddressInUse, check_free
from exporter.verbs import EXIT_USAGE, AddVerb


def register(add_verb: AddVerb) -> None:
    p = add_verb(
        "demo",
        help="simulator + sidecar + two workloads, all on this machine",
        description="Run the whole bundle on a laptop: the vLLM simulator, the sidecar scraping "
        "it, and traffic from a Japanese voice chat and an English coding agent sharing one "
        "engine. Prints the URLs, then every few seconds a line per workload and for the engine. "
        "Ctrl-C (or SIGTERM, SIGHUP) stops everything it started and exits 0.",
    )
    p.add_argument(
        "--host", default="127.0.0.1", help="address to bind everything to (default 127.0.0.1)"
    )
    p.add_argument("--sim-port", type=int, default=8000, help="simulated vLLM port (default 8000)")
    p.add_argument(
        "--sidecar-port", type=int, default=10419, help="sidecar /metrics port (default 10419)"
    )
    p.add_argument(
        "--proxy-port",
        type=int,
        default=8001,
        help="route-tagging proxy port, where the workloads send their requests (default 8001)",
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
    p.add_argument(
        "--schedule",
        metavar="JSON",
        help="run a dynamic speculative decoding schedule on the simulator and in the sidecar's "
        "config (vLLM's num_speculative_tokens_per_batch_size, as `specdec advise` prints it, "
        "e.g. '[[1,3,3],[4,15,2],[16,256,0]]'), and print the k in effect per workload",
    )
    p.add_argument(
        "--scenario",
        choices=("steady", "drop"),
        default="steady",
        help="steady (default): both workloads as they are; drop: after a quiet start "
        "(--drop-after), the coding agent's clients move to temperature 0.9 (its traffic "
        "changes: the simulator's requests lose acceptance with their temperature) while the "
        "engine accepts less of the voice chat's drafts (the engine changes), so the Payoff "
        "board's 'Why acceptance moved' row and SpecDecodeAcceptanceDrop's labels (cause=mix "
        "dimension=temperature, cause=within) tell the two apart (use --with-prometheus)",
    )
    p.add_argument(
        "--drop-after",
        type=float,
        default=None,
        metavar="SECONDS",
        help="--scenario drop: seconds before the drop (default 120 with --with-prometheus, "
        "whose TSDB then holds a backfilled quiet day to judge the drop against; 660 without: "
        "the sidecar's split of a change needs a 10-minute window with a baseline before it)",
    )
    p.set_defaults(run=run)


def prometheus_missing(scenario: str) -> str | None:
    """What --with-prometheus lacks here, in one phrase; None when it can run."""
    if shutil.which("prometheus") is None:
        return "needs `prometheus` on PATH (Debian: apt-get install prometheus)"
    if scenario == "drop" and shutil.which("promtool") is None:
        return (
            "--scenario drop needs `promtool` on PATH to backfill a quiet day "
            "(Debian: apt-get install prometheus)"
        )
    if not Path("prometheus.yml").is_file():
        return (
            f"needs the repo's prometheus.yml, not found in {Path.cwd()} (run from the repo root)"
        )
    return None


def run(args: argparse.Namespace) -> int:
    from exporter import demo
    from exporter.demo_prometheus import ChildFailed

    logs.setup("warning")
    schedule = None
    if args.schedule is not None:
        try:
            schedule = Schedule.parse(args.schedule)
        except BadSchedule as exc:
            print(f"specdec demo: --schedule: {exc}", file=sys.stderr)
            return EXIT_USAGE
    options = demo.Options(
        host=args.host,
        sim_port=args.sim_port,
        sidecar_port=args.sidecar_port,
        proxy_port=args.proxy_port,
        speed=args.speed,
        concurrency=args.concurrency,
        report_every=args.report_every,
        duration=args.duration,
        with_prometheus=args.with_prometheus,
        prometheus_port=args.prometheus_port,
        schedule=schedule,
        scenario=args.scenario,
        drop_after=args.drop_after,
    )
    for flag, value, ok, want in (
        ("--speed", options.speed, options.speed > 0, "> 0"),
        ("--report-every", options.report_every, options.report_every > 0, "> 0"),
        ("--concurrency", options.concurrency, options.concurrency >= 1, ">= 1"),
        ("--duration", options.duration, options.duration is None or options.duration > 0, "> 0"),
        ("--drop-after", options.drop_after, options.drop_delay() >= 0, ">= 0"),
    ):
        if not ok:
            print(f"specdec demo: {flag} must be {want}, got {value}", file=sys.stderr)
            return EXIT_USAGE
    if args.with_prometheus:
        missing = prometheus_missing(args.scenario)
        if missing:
            print(f"specdec demo: --with-prometheus: {missing}", file=sys.stderr)
            return EXIT_USAGE
    ports = [
        (args.host, args.sim_port, "--sim-port"),
        (args.host, args.sidecar_port, "--sidecar-port"),
        (args.host, args.proxy_port, "--proxy-port"),
    ]
    if args.with_prometheus:
        ports.append((args.host, args.prometheus_port, "--prometheus-port"))
    try:
        check_free(ports)
    except AddressInUse as exc:
        print(f"specdec demo: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        demo.main(options)
    except ChildFailed as exc:
        print(f"specdec demo: {exc}", file=sys.stderr)
        return 1
    return 0
