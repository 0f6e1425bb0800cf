"""The bench's one table, from its results document (bench/gpu_payoff.py's results.json)."""

from __future__ import annotations

from typing import Any

from bench.gpu.sweep import Said, judged, tally, top_two, worst_regret
from exporter.core.table import aligned


def _x(value: float | None) -> str:
    return "-" if value is None else f"x{value:.3f}"


def _f(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _err(value: float | None, truth: float | None) -> str:
    if value is None or truth is None:
        return "-"
    return f"{value / truth - 1:+.1%}"


def _rounds(figures: list[float | None], pair: list[int] | None) -> str:
    marks = []
    for i, f in enumerate(figures):
        text = "-" if f is None else f"{f:.3f}"
        marks.append(f"[{text}]" if pair is not None and i in pair else text)
    return " ".join(marks)


def _ab_rows(levels: list[dict[str, Any]]) -> list[list[str]]:
    rows = [["level", "route", "batch", "tok/step", "A/B truth", "rounds ([agreeing])",
             "estimated", "err", "measured", "err", "best k"]]  # fmt: skip
    for level in levels:
        for route, f in level["routes"].items():
            best = sorted({b for b in f["best_draft_length"] if b is not None})
            rows.append([
                str(level["concurrency"]),
                route,
                "-" if f["batch"] is None else f"{f['batch']:.1f}",
                "-" if f["tokens_per_step"] is None else f"{f['tokens_per_step']:.2f}",
                _x(f["truth"]),
                _rounds(f["rounds"], f["pair"]),
                _x(f["estimated"]),
                _err(f["estimated"], f["truth"]),
                _x(f["measured"]),
                _err(f["measured"], f["truth"]),
                ",".join(map(str, best)) or "tie",
            ])  # fmt: skip
    return rows


def report(data: dict[str, Any]) -> str:
    """The A/B truth per route and level beside the sidecar's figures, each route alone, the
    draft-length sweep beside the sidecar's and advise's best k, and what missed."""
    lines: list[str] = []
    if data.get("levels"):
        lines.append(
            "Two routes sharing one speculative engine: the A/B truth (two rounds within 5 %, "
            "pooled) and the sidecar's figures over the same phases"
        )
        lines += aligned(_ab_rows(data["levels"]))
    if data.get("alone"):
        lines.append("\nEach route alone on the engine")
        lines += aligned(_ab_rows(data["alone"]))
    for group in ("levels", "alone"):
        for level in data.get(group, []):
            for route, f in level["routes"].items():
                for name in f["outliers"]:
                    lines.append(f"  c={level['concurrency']} {route}: {name}")
                if f["pair"] is None:
                    lines.append(f"  c={level['concurrency']} {route}: no two rounds agreed")
    lines += _plain_lines(data)
    if data.get("sweep"):
        lines += _sweep_lines(data)
    lines += _verdict_lines(data)
    return "\n".join(lines)


def _verdict_lines(data: dict[str, Any]) -> list[str]:
    """The run against the issue's bounds in one place: the sidecar's speedups within 10 %
    (and the 5 % goal) of the A/B truth, routes sharing the engine; its best-k readings met."""
    errors = [
        abs(f[key] / f["truth"] - 1)
        for level in data.get("levels", [])
        for f in level["routes"].values()
        for key in ("estimated", "measured")
        if f["truth"] and f[key] is not None
    ]
    lines = []
    if errors:
        lines.append(
            f"\nSpeedups: {sum(e <= 0.10 for e in errors)} of {len(errors)} within 10 % of the"
            f" truth, {sum(e <= 0.05 for e in errors)} within 5 %; worst {max(errors):.1%}"
        )
    elif data.get("levels"):
        lines.append("\nSpeedups: none judged (no level has a truth: no two rounds agreed)")
    seen = _sidecar(data)
    verdicts = [
        judged({int(k): v for k, v in s["speedup"].items()}, seen[key]["said"])
        for s in data.get("sweep", [])
        if s.get("mix") == "mixed" and (key := (s["concurrency"], s["route"])) in seen
    ]
    if verdicts:
        lines.append(tally(verdicts))
    lines += _regret_lines(data, seen)
    return lines


def _regret_lines(data: dict[str, Any], seen: dict[tuple[int, str], dict[str, Any]]) -> list[str]:
    """The worst regret over every swept level and route: the sidecar's readings', advise's."""
    worst: dict[str, list[float]] = {"sidecar": [], "advise": []}
    for s in data.get("sweep", []):
        mine = seen.get((s["concurrency"], s["route"]))
        if s.get("mix") != "mixed" or mine is None:
            continue
        speedup = {int(k): v for k, v in s["speedup"].items()}
        told = [] if mine["advised"] is None else [mine["advised"]]
        for name, said in (("sidecar", mine["readings"]), ("advise", told)):
            if (r := worst_regret(speedup, said)) is not None:
                worst[name].append(r)
    if not worst["sidecar"] and not worst["advise"]:
        return []
    parts = [f"{name} {max(v):.1%}" for name, v in worst.items() if v]
    return [
        "Best draft length, worst regret (1 - true at the k named / true best): " + ", ".join(parts)
    ]


def _plain_lines(data: dict[str, Any]) -> list[str]:
    """Per level, each route's decode per request on the plain server (its agreeing rounds')
    beside measure's plain step as a rate: the sidecar takes one plain step per batch for
    every route, so a split between the routes, or measure's level against the A/B's, is
    error it cannot see (docs/BENCHMARKS.md §11, runs 19-21). Under it, the split the other
    clients' gaps predict (`bench/gpu/split.py`)."""
    lines = []
    for level in data.get("levels", []):
        plain = {route: f["plain"] for route, f in level["routes"].items() if "plain" in f}
        rates = {route: p["rate"] for route, p in plain.items() if p["rate"] is not None}
        if not rates:
            continue
        c = level["concurrency"]
        text = ", ".join(f"{route} {x:.1f}" for route, x in rates.items())
        pair = None
        if len(rates) > 1:
            pair = max(rates, key=rates.__getitem__), min(rates, key=rates.__getitem__)
            text += f" ({pair[0]} {rates[pair[0]] / rates[pair[1]] - 1:+.1%} over {pair[1]})"
        point = _measure_point(data, c)
        if point is not None:
            text += f"; measure's plain step {1 / point['plain_seconds']:.1f}"
        lines.append(f"  c={c} plain decode per request, tok/s: {text}")
        fast, slow = (None, None) if pair is None else (plain[pair[0]], plain[pair[1]])
        if fast and slow and fast["line"] and slow["line"] and fast["gaps"] is not None:
            lines.append(
                f"    other clients out of the batch: {pair[0]} {fast['gaps']:.2f},"
                f" {pair[1]} {slow['gaps']:.2f}; their line predicts"
                f" {fast['line'] / slow['line'] - 1:+.1%}"
            )
    return lines


def _sweep_lines(data: dict[str, Any]) -> list[str]:
    """The sweep per level, route and mix; under a mixed row the sidecar's options by draft
    length in the mixed A/B at that level, and its best k judged against the true one."""
    ks = sorted({int(k) for s in data["sweep"] for k in s["speedup"]})
    seen = _sidecar(data)
    deployed = int(data.get("args", {}).get("k", 0) or 0)
    rows = [["level", "route", "mix", *(f"k={k}" for k in ks), "true best (lead)",
             "sidecar best", "advise", "judged", "regret sidecar", "regret advise"]]  # fmt: skip
    notes = []
    measured: dict[int, dict[int, float]] = {}  # level -> measure's steps, printed once
    for s in data["sweep"]:
        c, route, mix = s["concurrency"], s["route"], s.get("mix", "alone")
        speedup = {int(k): v for k, v in s["speedup"].items()}
        mine = seen.get((c, route)) if mix == "mixed" else None
        rows.append([
            str(c), route, mix, *(_f(speedup.get(k)) for k in ks),
            f"{s['best']} ({s['lead']:+.1%})" if s["best"] is not None else "-",
            "-" if mine is None else _said(mine["readings"]),
            "-" if mine is None else mine["advise"],
            "-" if mine is None else judged(speedup, mine["said"]),
            *(_regrets(speedup, mine)),
        ])  # fmt: skip
        if mine is not None:
            rows.append(["", "", "sidecar", *(_f(mine["options"].get(k)) for k in ks),
                         "", "", "", "", "", ""])  # fmt: skip
            truth, swept = mine["truth"], speedup.get(deployed)
            if truth and swept:
                notes.append(f"  c={c} {route}: the sweep's k={deployed} x{swept:.3f} against the "
                             f"A/B's x{truth:.3f} ({swept / truth - 1:+.1%})")  # fmt: skip
        steps = {int(k): v for k, v in (s.get("steps") or {}).items()}
        if mix == "mixed" and any(v is not None for v in steps.values()):
            rows.append(["", "", "step, true", *(_f(steps.get(k)) for k in ks),
                         "", "", "", "", "", ""])  # fmt: skip
            if c not in measured:
                measured[c] = _measure_steps(data, c, deployed)
                rows.append(["", "", "step, measure", *(_f(measured[c].get(k)) for k in ks),
                             "", "", "", "", "", ""])  # fmt: skip
    return [
        "\nThe true best draft length: the A/B at each k (k=0: plain), the routes together "
        "(mixed) or alone; under each mixed row the sidecar's options in the mixed A/B, the "
        "step the truth implies (E(k) / speedup, in plain steps) and, once per level, measure's",
        *aligned(rows),
        *notes,
    ]


def _regrets(speedup: dict[int, float | None], mine: dict[str, Any] | None) -> list[str]:
    """The worst regret of the sidecar's readings and of advise's, as percentages."""
    if mine is None:
        return ["-", "-"]
    told = [] if mine["advised"] is None else [mine["advised"]]
    return [_pct(worst_regret(speedup, said)) for said in (mine["readings"], told)]


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1%}"


