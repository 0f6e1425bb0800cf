"""Coverage of the 95 % interval as the sidecar shows it: the gauge and the demo's line.

Through the real code path: `Accounting.record` for each request (an exact per-request
object), `Accounting.tick` on a fake clock, the `RequestCollector`'s families
(`specdec_route_exact_acceptance_ratio` +- `specdec_route_acceptance_ci_halfwidth`, window 1m)
and the demo's `route_line` (the "xx.x% +-y.y" a user reads). Each window holds n requests of
one route with realistic spread (bench/_traffic.py: per-request Beta(mean c, (1 - mean) c),
heavy-tailed lengths, the simulator's chain). The truth is the route's draft-token-weighted
acceptance (the Beta's mean: lengths do not depend on acceptance).

Cells: mean 0.36 and 0.71, c 2, 5, 15, 50, n 3, 5, 10, 30, 100, 300, `--windows` each (2,000):
the share of windows that show an interval, and how often it covers the truth (goal 93-97 %
wherever one is shown), for the gauge and the line; mean(SE) / sd(estimate) too.

    python bench/coverage.py [--windows 2000] [--json FILE] [--record] [--check]
"""

from __future__ import annotations

import argparse
import math
import re
import sys
import time

import numpy as np
from _run import add_outputs, guarded, keep
from _traffic import draw

from exporter.accounting.ledger import Accounting, RequestOutcome
from exporter.core.counts import Counts
from exporter.core.windows import Window
from exporter.demo import route_line
from exporter.export.request_collector import RequestCollector

MEANS = (0.36, 0.71)
CONCENTRATIONS = (2.0, 5.0, 15.0, 50.0)
SIZES = (3, 5, 10, 30, 100, 300)
WINDOW = Window("1m", 60.0)
LINE = re.compile(r"acceptance\s+(?P<p>[\d.]+)% ±\s*(?P<h>[\d.]+)")


def one_window(requests_: tuple[np.ndarray, ...]) -> tuple[dict[str, float], str]:
    """The gauges and the demo line of a route whose minute held these requests."""
    accepted, tokens, steps = requests_
    acc = Accounting(("r",), (WINDOW,), {})
    clock = [0.0]
    acc.tick(0.0)
    for a, t, s in zip(accepted.tolist(), tokens.tolist(), steps.tolist(), strict=True):
        exact = Counts(float(s), float(t), float(a))
        acc.record(RequestOutcome("r", "m", "200", int(s + a), exact=exact))
    clock[0] = 60.0
    acc.tick(60.0)
    found: dict[str, float] = {}
    for family in RequestCollector(acc, lambda: clock[0]).collect():
        for sample in family.samples:
            if sample.labels.get("window") == "1m":
                found[sample.name] = sample.value
    # the line reads the snapshot a scrape formats, partial as the demo reads it, no batch
    return found, route_line(acc.read(60.0, lambda _: {}, partial=True).windows[0], "r", None)


def cell(rng: np.random.Generator, mean: float, c: float, n: int, windows: int) -> dict[str, float]:
    shown = covered = line_shown = line_covered = 0
    estimates: list[float] = []
    stderrs: list[float] = []
    for _ in range(windows):
        r = draw(rng, n, mean, c)
        gauges, line = one_window((r.accepted, r.draft_tokens, r.steps))
        p = gauges["specdec_route_exact_acceptance_ratio"]
        estimates.append(p)
        if "specdec_route_acceptance_ci_halfwidth" in gauges:
            shown += 1
            covered += abs(p - mean) <= gauges["specdec_route_acceptance_ci_halfwidth"]
            stderrs.append(gauges["specdec_route_acceptance_stderr"])
        if match := LINE.search(line):
            line_shown += 1
            line_covered += abs(float(match["p"]) / 100 - mean) <= float(match["h"]) / 100
    sd = float(np.std(estimates, ddof=1))
    return {
        "mean": mean,
        "c": c,
        "n": n,
        "windows": windows,
        "shown": shown / windows,
        "coverage": covered / shown if shown else math.nan,
        "line_shown": line_shown / windows,
        "line_coverage": line_covered / line_shown if line_shown else math.nan,
        "se_over_sd": float(np.mean(stderrs)) / sd if stderrs and sd else math.nan,
    }


def run(args: argparse.Namespace) -> int:
    rng = np.random.default_rng(args.seed)
    started = time.monotonic()
    cells = []
    print("mean     c     n   shown  covers  line shown  line covers  mean(SE)/sd")
    for mean in MEANS:
        for c in CONCENTRATIONS:
            for n in SIZES:
                got = cell(rng, mean, c, n, args.windows)
                cells.append(got)
                print(
                    f"{mean:4.2f} {c:5g} {n:5d}  {got['shown']:6.1%}  {got['coverage']:6.1%}"
                    f"  {got['line_shown']:10.1%}  {got['line_coverage']:11.1%}"
                    f"  {got['se_over_sd']:11.2f}",
                    flush=True,
                )
    print(f"{len(cells)} cells x {args.windows} windows in {time.monotonic() - started:.0f} s")
    keep(args, "coverage", {"cells": cells})
    missed = [
        f"mean {g['mean']} c {g['c']:g} n {g['n']}: {g[key]:.1%}"
        for g in cells
        for key, share in (("coverage", "shown"), ("line_coverage", "line_shown"))
        if g[share] > 0 and not 0.93 <= g[key] <= 0.97
    ]
    for what in missed:
        print(f"outside 93-97 %: {what}", file=sys.stderr)
    return 1 if missed and args.check else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--windows", type=int, default=2000, help="windows per cell (2000)")
    parser.add_argument("--seed", type=int, default=1)
    add_outputs(parser)
    parser.add_argument("--check", action="store_true", help="exit 1 outside 93-97 %%")
    return guarded("coverage", run, parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
