"""`specdec serve`: the sidecar (scrape loops, /metrics and, when configured, the proxy)."""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace

from exporter import logs
from exporter.cli.common import duration
from exporter.config import (
    DEFAULT_INTERVAL,
    DEFAULT_LISTEN,
    Config,
    ConfigError,
    ModelConfig,
    Placeholder,
    from_flags,
    load_with_placeholders,
)
from exporter.config.nodes import Reader
from exporter.process import AddressInUse, check_free
from exporter.verbs import EXIT_USAGE, AddVerb


def register(add_verb: AddVerb) -> None:
    p = add_verb(
        "serve",
        help="scrape vLLM /metrics and export rolling acceptance",
        description="Scrape one or more vLLM /metrics endpoints continuously and serve derived "
        "speculative-decoding metrics (counters and rolling gauges) on the sidecar's own /metrics. "
        "SIGTERM or SIGINT drains the proxy's requests in flight and exits 0; a second one during "
        "the drain cuts them and exits 1. SIGHUP reloads the config.",
    )
    p.add_argument(
        "--config",
        metavar="FILE",
        help="YAML config file: listen, windows, targets, the proxy and its routes, models "
        "(docs/configuration.md). Exclusive with --target.",
    )
    p.add_argument(
        "--target",
        action="append",
        default=[],
        metavar="URL",
        help="a vLLM /metrics URL to scrape, e.g. http://127.0.0.1:8000/metrics; a URL without "
        "a path (http://127.0.0.1:8000) means its /metrics (repeatable; each target is named "
        "after its host:port)",
    )
    p.add_argument(
        "--listen",
        metavar="HOST:PORT",
        help=f"where the sidecar serves /metrics (default {DEFAULT_LISTEN[0]}:{DEFAULT_LISTEN[1]}; "
        "overrides the config file's listen)",
    )
    p.add_argument(
        "--proxy-listen",
        metavar="HOST:PORT",
        help="where the route-tagging proxy listens (overrides the config file's proxy.listen; "
        "needs a proxy: section)",
    )
    p.add_argument(
        "--interval",
        type=duration,
        default=DEFAULT_INTERVAL,
        metavar="DURATION",
        help="time between scrapes of each --target: seconds (2.5) or a duration such as 500ms "
        f"or 10s (default {DEFAULT_INTERVAL:g}s)",
    )
    p.add_argument(
        "--window",
        action="append",
        metavar="DURATION",
        help="a rolling window such as 1m, 5m, 15m (repeatable; default 1m, 5m and 15m)",
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="read the config and flags, print what would be served and exit 0 (2 with the "
        "errors, all of them, in the file's order), with a warning per value still a "
        "placeholder; starts nothing, so it may run beside the live sidecar",
    )
    p.add_argument(
        "--strict",
        action="store_true",
        help="with --check: exit 1 where the config still holds a placeholder (a value tagged "
        "!placeholder, as the starter deploy/specdec.yaml's examples are); without it each is "
        "a warning and the exit 0",
    )
    p.add_argument(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="log level (default info); logs are JSON lines unless stdout is a terminal",
    )
    p.set_defaults(run=run)


EXIT_PLACEHOLDERS = 1  # --check --strict: the config loads, but still holds a placeholder


def run(args: argparse.Namespace) -> int:
    logs.setup(args.log_level)
    if args.strict and not args.check:
        print("specdec serve: --strict goes with --check", file=sys.stderr)
        return EXIT_USAGE
    try:
        config, placeholders = _configured(args)
    except ConfigError as exc:
        for message in exc.messages:
            print(f"specdec serve: config error: {message}", file=sys.stderr)
        return EXIT_USAGE
    if args.check:
        for placeholder in placeholders:
            print(f"specdec serve: warning: {placeholder}", file=sys.stderr)
        if args.strict and placeholders:
            left = f"{len(placeholders)} placeholder(s) left (--strict)"
            print(f"specdec serve: {left}", file=sys.stderr)
            return EXIT_PLACEHOLDERS
        print(f"specdec serve: {summary(config)}")
        return 0
    try:
        check_free(_addresses(args, config))
    except AddressInUse as exc:
        print(f"specdec serve: {exc}", file=sys.stderr)
        return EXIT_USAGE
    for placeholder in placeholders:  # it runs, but its figures rest on an example's values
        where = f"{placeholder.source}:{placeholder.line}"
        logs.get("serve").warning(
            "placeholder in the config", where=where, key=placeholder.key, value=placeholder.value
        )
    from exporter.sidecar import serve

    return serve(config, lambda: _serve_config(args))  # SIGHUP: read again, same flags


def summary(config: Config) -> str:
    """What a config serves, in one line: what `--check` prints."""
    host, port = config.listen
    parts = [f"metrics on {host}:{port}", f"{len(config.targets)} target(s)"]
    if config.proxy is not None:
        routes = ", ".join(r.name for r in config.proxy.routes) or "none"
        phost, pport = config.proxy.listen
        parts.append(f"proxy on {phost}:{pport} to {config.proxy.upstream} (routes: {routes}; "
                     f"else {config.proxy.default_route})")  # fmt: skip
    models = [f"{m.name} ({_payoff_basis(m)})" for m in config.models]
    parts.append(f"models: {', '.join(models)}" if models else "no models: (no payoff figures)")
    return "config OK: " + "; ".join(parts)


def _payoff_basis(model: ModelConfig) -> str:
    if model.step_time:
        return f"step_time measured to {max(p.running for p in model.step_time):g} running"
    if model.plain_decode_tokens_per_second:
        return "the single-stream point: load-blind"
    return "no plain rate: no speedup figures"


def _addresses(args: argparse.Namespace, config: Config) -> list[tuple[str, int, str]]:
    """Every address serve listens on, with the flag or config key that sets it."""
    source = f"in {args.config}" if args.config else "(the default)"
    listen = "--listen" if args.listen else f"listen {source}"
    out = [(*config.listen, listen)]
    if config.proxy is not None:
        where = "--proxy-listen" if args.proxy_listen else f"proxy.listen {source}"
        out.append((*config.proxy.listen, where))
    return out


def _serve_config(args: argparse.Namespace) -> Config:
    """The config the flags give (a SIGHUP reads it again with the same flags)."""
    return _configured(args)[0]


def _configured(args: argparse.Namespace) -> tuple[Config, tuple[Placeholder, ...]]:
    """The config the flags give, and the config file's placeholders (none from flags)."""
    if args.config and args.target:
        raise ConfigError(
            "command line", None, "--target", "give either --config or --target, not both"
        )
    if args.config:
        config, placeholders = load_with_placeholders(args.config)
        if args.listen:
            config = replace(config, listen=from_flags([], args.listen, 1.0, None).listen)
        if args.proxy_listen:
            if config.proxy is None:
                raise ConfigError(
                    "command line", None, "--proxy-listen", f"{args.config} has no proxy: section"
                )
            listen = Reader("command line").listen_address(
                args.proxy_listen, None, "--proxy-listen"
            )
            config = replace(config, proxy=replace(config.proxy, listen=listen))
        return config, placeholders
    if args.proxy_listen:
        raise ConfigError(
            "command line", None, "--proxy-listen", "the proxy needs a config file (--config)"
        )
    if not args.target:
        raise ConfigError(
            "command line", None, "--target", "give at least one --target URL or --config FILE"
        )
    return from_flags(args.target, args.listen, args.interval, args.window), ()
