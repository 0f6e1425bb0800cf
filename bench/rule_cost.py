"""What the shipped rules cost Prometheus to evaluate, against a reference revision's rules.

promtool evaluates every rule file under deploy/prometheus/rules at each 15 s step of the
alert-quality step scenario (harness/alert_traffic.py: nine routes, 2 h 20 min, the
per-request moment counters a sidecar exports) for this checkout's rules and for those of
--reference (a git revision), alternately, --repeats times each. Printed: each side's median
seconds and the ratio. The CPU a rules change adds to every Prometheus that loads them, and to
CI's promtool tests (test_alert_quality replays a whole day).

    python3 bench/rule_cost.py [--reference REV] [--repeats 3] [--record]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from _run import add_outputs, guarded, keep  # noqa: E402

from harness.alert_traffic import (  # noqa: E402
    RULES,
    RouteTraffic,
    Scenario,
    promtool_file,
    queries,
    step,
)
from harness.helpers import need_tool  # noqa: E402

WARM = 2 * 3600
NOW = "route_model_name:specdec_route_exact_acceptance:ratio_rate1m"


def scenario() -> Scenario:
    routes = [
        RouteTraffic(f"r{rate:g}_s{seed}".replace(".", "_"), rate, step(WARM + 37 * seed))
        for rate in (24.0, 6.0, 1.5)
        for seed in (1, 2, 3)
    ]
    return Scenario("step", WARM + 20 * 60, routes)


def reference_rules(rev: str, into: Path) -> list[Path]:
    paths = []
    for path in RULES:
        rel = path.relative_to(REPO).as_posix()
        shown = subprocess.run(
            ["git", "show", f"{rev}:{rel}"], cwd=REPO, capture_output=True, text=True
        )
        if shown.returncode != 0:
            raise RuntimeError(f"--reference {rev}: no {rel} there ({shown.stderr.strip()})")
        (into / path.name).write_text(shown.stdout, encoding="utf-8")
        paths.append(into / path.name)
    return paths


def timed(promtool: str, test: Path) -> float:
    start = time.monotonic()
    done = subprocess.run([promtool, "test", "rules", str(test)], capture_output=True, text=True)
    if "SUCCESS" not in done.stdout + done.stderr and "FAILED" not in done.stdout + done.stderr:
        raise RuntimeError(f"promtool failed on {test}: {(done.stdout + done.stderr)[-500:]}")
    return time.monotonic() - start


def run(args: argparse.Namespace) -> int:
    promtool = need_tool("promtool")
    with tempfile.TemporaryDirectory(prefix="rule-cost-") as tmp:
        root = Path(tmp)
        (root / "ref").mkdir()
        sides = {"here": RULES, args.reference: reference_rules(args.reference, root / "ref")}
        tests = {}
        asked = queries("SpecDecodeAcceptanceDrop", NOW)
        for i, (name, rules) in enumerate(sides.items()):
            tests[name] = root / f"test{i}.yml"
            tests[name].write_text(promtool_file(scenario(), 1, asked, rules), encoding="utf-8")
        seconds: dict[str, list[float]] = {name: [] for name in sides}
        for _ in range(args.repeats):  # alternate, so a slow spell of the machine hits both
            for name, test in tests.items():
                seconds[name].append(timed(promtool, test))
    here, ref = (statistics.median(seconds[n]) for n in sides)
    print(f"promtool over {scenario().seconds / 3600:.1f} h of 9 routes, median of {args.repeats}")
    for name in sides:
        print(f"  {name:<12} {statistics.median(seconds[name]):6.1f} s  {seconds[name]}")
    print(f"  here / {args.reference}: x{here / ref:.2f}")
    keep(
        args,
        "rule_cost",
        {"reference": args.reference, "seconds": seconds, "ratio": round(here / ref, 3)},
    )
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reference", default="HEAD", help="git revision to compare with")
    parser.add_argument("--repeats", type=int, default=3)
    add_outputs(parser)
    return guarded("rule_cost", run, parser.parse_args())


if __name__ == "__main__":
    sys.exit(main())
