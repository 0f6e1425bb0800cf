"""`specdec measure`: the published per-scenario table against any endpoint. Bad input gets
a clear error (exit 2); Ctrl-C prints what was measured so far."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from exporter.engines import DEFAULT, KINDS, engine
from exporter.engines.base import Engine
from exporter.measure.curve import REPLICATES, measure_curve
from exporter.measure.level import Level
from exporter.measure.report import (
    Roofline,
    curve_plot,
    curve_table,
    document,
    plot,
    to_csv,
    to_json,
    to_table,
)
from exporter.measure.runner import (
    MeasureError,
    Plan,
    ScenarioResult,
    detect,
    draft_length,
    measure,
)
from exporter.measure.scenarios import Scenario, ScenarioError, builtin, load_file
from exporter.verbs import EXIT_INTERRUPTED, EXIT_USAGE, AddVerb

EXIT_FAILED = 1
DEFAULT_CONTEXT_TOKENS = 512


HOW_LONG = (
    "How long the curve takes: several --concurrency levels run levels x 2 sides (speculative, "
    "plain) x (--replicates, + 1 with --context-tokens) phases, each sending every prompt at "
    "least --runs times and at least 3 x the level's concurrency requests; measure prints this "
    "plan before the first request and the time left after each phase. Shorter, and what it "
    "costs: --replicates 1 (12 phases of the defaults' 18): no error over the run (*_spread), "
    "so one disturbed phase goes unseen (on a GPU one read a step 23% off another of the same "
    "start) and the sidecar's drift check holds the live step to the curve within its 3% floor "
    "only; --context-tokens 0 (12 of 18): no per-context-token slopes, so the sidecar reads the "
    "curve at measure's own context (at 4x it the cost ratio moved ~8% on the simulator at batch "
    "32); fewer levels: the curve is linear between its points and flat beyond the highest "
    "(advise says nothing past it); fewer prompts (a --scenario-file) shorten the low levels "
    "most, which send every prompt once, one after another at c=1: a step's standard error "
    "(*_error) grows as about 1/sqrt of the decode it reads. --runs (default 1) only lengthens. "
    "More: docs/metrics.md, 'How long measure --concurrency takes'."
)


def register(add_verb: AddVerb) -> None:
    p = add_verb(
        "measure",
        help="the published per-scenario table against any endpoint",
        description="Replay scenarios (streaming chat completions) against an OpenAI-compatible "
        "endpoint and report per scenario: median TTFT and decode rate (completion tokens / "
        "seconds after the first token), draft acceptance from the engine's /metrics delta and "
        "from vLLM's per-request objects, tokens per step; with a baseline (the same model "
        "without speculation) the speedup, step cost ratio and break-even acceptance, printed as "
        "a ready `models:` block for the sidecar config.",
        epilog=HOW_LONG,
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
        help="your own scenarios, YAML or JSONL with name, max_tokens, system, prompts, "
        "extra_body and weight (its requests against the others' under --concurrency) "
        "(repeatable)",
    )
    p.add_argument(
        "--runs",
        type=int,
        default=1,
        metavar="N",
        help="how many times each prompt is sent at least (default 1; more only lengthens)",
    )
    p.add_argument(
        "--concurrency",
        default="1",
        metavar="N[,N...]",
        help="requests in flight at once (default 1: single-stream, as published); several "
        "levels (1,4,16) with --baseline-url measure the step-time curve: per level the "
        "engine's running requests, seconds per step with and without speculation, the "
        "speedup, and a `models:` block with the curve",
    )
    p.add_argument(
        "--context-tokens",
        type=int,
        default=DEFAULT_CONTEXT_TOKENS,
        metavar="N",
        help="with several --concurrency levels: each level again with about N tokens more "
        "context in every request, for what a step gains per token of context (the sidecar "
        f"reads the curve at the live context with it; default {DEFAULT_CONTEXT_TOKENS}, "
        "0 skips it; keep N + the longest request under the engine's context per sequence)",
    )
    p.add_argument(
        "--replicates",
        type=int,
        default=REPLICATES,
        metavar="N",
        help="with several --concurrency levels: each level's speculative and plain phases N "
        "times (default %(default)s), alternated and round-robin over the levels (every level "
        "once, then every level again: a level's replicates are a round apart), and once more "
        "where no two of a side's agree within 5 %% (one phase can run far off the others on "
        "the same engine). A step's figure is its fastest replicate and those within 3 %% of "
        "it (a disturbance only adds time); its error over the run (`*_spread`) reaches the "
        "farthest replicate. 1: one phase each, no error over the run",
    )
    p.add_argument(
        "--engine",
        choices=KINDS,
        help="the serving engine, whose counters, batch gauge and per-request figures are read "
        "(default: recognised from the /metrics page)",
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
    p.set_defaults(run=run)


@dataclass
class Setup:
    """What the flags ask for, checked before the first request is sent."""

    scenarios: list[Scenario]
    baseline_file: list[dict[str, Any]] | None
    levels: list[int]
    plan: Plan
    roofline: Roofline | None
    base: str
    plain_base: str | None


class UsageError(ValueError):
    """A flag that cannot work: one line, exit 2."""


def run(args: argparse.Namespace) -> int:
    try:
        setup = _setup(args)
    except UsageError as exc:
        print(f"specdec measure: {exc}", file=sys.stderr)
        return EXIT_USAGE
    # a stop from a supervisor (timeout, kill) reports what was measured, as Ctrl-C does
    signal.signal(signal.SIGTERM, lambda *_: signal.raise_signal(signal.SIGINT))
    try:
        found = _engine(args, setup.base)
    except MeasureError as exc:
        print(f"specdec measure: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print("\nspecdec measure: interrupted before the first request", file=sys.stderr)
        return EXIT_INTERRUPTED
    setup.plan = replace(setup.plan, engine=found)
    if len(setup.levels) > 1 and setup.plain_base is not None:  # _setup checked it is given
        return _curve(args, setup.base, setup.plain_base, setup.scenarios, setup.levels,
                      setup.plan)  # fmt: skip
    return _one_level(args, setup)


def _setup(args: argparse.Namespace) -> Setup:
    """The flags checked and read; UsageError names the one that cannot work."""
    try:
        scenarios = _scenarios(args.scenario, args.scenario_file)
        baseline_file = _baseline_file(args.baseline_file) if args.baseline_file else None
    except (ScenarioError, ValueError) as exc:
        raise UsageError(str(exc)) from None
    levels = _levels(args.concurrency)
    if args.runs < 1 or levels is None:
        raise UsageError(
            "--runs must be >= 1 and --concurrency N or N,N,... with each N "
            f">= 1 (got --concurrency {args.concurrency!r})"
        )
    if args.context_tokens < 0:
        raise UsageError(f"--context-tokens takes N >= 0, got {args.context_tokens}")
    if args.replicates < 1:
        raise UsageError(f"--replicates takes N >= 1, got {args.replicates}")
    if len(levels) > 1 and not args.baseline_url:
        raise UsageError(
            "several --concurrency levels measure the step-time curve and "
            "need --baseline-url (the same model without speculation)"
        )
    if args.plot and not _writable(args.plot):
        raise UsageError(f"--plot {args.plot}: cannot write there")
    if (args.bytes_per_token is None) != (args.bandwidth is None):
        raise UsageError("give --bytes-per-token and --bandwidth together")
    try:
        base = base_url(args.base_url, "--base-url")
        plain_base = base_url(args.baseline_url, "--baseline-url") if args.baseline_url else None
        if args.metrics_url:
            base_url(args.metrics_url, "--metrics-url", strip_v1=False)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return Setup(
        scenarios,
        baseline_file,
        levels,
        Plan(args.runs, levels[0], args.temperature),
        Roofline(args.bytes_per_token, args.bandwidth) if args.bandwidth else None,
        base,
        plain_base,
    )


def _engine(args: argparse.Namespace, base: str) -> Engine:
    """--engine, else the engine the endpoint's /metrics page shows (vLLM when it shows none:
    its acceptance is then said to be unknown)."""
    if args.engine:
        return engine(args.engine)
    return asyncio.run(detect(args.metrics_url or f"{base}/metrics")) or DEFAULT


def _one_level(args: argparse.Namespace, setup: Setup) -> int:
    """One level: each scenario against the endpoint, interleaved with the baseline's."""
    spec: list[ScenarioResult] = []
    plain: list[ScenarioResult] = []
    code = 0
    metrics_url = args.metrics_url or f"{setup.base}/metrics"
    try:
        for scenario in setup.scenarios:  # interleaved with the baseline: both see the same load
            runs = [(setup.base, metrics_url, args.model, spec)]
            if setup.plain_base:
                runs.append((setup.plain_base, f"{setup.plain_base}/metrics", None, plain))
            for url, metrics, model, into in runs:
                asyncio.run(measure(url, metrics, [scenario], model, setup.plan, into))
    except MeasureError as exc:
        print(f"specdec measure: {exc}", file=sys.stderr)
        code = EXIT_FAILED
    except KeyboardInterrupt:
        print("\nspecdec measure: interrupted; what was measured so far:", file=sys.stderr)
        for result in (*spec, *plain):
            result.interrupted = result.counted is None  # its after-page was never read
        code = EXIT_INTERRUPTED
    rows = [r.row() for r in spec if r.requests]
    if not rows:
        return code or EXIT_FAILED
    baseline = (
        setup.baseline_file
        if setup.baseline_file is not None
        else ([r.row() for r in plain if r.requests] or None)
    )
    doc = document(rows, baseline, setup.roofline)
    failures = [f for r in spec for f in r.failures]
    if failures:
        print(
            f"specdec measure: {len(failures)} request(s) failed, e.g. {failures[0]}",
            file=sys.stderr,
        )
    print(
        to_json(doc)
        if args.json
        else to_csv(doc)
        if args.csv
        else to_table(doc, _served_model(spec))
    )
    if args.plot and not _drawn(lambda: plot(doc, args.plot)):
        return EXIT_FAILED
    return code


