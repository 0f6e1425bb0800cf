"""The bench's one table, from its results document (bench/gpu_payoff.py's results.json)."""

from __future__ import annotations

from typing import Any

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
    if data.get("sweep"):
        ks = sorted({int(k) for s in data["sweep"] for k in s["speedup"]})
        sidecar = _sidecar_best(data)
        rows = [["level", "route", *(f"k={k}" for k in ks), "true best (lead)",
                 "sidecar best", "advise"]]  # fmt: skip
        for s in data["sweep"]:
            c, route = s["concurrency"], s["route"]
            seen = sidecar.get((c, route), ("-", "-"))
            rows.append([
                str(c), route, *(_f(s["speedup"][k]) for k in _keys(s["speedup"], ks)),
                f"{s['best']} ({s['lead']:+.1%})" if s["best"] is not None else "-",
                seen[0], seen[1],
            ])  # fmt: skip
        lines.append(
            "\nThe true best draft length: the A/B at each k, the route alone (k=0: plain)"
        )
        lines += aligned(rows)
    return "\n".join(lines)


def _keys(speedup: dict[Any, float], ks: list[int]) -> list[Any]:
    """The sweep's keys in order (ints in memory, strings once through JSON)."""
    return [k if k in speedup else str(k) for k in ks]


def _sidecar_best(data: dict[str, Any]) -> dict[tuple[int, str], tuple[str, str]]:
    """(level, route) -> (the sidecar's best draft length in the mixed A/B, advise's)."""
    out = {}
    for level in data.get("levels", []):
        advice = level.get("advise") or {}
        by_route = {r["route"]: r.get("best_draft_length") for r in advice.get("routes", [])}
        for route, f in level["routes"].items():
            best = sorted({b for b in f["best_draft_length"] if b is not None})
            out[(level["concurrency"], route)] = (
                ",".join(map(str, best)) or "tie",
                "-"
                if route not in by_route
                else str(by_route[route] if by_route[route] is not None else "tie"),
            )
    return out
