"""A GPU run read again with this checkout's payoff model (`python -m bench.gpu.rejudge OUT`; no
GPU): after a change to the model, what the sidecar would have said over the same windows,
against the same run's A/B truth and sweep. A recomputation on recorded windows, not a run.

Per mixed A/B round the table reads, the before and after sidecar pages (`OUT/pages/`, or
`OUT/pages.tgz` as `gpu_payoff.py`'s users bring it back) give each route's window: its exact
decode tokens, seconds and steps, its drafts, draft and accepted tokens, the acceptance
interval's relative half-width; and the engine's load over it, from every route: the batch
(`product.batch`), the draft tokens per decode step and, where the pages carry it, the
context. The run's `measure` curve (results.json) gives the steps. The speedups and the
options come from the sidecar's own functions (`core.payoff`).
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import sys
import tarfile
from pathlib import Path
from typing import Any

from bench.gpu import product, sweep
from bench.gpu.product import Samples
from exporter.core.counts import Counts
from exporter.core.payoff import Decode, Drift, Load, Speedups, StepCurve, StepPoint, curve_drift
from exporter.core.reading import RouteWindow, read_route
from exporter.core.stats import RequestMoments


def curve(data: dict[str, Any]) -> StepCurve:
    """The run's `measure` curve, as the sidecar's config loads it."""
    points = data["measure"]["curve"]
    return StepCurve(
        tuple(
            StepPoint(
                p["running"],
                p["plain_seconds"],
                p.get("verify_seconds"),
                tuple((int(j), s) for j, s in (p.get("draft_seconds") or {}).items()),
                p.get("verify_drafts"),
                p.get("context_tokens"),
                p.get("plain_seconds_per_context_token") or 0.0,
                p.get("verify_seconds_per_context_token") or 0.0,
            )
            for p in points
        ),
        int(data["args"]["k"]),
    )


def load(after: Samples, before: Samples) -> Load:
    """The engine's load between two pages, as every route's requests show it."""

    def d(name: str, **labels: str) -> float:
        return product.increase(after, before, f"specdec_route_{name}_total", **labels)

    steps = d("decode_steps", source="exact")
    drafted = (
        d("decode_draft_tokens", source="exact")
        if "specdec_route_decode_draft_tokens_total" in after
        else d("draft_tokens", source="exact")  # pages from before the counter: all exact
    )
    held, weight = d("decode_context_token_seconds"), d("decode_context_seconds")
    return Load(
        product.batch(after, before),
        held / weight if weight > 0 else None,
        drafted / steps if steps > 0 else None,
    )


def drift(after: Samples, before: Samples, steps: StepCurve) -> Drift | None:
    """The engine's drift from its curve between two pages, as the sidecar reads it over its
    window (`core.payoff.curve_drift`): every route's counted steps against the curve."""

    def d(name: str) -> float:
        return product.increase(after, before, f"specdec_route_{name}_total", source="exact")

    exact = Decode(d("decode_tokens"), d("decode_seconds"), d("decode_steps"))
    return curve_drift(steps, load(after, before), exact)


def route_window(after: Samples, before: Samples, route: str) -> RouteWindow:
    """A route's counts between two sidecar pages, as the sidecar's own window holds them."""

    def d(name: str, **labels: str) -> float:
        return product.increase(after, before, f"specdec_route_{name}_total", route=route, **labels)

    positions = sorted(
        {int(lb["position"]) for lb, _ in after.get(
            "specdec_route_accepted_tokens_per_position_total", []) if lb.get("route") == route}
    )  # fmt: skip
    counts = Counts(
        d("drafts"),
        d("draft_tokens"),
        d("accepted"),
        tuple(d("accepted_tokens_per_position", position=str(i)) for i in positions),
    )
    moments = RequestMoments(
        d("spec_requests"),
        d("accepted_tokens", source="exact"),
        d("draft_tokens", source="exact"),
        *(d(f"request_{name}") for name in MOMENT_COUNTERS),
    )
    return RouteWindow(
        counts,
        Decode(d("decode_tokens"), d("decode_seconds")),
        Decode(
            d("decode_tokens", source="exact"),
            d("decode_seconds", source="exact"),
            d("decode_steps", source="exact"),
        ),
        moments,
        load(after, before),
    )