def _said(said: list[Said]) -> str:
    """The sidecar's readings of the best k, in order ("tie(a,b)": its top two within its
    error)."""
    return "/".join(f"tie({','.join(map(str, k))})" if isinstance(k, tuple) else str(k)
                    for k in said) or "-"  # fmt: skip


def _sidecar(data: dict[str, Any]) -> dict[tuple[int, str], dict[str, Any]]:
    """(level, route) -> what the sidecar said in the mixed A/B: its best-k readings, then
    advise's (judged alike: the issue holds both to the true best k), its options by draft
    length, advise's best k as printed, and the A/B truth."""
    out = {}
    for level in data.get("levels", []):
        advice = level.get("advise") or {}
        told = {r["route"]: _advised(r) for r in advice.get("routes", [])}
        for route, f in level["routes"].items():
            mine, readings = told.get(route), _readings(f)
            out[(level["concurrency"], route)] = {
                "readings": readings,
                "said": readings + ([] if mine is None else [mine]),
                "options": {int(k): v for k, v in f.get("by_draft_length", {}).items()},
                "advise": "-" if mine is None else _said([mine]),
                "advised": mine,
                "truth": f["truth"],
            }
    return out


def _advised(route: dict[str, Any]) -> Said:
    """`specdec advise --json`'s best k for a route, or where it named none, its top two by
    its options ({k: [speedup, half-width]})."""
    best = route.get("best_draft_length")
    if best is not None:
        return int(best)
    return top_two({int(k): v[0] for k, v in (route.get("by_draft_length") or {}).items()})


