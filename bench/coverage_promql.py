"""Coverage of the 95 % interval as the recording rules compute it, under promtool, with the
scrapes at three phases against the rule evaluations (0, 5 and 10 s after them).

Each route is one cell: requests with realistic spread (bench/_traffic.py) completing as a
Poisson process at n a minute, scraped every 15 s at its phase (the input series on a 5 s grid,
`_` where no scrape happened), for `--minutes`. promtool runs the shipped rules; it is asked,
over the whole run at one-minute steps (independent 1-minute windows), how many windows show an
interval (`...acceptance_ci_halfwidth:rate1m`), how many of those cover the route's truth (a
constant input series), and the mean squared SE against the mean squared error of the
estimate. Nothing here re-implements the rules.

    python bench/coverage_promql.py [--minutes 2000] [--json FILE] [--record] [--check]

Runtime: ~N minutes on 2 cores at the default (promtool evaluates every rule every 15 s).
"""

from __future__ import annotations

import argparse
import math
import re
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import yaml
from _run import add_outputs, guarded, keep
from _traffic import draw

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from harness.alert_traffic import ROUTE_COUNTERS, RULES, group_order, run_promtool  # noqa: E402

MEANS = (0.36, 0.71)
CONCENTRATIONS = (5.0, 15.0)
RATES = (5, 10, 30, 100)  # requests a minute: about what a 1m window holds
PHASES = (0, 5, 10)
GRID = 5
SCRAPE = 15
MODEL = "sim-27b"
JOB = 'job="specdec", instance="127.0.0.1:10419"'
P = "route_model_name:specdec_route_exact_acceptance:ratio_rate1m"
SE = "route_model_name:specdec_route_acceptance_stderr:rate1m"
HALF = "route_model_name:specdec_route_acceptance_ci_halfwidth:rate1m"
TRUTH = "coverage_truth"
COUNTERS = {k: v for k, v in ROUTE_COUNTERS.items() if k != "drafts"}  # the interval's


def route_series(
    route: str,
    mean: float,
    c: float,
    rate: float,
    phase: int,
    seconds: int,
    rng: np.random.Generator,
) -> list[dict[str, str]]:
    """The route's counters as a Prometheus scraping every 15 s at `phase` stores them."""
    n = rng.poisson(rate * seconds / 60)
    done = np.sort(rng.uniform(0, seconds, size=n))
    r = draw(rng, n, mean, c)
    a, t = r.accepted.astype(float), r.draft_tokens.astype(float)
    scrapes = np.arange(phase, seconds + 1, SCRAPE)
    seen = np.searchsorted(done, scrapes, side="right")  # requests done by each scrape
    per_request = {"draft_tokens": t, "accepted": a, "requests": np.ones(n), "tt": t * t,
                   "aa": a * a, "at": a * t, "ttt": t**3}  # fmt: skip
    labels = f'route="{route}", model_name="{MODEL}", {JOB}'
    out = []
    lead = f"_x{phase // GRID} " if phase else ""
    for key, (metric, extra) in COUNTERS.items():
        cumulative = np.concatenate([[0.0], np.cumsum(per_request[key])])[seen]
        values = " _x2 ".join(f"{v:.0f}" for v in cumulative)
        out.append({"series": f"{metric}{{{labels}{extra}}}", "values": lead + values})
    out.append({"series": f'{TRUTH}{{route="{route}", model_name="{MODEL}"}}',
                "values": f"{mean}x{seconds // GRID}"})  # fmt: skip
    return out


CHUNK = 240 * 60  # seconds of windows one query covers (promtool's sample limit)


def asked(seconds: int) -> dict[str, str]:
    """The four figures per chunk of the run, keyed "figure@end" (the chunk's end, seconds);
    each chunk's query text differs (`+ 0 * end`) so promtool's answers can be told apart."""
    on = "on (route, model_name)"
    shown = f"{HALF}"
    covered = f"abs({P} - {on} {TRUTH}) <= {on} {HALF}"
    error = f"({P} - {on} {TRUTH}) ^ 2 and {on} {HALF}"
    inner = {
        "shown": ("count_over_time", shown),
        "covered": ("count_over_time", covered),
        "se2": ("avg_over_time", f"{SE} ^ 2 and {on} {HALF}"),
        "err2": ("avg_over_time", error),
    }
    out = {}
    start = 120  # from the second minute on: the first window is young
    while start < seconds:
        end = min(start + CHUNK, seconds)
        span = f"[{end - start}s:60s]"
        for key, (fn, expr) in inner.items():
            out[f"{key}@{end}"] = f"{fn}(({expr}){span}) + 0 * {end}"
        start = end
    return out