# RequestMoments' second and third moments, as the sidecar names their counters
MOMENT_COUNTERS = (
    "accepted_tokens_squared",
    "draft_tokens_squared",
    "accepted_times_draft_tokens",
    "draft_tokens_cubed",
)


def reading(
    after: Samples, before: Samples, route: str, steps: StepCurve, own_positions: bool = False
) -> tuple[Speedups, dict[int, float], sweep.Said]:
    """The route's speedups, its options by draft length over the window between the two
    pages, and the best draft length it names (or its top two, where they are within its
    error): the sidecar's own reading (`core.reading.read_route`)."""
    mine = read_route(
        route_window(after, before, route), steps, own_positions, drift(after, before, steps)
    )
    by_length = {o.draft_length: o.speedup for o in mine.options}
    said = mine.best.draft_length if mine.best else sweep.top_two(by_length)
    return mine.payoff, by_length, said


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
    steps = curve(data)
    recorded = pages(out)
    lines: list[str] = [
        "Recomputed from the recorded pages with this checkout's model (not a new run)",
        "c    route         truth   as run            recomputed: estimated  measured",
    ]
    errors: list[float] = []
    readings: dict[tuple[int, str], list[tuple[dict[int, float], sweep.Said, str]]] = {}
    for level in data["levels"]:
        c = level["concurrency"]
        for route, f in level["routes"].items():
            used = f.get("pair") or range(len(f["rounds"]))
            est, meas = [], []
            for n in (i + 1 for i in used):
                before, after = (recorded[f"mixed-c{c}-r{n}-{x}.prom"] for x in ("before", "after"))
                page = product.parse(after)
                payoff, mine, named = reading(page, product.parse(before), route, steps)
                readings.setdefault((c, route), []).append((mine, named, acceptance(page, route)))
                est += [payoff.estimated] if payoff.estimated is not None else []
                meas += [payoff.measured] if payoff.measured is not None else []
            truth = f.get("truth")
            figures = [statistics.fmean(x) if x else None for x in (est, meas)]
            errors += [x / truth - 1 for x in figures if x is not None and truth]
            lines.append(
                f"{c:<4} {route:<13} {_x(truth)}  {_x(f.get('estimated'))} "
                f"({_err(f.get('estimated'), truth)})  "
                + "  ".join(f"{_x(x)} ({_err(x, truth)})" for x in figures)
            )
    if errors:
        worst = max(errors, key=abs)
        lines.append(
            f"Speedups recomputed: {sum(abs(e) <= 0.10 for e in errors)} of {len(errors)} within "
            f"10 %, {sum(abs(e) <= 0.05 for e in errors)} within 5 %; worst {worst:+.1%}"
        )
    verdicts, regrets = [], []
    for entry in data["sweep"]:
        if entry["mix"] != "mixed":
            continue
        c, route = entry["concurrency"], entry["route"]
        truth = {int(j): v for j, v in entry["speedup"].items()}
        lines.append(f"c={c} {route} truth " + " ".join(f"{truth[j]:.3f}" for j in sorted(truth)))
        said = []
        for n, (mine, named, accepted) in enumerate(readings.get((c, route), []), 1):
            said.append(named)
            row = " ".join(f"{mine[j]:.3f}" for j in sorted(mine))
            charged = sweep.regret(truth, named)
            regret = "-" if charged is None else f"{charged:.1%}"
            lines.append(f"  round {n}: {row}  said {named} regret {regret}" + accepted)
        verdicts.append(sweep.judged(truth, said))
        if (worst_regret := sweep.worst_regret(truth, said)) is not None:
            regrets.append(worst_regret)
        lines.append(f"  {verdicts[-1]}")
    if verdicts:
        lines.append(sweep.tally(verdicts))
    if regrets:
        lines.append(f"Best draft length, worst regret: {max(regrets):.1%}")
    return lines


def _x(value: float | None) -> str:
    return "-     " if value is None else f"x{value:.3f}"


def _err(value: float | None, truth: float | None) -> str:
    return "-" if value is None or not truth else f"{value / truth - 1:+.1%}"


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