def _curve(
    args: argparse.Namespace,
    base: str,
    plain_base: str,
    scenarios: list[Scenario],
    levels: list[int],
    plan: Plan,
) -> int:
    """The step-time curve: every level against both endpoints, then the table or JSON."""
    found: list[Level] = []
    code = 0
    try:
        asyncio.run(
            measure_curve(
                base,
                plain_base,
                scenarios,
                args.model,
                levels,
                plan,
                found,
                args.context_tokens,
                args.replicates,
            )
        )
    except MeasureError as exc:
        print(f"specdec measure: {exc}", file=sys.stderr)
        code = EXIT_FAILED
    except KeyboardInterrupt:
        print("\nspecdec measure: interrupted; the levels measured so far:", file=sys.stderr)
        code = EXIT_INTERRUPTED
    rows = [level.row() for level in found if level.spec.requests and level.plain.requests]
    if not rows:
        return code or EXIT_FAILED
    k = _draft_length(found)
    model = _served_model([r for level in found for r in level.spec.results]) or "MODEL"
    print(to_json({"levels": rows}) if args.json else curve_table(rows, model, k))
    if args.plot and not _drawn(lambda: curve_plot(rows, args.plot)):
        return EXIT_FAILED
    return code


def _drawn(draw: Callable[[], None]) -> bool:
    """Draw the --plot picture; False (said in one line) without matplotlib."""
    try:
        draw()
    except ImportError:
        print("specdec measure: --plot needs matplotlib (pip install 'specdec[plot]')",
              file=sys.stderr)  # fmt: skip
        return False
    return True