def combine(got: dict[str, float]) -> dict[str, float]:
    """Chunks into the run's figures: counts add, means weigh by the windows shown."""
    ends = sorted({int(k.split("@")[1]) for k in got if "@" in k})
    total = {"shown": 0.0, "covered": 0.0, "se2": 0.0, "err2": 0.0}
    for end in ends:
        shown = got.get(f"shown@{end}", 0.0)
        total["shown"] += shown
        total["covered"] += got.get(f"covered@{end}", 0.0)
        total["se2"] += shown * got.get(f"se2@{end}", 0.0)
        total["err2"] += shown * got.get(f"err2@{end}", 0.0)
    if total["shown"]:
        total["se2"] /= total["shown"]
        total["err2"] /= total["shown"]
    return total


def run_cell(args: argparse.Namespace, mean: float, c: float, tmp: Path) -> dict[str, dict]:
    seconds = args.minutes * 60
    rng = np.random.default_rng(hash((mean, c, args.seed)) % 2**32)
    series, routes = [], {}
    for rate in RATES:
        for phase in PHASES:
            route = f"n{rate}_p{phase}"
            routes[route] = (rate, phase)
            series += route_series(route, mean, c, rate, phase, seconds, rng)
    questions = asked(seconds)
    doc = {
        "rule_files": [str(p) for p in RULES],
        "evaluation_interval": f"{SCRAPE}s",
        "group_eval_order": group_order(RULES),
        "tests": [{
            "name": f"coverage mean {mean} c {c}",
            "interval": f"{GRID}s",
            "input_series": series,
            "promql_expr_test": [  # expect nothing, so promtool prints what it got
                {"expr": q, "eval_time": f"{key.split('@')[1]}s", "exp_samples": []}
                for key, q in questions.items()
            ],
        }],
    }  # fmt: skip
    path = tmp / f"coverage-{mean}-{c}.yml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False, width=1 << 30))
    templates = {k: re.sub(r"\[\d+s:", "[{T}s:", q) for k, q in questions.items()}
    got = run_promtool(args.promtool, path, templates)
    return {
        route: combine({k: got.get(k, {}).get(route, 0.0) for k in questions})
        | {"rate": rate, "phase": phase}
        for route, (rate, phase) in routes.items()
    }


def run(args: argparse.Namespace) -> int:
    args.promtool = shutil.which("promtool")
    if args.promtool is None:
        raise RuntimeError("promtool not on PATH (Debian: apt-get install prometheus)")
    started = time.monotonic()
    cells = []
    with tempfile.TemporaryDirectory(prefix="specdec-coverage-") as tmp:
        jobs = [(m, c) for m in MEANS for c in CONCENTRATIONS]
        with ThreadPoolExecutor(max_workers=2) as pool:
            results = list(pool.map(lambda mc: run_cell(args, *mc, Path(tmp)), jobs))
    print("mean     c   n/min  phase  windows shown  covers  sqrt(mean SE^2 / mean err^2)")
    for (mean, c), found in zip(jobs, results, strict=True):
        for f in found.values():
            shown = f["shown"]
            cover = f["covered"] / shown if shown else math.nan
            ratio = math.sqrt(f["se2"] / f["err2"]) if f["err2"] else math.nan
            cells.append({"mean": mean, "c": c, **f, "coverage": cover, "se_ratio": ratio})
            print(f"{mean:4.2f} {c:5g} {f['rate']:7g} {f['phase']:6d} {shown:13.0f}"
                  f"  {cover:6.1%}  {ratio:6.2f}")  # fmt: skip
    print(f"{len(cells)} cells in {time.monotonic() - started:.0f} s")
    keep(args, "coverage_promql", {"cells": cells})
    missed = [g for g in cells if g["shown"] and not 0.93 <= g["coverage"] <= 0.97]
    for g in missed:
        print(f"outside 93-97 %: mean {g['mean']} c {g['c']:g} n {g['rate']} phase {g['phase']}:"
              f" {g['coverage']:.1%}", file=sys.stderr)  # fmt: skip
    return 1 if missed and args.check else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=int, default=2000, help="simulated minutes (2000)")
    parser.add_argument("--seed", type=int, default=1)
    add_outputs(parser)
    parser.add_argument("--check", action="store_true", help="exit 1 outside 93-97 %%")
    return guarded("coverage_promql", run, parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
