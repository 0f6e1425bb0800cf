"""`specdec sim`: the vLLM simulator."""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

from exporter import logs
from exporter.config import ConfigError, from_flags
from exporter.core.schedule import BadSchedule, Schedule
from exporter.engines import DEFAULT_KIND, KINDS
from exporter.process import AddressInUse, check_free, run_until_stopped
from exporter.verbs import EXIT_USAGE, AddVerb


def register(add_verb: AddVerb) -> None:
    p = add_verb(
        "sim",
        help="run the vLLM simulator (OpenAI API + vLLM /metrics)",
        description="An aiohttp server that behaves like vLLM's OpenAI-compatible server with "
        "speculative decoding: /v1/chat/completions, /v1/completions, /v1/models, /health, "
        "/metrics, and an admin API (/admin/restart, /admin/profile, /admin/fault, /admin/truth). "
        "Each request's acceptance comes from a profile chosen by its text: Japanese -> ja_chat "
        "(0.36), code or tools -> code_agent (0.71), else default (0.55); a request's "
        "`temperature` T keeps 1 - 0.4 min(T, 1.5) of it (greedy or unset 1, 0.64 at 0.9, 0.6 "
        "at 1, 0.4 from 1.5: sampled drafts match less often), so a client that starts "
        "sampling moves its route's acceptance as a traffic change would on vLLM.",
    )
    p.add_argument(
        "--listen",
        default="127.0.0.1:8000",
        metavar="HOST:PORT",
        help="where to serve (default 127.0.0.1:8000, vLLM's default port)",
    )
    p.add_argument("--model", default="sim-27b", help="the served model name (default sim-27b)")
    p.add_argument(
        "--data-parallel-size",
        type=int,
        default=1,
        metavar="N",
        help="data-parallel engines, as vLLM's flag: `engine` labels 0..N-1 (default 1)",
    )
    p.add_argument(
        "--num-speculative-tokens",
        type=int,
        default=3,
        metavar="N",
        help="the draft length: draft tokens per verify step; 0 serves without speculation "
        "(default 3)",
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
        help="each verify step drafts 1..N tokens, N = --num-speculative-tokens (vLLM's adaptive "
        "draft length): draft tokens are no longer N x steps",
    )
    p.add_argument(
        "--schedule",
        metavar="JSON",
        help="run vLLM's dynamic speculative decoding: its num_speculative_tokens_per_batch_size, "
        "e.g. '[[1,3,3],[4,15,2],[16,256,0]]' (the draft length by the batch at each step, at "
        "most --num-speculative-tokens)",
    )
    p.add_argument(
        "--engine",
        choices=KINDS,
        default=DEFAULT_KIND,
        help=f"whose wire shapes and metrics page to serve (default {DEFAULT_KIND}): SGLang's "
        "sglext details, llama.cpp's timings and llamacpp:* page, TensorRT-LLM's page at "
        "/prometheus/metrics (no per-request data)",
    )
    p.add_argument(
        "--step-shift",
        action="append",
        default=[],
        metavar="SIDE=FRACTION[@WHEN]",
        help="a GPU's behaviour from one start to the next: the plain (SIDE plain: prefill "
        "chunks, a schedule's k = 0 steps, every step of a server without speculation) or the "
        "verify steps (spec) take FRACTION more time, e.g. spec=+0.10 or plain=-0.05; WHEN: "
        "'restart' (default: from the first /admin/restart on) or a duration of wall-clock "
        "time after the simulator started (@90s); so measure and live traffic can run on "
        "either side of a shift (repeatable)",
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


def _profile_name(item: str, known: dict[str, Any]) -> str:
    """NAME of NAME=MEAN[:C]: one of the simulator's profiles."""
    name = item.partition("=")[0]
    if name not in known:
        raise ValueError(
            f"--profile {item!r}: wants NAME=MEAN[:C]; no profile {name!r}, the profiles are "
            f"{', '.join(sorted(known))}"
        )
    return name


def _profile(item: str, known: dict[str, Any]) -> Any:
    """NAME=MEAN[:C] -> the profile with that mean and concentration (C: the old one's)."""
    from exporter.sim.profiles import Profile

    name, _, value = item.partition("=")
    mean, _, concentration = value.partition(":")
    base = known[name]
    try:
        return Profile(name, float(mean), base.decay, float(concentration or base.concentration))
    except ValueError as exc:
        raise ValueError(
            f"--profile {item!r}: wants NAME=MEAN[:C], MEAN in [0, 1], C > 0 ({exc})"
        ) from None


def run(args: argparse.Namespace) -> int:
    from aiohttp import web

    from exporter.sim.decoder import SimEngine
    from exporter.sim.profiles import DEFAULT_PROFILES
    from exporter.sim.server import build_app
    from exporter.sim.steptime import StepShift

    logs.setup()
    profiles = dict(DEFAULT_PROFILES)
    try:
        host, port = from_flags([], args.listen, 1.0, None).listen
        for item in args.profile:
            name = _profile_name(item, profiles)
            profiles[name] = _profile(item, profiles)
        for flag, ok, want in (
            ("--data-parallel-size", args.data_parallel_size >= 1, ">= 1"),
            ("--num-speculative-tokens", args.num_speculative_tokens >= 0, ">= 0"),
            ("--speed", args.speed > 0, "> 0"),
        ):
            if not ok:
                raise ValueError(
                    f"{flag} must be {want}, got {getattr(args, flag[2:].replace('-', '_'))}"
                )
        shifts = tuple(StepShift.parse(item) for item in args.step_shift)
        schedule = None
        if args.schedule is not None:
            try:
                schedule = Schedule.parse(args.schedule)
            except BadSchedule as exc:
                raise ValueError(f"--schedule: {exc}") from None
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
        args.data_parallel_size,
        args.speed,
        args.seed,
        profiles,
        adaptive=args.adaptive_draft_length,
        schedule=schedule,
        shifts=shifts,
    )
    app = build_app(engine, args.per_request_spec_decode_metrics, kind=args.engine)

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
