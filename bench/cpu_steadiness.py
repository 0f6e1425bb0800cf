#!/usr/bin/env python3
"""How steady this machine's CPU is: a fixed pure-Python loop timed in slices. Any A/B of
decode rates here (speculation on against off) is only as repeatable as the CPU speed between
its phases; a load-aware speedup calibrated minutes earlier, only as right as the speed then
and now. Printed: loop rounds per slice (min, median, max), and for consecutive phases of
`--phase` seconds the ratio of their mean speeds (what an alternated A/B's rounds inherit).

    python bench/cpu_steadiness.py [--seconds 120] [--phase 30] [--slice 0.5] [--record]
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time

from _run import add_outputs, keep


def rounds_in(seconds: float) -> int:
    """Rounds of a fixed loop body in `seconds` of wall time."""
    end = time.perf_counter() + seconds
    n = 0
    while time.perf_counter() < end:
        sum(range(200))
        n += 1
    return n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=120.0)
    ap.add_argument("--phase", type=float, default=30.0)
    ap.add_argument("--slice", type=float, default=0.5)
    add_outputs(ap)
    args = ap.parse_args()
    slices = [rounds_in(args.slice) for _ in range(int(args.seconds / args.slice))]
    lo, mid, hi = min(slices), statistics.median(slices), max(slices)
    print(
        f"rounds per {args.slice} s: min {lo}, median {mid:.0f}, max {hi} (max / min {hi / lo:.2f})"
    )
    per = int(args.phase / args.slice)
    phases = [statistics.mean(slices[i : i + per]) for i in range(0, len(slices) - per + 1, per)]
    steps = [b / a for a, b in itertools.pairwise(phases)]
    if steps:
        print(
            f"{args.phase:.0f} s phases: speed of each against the one before "
            + " ".join(f"{s:.3f}" for s in steps)
            + f" (largest change {max(abs(s - 1) for s in steps):.1%})"
        )
    keep(args, "cpu_steadiness", {
        "slice_s": args.slice,
        "rounds_per_slice": {"min": lo, "median": mid, "max": hi},
        "slice_max_over_min": round(hi / lo, 3),
        "phase_s": args.phase,
        "phase_over_previous": [round(s, 4) for s in steps],
        "largest_phase_change": round(max((abs(s - 1) for s in steps), default=0.0), 4),
    })  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
