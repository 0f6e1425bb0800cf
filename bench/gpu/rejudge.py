"""A GPU run's best-k readings recomputed from its recorded sidecar pages with this checkout's
options model (`python -m bench.gpu.rejudge OUT`; no GPU): after a change to the model, what
the sidecar would have said over the same windows, judged against the same run's sweep.

Per mixed A/B round at a swept level, the before and after pages (`OUT/pages/`, or
`OUT/pages.tgz` as `gpu_payoff.py`'s users bring it back) give each route's window: its exact
decode tokens, seconds and steps, its drafts, draft and accepted tokens, the acceptance
interval's relative half-width, and the engine's batch (`product.batch`). The run's
`measure` curve (results.json) gives the steps. The options then come from the sidecar's own
function (`route_collector.options_by_draft_length`) at the run's deployed k.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import tarfile
from pathlib import Path
from typing import Any

from bench.gpu import product, sweep
from bench.gpu.product import Samples
from exporter.core.counts import Counts, ratios
from exporter.core.payoff import Decode, Speedups, StepCurve, StepPoint, best_draft_length
from exporter.core.stats import Interval
from exporter.export.route_collector import options_by_draft_length


def curve(data: dict[str, Any]) -> StepCurve:
    """The run's `measure` curve, as the sidecar's config loads it."""
    points = data["measure"]["curve"]
    return StepCurve(
        tuple(
            StepPoint(
                p["running"],
                p["plain_seconds"],
                p["verify_seconds"],
                tuple((int(j), s) for j, s in p["draft_seconds"].items()),
            )
            for p in points
        )
    )


def reading(
    after: Samples, before: Samples, route: str, steps: StepCurve, k: int
) -> tuple[dict[int, float], sweep.Said]:
    """The route's speedup by draft length over the window between the two pages, and the
    best draft length it names (or its top two, where they are within its error)."""

    def d(name: str, **labels: str) -> float:
        return product.increase(after, before, f"specdec_route_{name}_total", route=route, **labels)

    counts = Counts(d("drafts"), d("draft_tokens"), d("accepted"))
    every = Decode(d("decode_tokens"), d("decode_seconds"))
    exact = Decode(d("decode_tokens", source="exact"), d("decode_seconds", source="exact"),
                   d("decode_steps", source="exact"))  # fmt: skip
    batch = product.batch(after, before)
    payoff = Speedups.at_load(steps, batch, ratios(counts).mean_acceptance_length, every, exact)
    estimate = product.one(after, "specdec_route_exact_acceptance_ratio", route=route)
    half = product.one(after, "specdec_route_acceptance_ci_halfwidth", route=route)
    interval = Interval(estimate, 0.0, half, 0.0) if estimate and half is not None else None
    found = options_by_draft_length(counts, payoff, interval, False, k)
    by_length = {o.draft_length: o.speedup for o in found}
    chosen = best_draft_length(found)
    return by_length, chosen.draft_length if chosen else sweep.top_two(by_length)


def acceptance(page: Samples, route: str) -> str:
    """The route's headline acceptance beside its exact requests' own, as the page says them
    (the headline takes in the requests cut short, apportioned: docs/metrics.md)."""
    headline = product.one(page, "specdec_route_acceptance_ratio", route=route)
    exact = product.one(page, "specdec_route_exact_acceptance_ratio", route=route)
    if headline is None or exact is None:
        return ""
    return f"  acceptance {headline:.3f} (exact {exact:.3f})"


def pages(out: Path) -> dict[str, str]:
    """The run's pages by file name, from OUT/pages/ or OUT/pages.tgz."""
    folder = out / "pages"
    if folder.is_dir():
        return {p.name: p.read_text(encoding="utf-8") for p in folder.glob("*.prom")}
    found = {}
    with tarfile.open(out / "pages.tgz") as tar:
        for member in tar.getmembers():
            if member.name.startswith("pages/") and member.name.endswith(".prom"):
                raw = tar.extractfile(member)
                if raw is not None:
                    found[Path(member.name).name] = io.TextIOWrapper(raw, "utf-8").read()
    return found


def rejudge(out: Path) -> list[str]:
    data = json.loads((out / "results.json").read_text(encoding="utf-8"))
    steps, k = curve(data), int(data["args"]["k"])
    recorded = pages(out)
    lines, verdicts = [], []
    pairs = {
        (level["concurrency"], name): route.get("pair") or range(len(route["rounds"]))
        for level in data["levels"]
        for name, route in level["routes"].items()
    }
    for entry in data["sweep"]:
        if entry["mix"] != "mixed":
            continue
        c, route = entry["concurrency"], entry["route"]
        truth = {int(j): v for j, v in entry["speedup"].items()}
        lines.append(f"c={c} {route} truth " + " ".join(f"{truth[j]:.3f}" for j in sorted(truth)))
        said = []
        for n in (i + 1 for i in pairs.get((c, route), ())):  # the rounds the table reads
            before, after = (recorded[f"mixed-c{c}-r{n}-{x}.prom"] for x in ("before", "after"))
            page = product.parse(after)
            mine, named = reading(page, product.parse(before), route, steps, k)
            said.append(named)
            row = " ".join(f"{mine[j]:.3f}" for j in sorted(mine))
            lines.append(f"  round {n}: {row}  said {named}" + acceptance(page, route))
        verdicts.append(sweep.judged(truth, said))
        lines.append(f"  {verdicts[-1]}")
    lines.append(sweep.tally(verdicts))
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path, help="a gpu_payoff.py --out folder")
    args = ap.parse_args(argv)
    if not (args.out / "results.json").is_file():
        print(f"rejudge: no results.json in {args.out}", file=sys.stderr)
        return 2
    print("\n".join(rejudge(args.out)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