def _draft_length(levels: list[Level]) -> int | None:
    """k as the engine's counters state it over the speculative phases (`runner.draft_length`)."""
    counted = [level.spec.counted for level in levels if level.spec.counted]
    return max((k for c in counted if (k := draft_length(c)) is not None), default=None)


def _served_model(results: list[ScenarioResult]) -> str | None:
    """The model name the requests asked for (the first of /v1/models unless --model)."""
    return next((r.model for r in results if r.model), None)


def _levels(text: str) -> list[int] | None:
    """`1,4,16` -> [1, 4, 16]; None unless every part is a whole number >= 1."""
    try:
        levels = [int(part) for part in text.split(",")]
    except ValueError:
        return None
    return levels if levels and min(levels) >= 1 else None


def _writable(path: str) -> bool:
    """Whether a file can be created at `path` (its directory exists and is writable)."""
    parent = Path(path).expanduser().resolve().parent
    return parent.is_dir() and os.access(parent, os.W_OK)


def base_url(url: str, flag: str, strip_v1: bool = True) -> str:
    """An endpoint's base URL: http(s)://HOST:PORT, a trailing /v1 taken off (the client adds
    /v1/...); ValueError with a hint for one without a scheme."""
    url = url.rstrip("/")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        guess = f"http://{url}" if "://" not in url else None
        hint = f"; did you mean {guess!r}?" if guess else ""
        raise ValueError(f"{flag} wants http(s)://HOST:PORT, got {url!r}{hint}")
    return url.removesuffix("/v1") if strip_v1 else url


def _scenarios(names: list[str], files: list[Path]) -> list[Scenario]:
    found: list[Scenario] = []
    for name in names:
        try:
            found.append(builtin(name))
        except KeyError as exc:
            raise ScenarioError(str(exc.args[0])) from None
    for path in files:
        found.extend(load_file(path))
    if not found:
        raise ScenarioError("give at least one --scenario (ja_chat, code_agent) or --scenario-file")
    return found


def _baseline_file(path: Path) -> list[dict[str, Any]]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        rows = data["scenarios"]
        if not isinstance(rows, list) or not all(
            isinstance(r, dict) and "decode_tokens_per_second_median" in r for r in rows
        ):
            raise ValueError("its scenarios are not measure rows")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path}: not a `specdec measure --json` output ({exc})") from None
    return rows