def _readings(route: dict[str, Any]) -> list[Said]:
    """Each reading's best k, or where it named none, its top two by its own options."""
    said = route["best_draft_length"]
    readings = route.get("readings") or [{}] * len(said)  # none kept: a tie names no k
    return [
        top_two({int(k): v for k, v in r.get("by_draft_length", {}).items()}) if b is None else b
        for b, r in zip(said, readings, strict=True)
    ]


def _measure_steps(data: dict[str, Any], level: int, k: int) -> dict[int, float]:
    """Measure's steps in plain steps at its point nearest the level: the draft lengths it
    measured below k (the sidecar's options take them as they are) and the verify step at k
    (the options take the live step there, and measure's slope past it)."""
    point = _measure_point(data, level)
    if point is None:
        return {}
    plain = point["plain_seconds"]
    steps = {0: 1.0, **{int(j): x / plain for j, x in (point.get("draft_seconds") or {}).items()}}
    if point.get("verify_seconds"):
        steps[k] = point["verify_seconds"] / plain
    return steps


def _measure_point(data: dict[str, Any], level: int) -> dict[str, Any] | None:
    """Measure's step-time point nearest the level (None: the run has no curve)."""
    curve = (data.get("measure") or {}).get("curve") or []
    return min(curve, key=lambda p: abs(p["running"] - level), default=None)
