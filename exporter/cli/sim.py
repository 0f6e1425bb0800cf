"""`specdec sim`: the vLLM simulator."""

from __future__ import annotations

import argparse
import asyncio
import sys

from exporter import logs
from exporter.cli.common import EXIT_USAGE, Verbs
from exporter.config import ENGINE_KINDS, ConfigError, from_flags
from exporter.process import AddressInUse, check_free, run_until_stopped


def register(verbs: Verbs) -> None:
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
    p.add_argument(
        "--adaptive-draft-length",
        action="store_true",
        help="each verify step drafts 1..K tokens (vLLM's adaptive draft length): draft tokens "
        "are no longer K x steps",
    )
    p.add_argument(
        "--engine",
        choices=ENGINE_KINDS,
        default="vllm",
        help="whose wire shapes and metrics page to serve (default vllm): SGLang's sglext "
        "details, llama.cpp's timings and llamacpp:* page, TensorRT-LLM's page at "
        "/prometheus/metrics (no per-request data)",
    )
    p.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    p.add_argument(
        "--profile",
        action="append",
        default=[],
        metavar="NAME=MEAN[:C]",
        help="set a profile's mean acceptance and the concentration C of its per-request spread "
        "(Beta(MEAN C, (1 - MEAN) C); default 15, sd ~0.115 at 0.71; C=inf: identical "
        "requests), e.g. ja_chat=0.36 or code_agent=0.71:inf (repeatable)",
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from aiohttp import web

    from exporter.sim.decoder import SimEngine
    from exporter.sim.profiles import DEFAULT_PROFILES, Profile
    from exporter.sim.server import build_app

    logs.setup()
    profiles = dict(DEFAULT_PROFILES)
    try:
        host, port = from_flags([], args.listen, 1.0, None).listen
        for item in args.profile:
            name, _, value = item.partition("=")
            mean, _, concentration = value.partition(":")
            if not name:
                raise ValueError(f"--profile wants NAME=MEAN[:C], got {item!r}")
            base = profiles.get(name, Profile(name, 0.0))
            profiles[name] = Profile(
                name, float(mean), base.decay, float(concentration or base.concentration)
            )
        if args.engines < 1 or args.num_speculative_tokens < 0 or args.speed <= 0:
            raise ValueError("--engines >= 1, --num-speculative-tokens >= 0, --speed > 0")
    except (ConfigError, ValueError) as exc:
        print(f"specdec sim: bad arguments: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        check_free([(host, port, "--listen")])
    except AddressInUse as exc:
        print(f"specdec sim: {exc}", file=sys.stderr)
        return EXIT_USAGE
    engine = SimEngine(
        args.model,
        args.num_speculative_tokens,
        args.engines,
        args.speed,
        args.seed,
        profiles,
        adaptive=args.adaptive_draft_length,
    )
    app = build_app(engine, args.per_request_spec_decode_metrics, dialect=args.engine)

    async def main() -> None:
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        try:
            await web.TCPSite(runner, host, port).start()
            logs.get("sim").info(
                "simulator listening", url=f"http://{host}:{port}", model=args.model
            )
            await asyncio.Event().wait()
        finally:
            await runner.cleanup()

    run_until_stopped(main)
    return 0
