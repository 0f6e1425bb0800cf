"""`specdec measure`: the published per-scenario table against any endpoint."""

from __future__ import annotations

from pathlib import Path

from exporter.cli.common import Verbs
from exporter.measure import command


def register(verbs: Verbs) -> None:
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
    p.set_defaults(run=command.run)
