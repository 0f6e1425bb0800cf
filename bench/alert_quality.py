"""Detection quality of SpecDecodeAcceptanceDrop under the rules as shipped, on traffic with
realistic per-request spread, measured by promtool.

The traffic and the promtool runner are harness/alert_traffic.py's (the same ones
tests/integration/test_alert_quality.py holds to the goals in CI): per-route Poisson requests,
each drawing its own acceptance from Beta(mean c, (1 - mean) c) (or, on a route mixing kinds of
prompts, from its kind's), its steps drawn with the simulator's chain, scraped every 15 s.
Nothing here re-implements the alert: promtool evaluates the shipped rules and is asked how many
evaluations fired and when the first did.

Goals, exit 1 if one is missed:
  (a) a step 0.71 -> 0.36 (c = 15) fires within 60 s at 24 requests a minute, 3 min at 6 and
      15 min at 1.5 (3 seeds each; promtool's ideal alignment);
  (b) 24 h steady at 0.71 (c = 15) at 24, 6, 1.5 and 0.5 requests a minute: zero firings.
For information: (a) as a live server's worst case sees it (a scrape 15 s late, the alert group
reading the recording rules one evaluation old); (c) the same day at c = 5 (a wider spread);
(d) a day of a route mixing two kinds of prompts (0.45 and 0.85); (e) that route's mix shifting
at half-time from 30/70 to 70/30 (0.73 -> 0.57, a real 22 % change); (f) quiet routes (1.5 and
0.5 a minute) falling to 0.10: how fast, if at all.

    python bench/alert_quality.py [--hours 24] [--keep DIR] [--rules DIR] [--record]

Runtime ~3 minutes on 2 cores (promtool evaluates the rules the alert reads 5,760 times per 24 h
run).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from _run import add_outputs, keep  # noqa: E402

from harness.alert_traffic import (  # noqa: E402
    RULES,
    RouteTraffic,
    Scenario,
    promtool_file,
    pruned_rules,
    queries,
    run_promtool,
    step,
)

ALERT = "SpecDecodeAcceptanceDrop"
NOW = "route_model_name:specdec_route_exact_acceptance:ratio_rate1m"
GOALS = {24.0: 60.0, 6.0: 180.0, 1.5: 900.0}  # requests a minute -> seconds to firing
RATES = (24.0, 6.0, 1.5, 0.5)
WARM = 2 * 3600
QUIET_WARM = 4 * 3600  # 120 requests at 0.5 a minute: the day holds min_baseline_requests (100)
SEEDS = (1, 2, 3)
MIX = ((0.45, 0.3), (0.85, 0.7))  # (kind's mean, share): mean 0.73


def name(rate: float) -> str:
    return f"{rate:g}".replace(".", "_")


def scenarios(day: int) -> tuple[list[Scenario], dict[str, float]]:
    """Every run, and when each stepped route's step happened."""
    step_at: dict[str, float] = {}
    stepped, live = [], []
    for rate in GOALS:
        for seed in SEEDS:
            t0 = WARM + 37 * seed
            for suffix, into in (("", stepped), ("_live", live)):
                route = f"step_{name(rate)}_s{seed}{suffix}"
                step_at[route] = t0
                into.append(RouteTraffic(route, rate, step(t0)))
    quiet = []
    for rate in (1.5, 0.5):
        route = f"fall_{name(rate)}"
        step_at[route] = QUIET_WARM
        quiet.append(RouteTraffic(route, rate, step(QUIET_WARM, 0.71, 0.10)))
    mixed = [RouteTraffic(f"mixed_{name(r)}", r, kinds=MIX) for r in (24.0, 6.0)]
    half = day / 2  # the mix turns from 30 % / 70 % to 70 % / 30 %: 0.73 -> 0.57
    mix_shift = [
        RouteTraffic(
            f"shift_{name(r)}",
            r,
            kinds=(
                (0.45, lambda t: 0.3 if t < half else 0.7),
                (0.85, lambda t: 0.7 if t < half else 0.3),
            ),
        )
        for r in (24.0, 6.0)
    ]
    runs = [
        Scenario("steady_c15", day, [RouteTraffic(f"c15_{name(r)}", r) for r in RATES]),
        Scenario(
            "steady_c5", day, [RouteTraffic(f"c5_{name(r)}", r, concentration=5.0) for r in RATES]
        ),
        Scenario("mixed", day, mixed + mix_shift),
        Scenario("step", WARM + 20 * 60, stepped),
        Scenario("fall", QUIET_WARM + 20 * 60, quiet),
        Scenario("step_live_worst", WARM + 20 * 60, live, lag=14.9),
    ]
    return runs, step_at


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--hours", type=float, default=24.0, help="length of the steady runs")
    parser.add_argument("--keep", type=Path, help="also write the promtool test files here")
    parser.add_argument("--rules", type=Path, help="rule files to measure instead of the shipped")
    add_outputs(parser)
    args = parser.parse_args()
    rules = sorted(args.rules.resolve().glob("*.yml")) if args.rules else RULES
    promtool = shutil.which("promtool")
    if promtool is None:
        print("promtool not found: apt-get install prometheus", file=sys.stderr)
        return 2
    day = int(args.hours * 3600) // 15 * 15
    runs, step_at = scenarios(day)
    asked = queries(ALERT, NOW)
    got: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="specdec-alert-quality-") as tmp:
        # the shipped rules the alert reads (beside the test files, which name them)
        rules = pruned_rules((ALERT, NOW), (args.keep or Path(tmp)) / "rules", rules)
        paths = []
        for seed, scenario in enumerate(runs):
            path = Path(tmp) / f"alert_quality_{scenario.name}.yml"
            path.write_text(promtool_file(scenario, seed, asked, rules), encoding="utf-8")
            paths.append(path)
            if args.keep:
                args.keep.mkdir(parents=True, exist_ok=True)
                shutil.copy(path, args.keep / path.name)
        with ThreadPoolExecutor(max_workers=2) as pool:
            for result in pool.map(lambda p: run_promtool(promtool, p, asked), paths):
                for key, routes in result.items():
                    got.setdefault(key, {}).update(routes)

    def firings(route: str) -> float:
        return got.get("firing", {}).get(route, 0.0)

    def delay(route: str) -> float | None:
        first = got.get("first", {}).get(route)
        return None if first is None else first - step_at[route]

    ok = True
    figures: dict[str, Any] = {"rules": str(args.rules) if args.rules else "as shipped"}
    for scenario in runs:  # not vacuous: every route's data went through the rules
        for route in scenario.routes:
            if route.name not in got.get("min_now", {}) and route.per_minute >= 1:
                print(f"FAIL: no 1m acceptance recorded for {route.name}: promtool saw no data")
                ok = False
    print(f"rules{'' if args.rules else ' as shipped'}, promtool test rules, 15 s scrapes\n")
    print("(a) acceptance 0.71 -> 0.36, per-request spread c = 15, 3 seeds per rate")
    for suffix, label in (("", "promtool's ideal alignment"), ("_live", "live worst case")):
        print(f"    {label}:")
        for rate, goal in GOALS.items():
            delays = [delay(f"step_{name(rate)}_s{s}{suffix}") for s in SEEDS]
            fired = [d for d in delays if d is not None]
            shown = ", ".join("never" if d is None else f"{d:.0f}" for d in delays)
            kind = "step_fired_after_s" + ("_live_worst" if suffix else "")
            figures.setdefault(kind, {})[f"{rate:g}/min"] = shown
            verdict = (
                "" if suffix else ("  ok" if len(fired) == 3 and max(fired) <= goal else "  MISSED")
            )
            print(
                f"      {rate:>4g} requests/min: fired after {shown} s (goal {goal:.0f} s){verdict}"
            )
            if not suffix and verdict.strip() != "ok":
                ok = False
    print(f"\n(b) {args.hours:g} h steady at 0.71, c = 15: firing evaluations per route")
    for rate in RATES:
        n = firings(f"c15_{name(rate)}")
        figures.setdefault("steady_c15_firings", {})[f"{rate:g}/min"] = n
        print(f"      {rate:>4g} requests/min: {n:.0f}" + ("" if n == 0 else "  FALSE FIRINGS"))
        ok = ok and n == 0
    for title, prefix, rates in (
        (f"(c) for information: {args.hours:g} h steady at 0.71, c = 5 (sd ~0.19)", "c5", RATES),
        (
            f"(d) for information: {args.hours:g} h mixing 0.45 (30 %) and 0.85 (70 %)",
            "mixed",
            (24, 6),
        ),
        (
            "(e) for information: that mix turning 30/70 -> 70/30 at half-time (0.73 -> 0.57)",
            "shift",
            (24, 6),
        ),
    ):
        print(f"\n{title}")
        for rate in rates:
            n = firings(f"{prefix}_{name(rate)}")
            figures.setdefault(f"{prefix}_firings", {})[f"{rate:g}/min"] = n
            print(f"      {rate:>4g} requests/min: {n:.0f} firing evaluations")
    print("\n(f) for information: quiet routes falling 0.71 -> 0.10")
    for rate in (1.5, 0.5):
        d = delay(f"fall_{name(rate)}")
        figures.setdefault("quiet_fall_fired_after_s", {})[f"{rate:g}/min"] = d
        print(
            f"      {rate:>4g} requests/min: "
            + ("never fired" if d is None else f"fired after {d:.0f} s")
        )
    all_steps = [
        d for r in GOALS for s in SEEDS if (d := delay(f"step_{name(r)}_s{s}")) is not None
    ]
    if all_steps:
        print(f"\nall ideal-alignment steps: median {statistics.median(all_steps):.0f} s")
    print("\nall goals met" if ok else "\nGOAL MISSED")
    keep(args, "alert_quality", {**figures, "goals_met": ok})
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
