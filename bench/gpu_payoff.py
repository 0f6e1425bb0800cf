#!/usr/bin/env python3
"""The payoff at load on a real GPU engine: llama.cpp's server built with CUDA, a memory-bound
7-8B random-weight target and a small draft, two routes of different acceptance sharing one
speculative server (docs/BENCHMARKS.md §11: what it measures and the standing figures; every
recorded run with its commands and notes: bench/results/gpu_payoff-*.json).

1. build   llama-server with CUDA from the llama-cpp-python sdist, patched so a request brings
           its own synthetic acceptance and draft length (bench/gpu/build.py), or --server BIN;
2. models  the target and draft GGUFs, written locally (bench/gpu/models.py);
3. ab      each server first runs --warm seconds at the top level (llama-server's step time
           depends on which of its slots have been used, so measure and the A/B must see the
           same history), then the A/B truth per route and load (closed-loop clients at each
           --levels, phases alternated spec, plain, ...; rounds repeated until two agree
           within 5 %, an outlier named, never averaged in), and on the same servers the
           product's own path: `specdec measure --concurrency` -> its models: block ->
           `specdec serve` with the proxy and both routes, the A/B's speculative phases sent
           through it -> the sidecar's estimated and measured speedups, best draft length and
           `specdec advise`; at --alone levels each route alone on the engine too (load vs
           mixing);
4. repeat  measure with one replicate a point, --repeat times on one start of the servers, the
           points side by side with their spread (a single phase's repeatability);
5. sweep   the true best draft length: the A/B at k = 0..--sweep-k at each --sweep-levels
           (k = 0: the plain server), the routes together on the engine (what the sidecar's
           options say; with ab, in the same run: two starts of a server differ) and/or each
           alone (--sweep-mix).

Everything lands in --out (results.json after each step, the sidecar's pages, logs) and one
table is printed (`--record` keeps it in bench/results/). `--cpu` runs the same logic on CI's
tiny model with a CPU build (no GPU).

    python bench/gpu_payoff.py --out /tmp/gpu-bench                     # all of it (~20 min)
    python bench/gpu_payoff.py --server build/bin/llama-server --steps ab --out OUT
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import statistics
import sys
import tempfile
import time
import urllib.error
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._run import add_outputs, free_port, keep
from bench.gpu import build as builder
from bench.gpu import product, split
from bench.gpu import sweep as sweeping
from bench.gpu.models import write_models
from bench.gpu.rounds import Rate, Round, settled, verdict, within
from bench.gpu.servers import Launch, Server, command, running
from bench.gpu.table import report
from bench.gpu.traffic import (
    ROUTES,
    VOICE,
    Route,
    Span,
    add_spread_flag,
    idle,
    phase,
    spread,
    spread_error,
)

STEPS = ("build", "models", "ab", "repeat", "sweep")
TICK = 1.1  # the accounting's tick (1 s) and a margin: a window's figures hold what ended


class Run:
    """The run's results, written to OUT/results.json after every change. An OUT that holds an
    earlier invocation's results keeps them, but those of the steps run again: the A/B and the
    sweep can run in two invocations (each under a machine's time limit per command) and
    report as one."""

    def __init__(self, out: Path, args: argparse.Namespace, steps: set[str]) -> None:
        self.out = out
        self.data: dict[str, Any] = {"levels": [], "alone": [], "sweep": []}
        earlier = out / "results.json"
        if earlier.is_file():
            self.data = json.loads(earlier.read_text(encoding="utf-8"))
            if "ab" in steps:
                self.data.update(levels=[], alone=[], measure={})
            if "sweep" in steps:
                self.data["sweep"] = []
        self.data["args"] = {k: str(v) for k, v in vars(args).items()}

    def save(self) -> None:
        path = self.out / "results.json"
        path.write_text(json.dumps(self.data, indent=1, default=str), encoding="utf-8")

    def log(self, line: str) -> None:
        print(line, flush=True)
        with (self.out / "progress.log").open("a", encoding="utf-8") as f:
            f.write(line + "\n")


def settle_sidecar(metrics: str, routes: Sequence[Route], done: float, ended: float) -> str:
    """The sidecar's page once its accounting holds the phase: it counts `done` answered (200)
    requests of the routes and an accounting tick (1 s) has passed since the phase `ended`;
    polled, with a deadline."""
    deadline = ended + 10
    while True:
        page = product.get(metrics)
        ticked = time.monotonic() - ended > TICK
        if (ticked and answered(page, routes) >= done) or time.monotonic() > deadline:
            return page
        time.sleep(0.05)


def answered(page: str, routes: Sequence[Route]) -> float:
    """The routes' answered requests on a sidecar page."""
    samples = product.parse(page)
    return sum(
        product.summed(samples, "specdec_route_requests_total", route=r.name, status="200")
        for r in routes
    )


def ab_level(
    run: Run,
    spec: Server,
    plain: Server,
    proxy: str,
    metrics: str,
    routes: Sequence[Route],
    c: int,
    args: argparse.Namespace,
    window: str,
    label: str,
) -> dict[str, Any]:
    """Rounds of (spec through the proxy, plain direct) at concurrency c until every route has
    two agreeing rounds (at most --max-rounds); the sidecar read after each spec phase."""
    rounds: list[Round] = []
    plain_splits: list[dict[str, split.RouteSplit]] = []
    readings: list[dict[str, product.Reading]] = []
    advice: list[dict[str, Any]] = []
    pages = run.out / "pages"
    pages.mkdir(exist_ok=True)
    names = [r.name for r in routes]
    while len(rounds) < args.max_rounds and not (len(rounds) >= 2 and settled(rounds, names)):
        r = Round()
        asyncio.run(idle(spec.metrics_url))
        before = product.get(metrics)
        seen = answered(before, routes)
        spans: dict[str, list[Span]] = {"spec": [], "plain": []}
        r.spec, failed = asyncio.run(
            phase(proxy, routes, c, args.phase, proxied=True, timeline=spans["spec"])
        )
        done = seen + sum(x.requests for x in r.spec.values())
        after = settle_sidecar(metrics, routes, done, time.monotonic())
        n = len(rounds) + 1
        (pages / f"{label}-c{c}-r{n}-before.prom").write_text(before, encoding="utf-8")
        (pages / f"{label}-c{c}-r{n}-after.prom").write_text(after, encoding="utf-8")
        readings.append({name: product.reading(before, after, name, window) for name in names})
        if c in args.advise_at and label == "mixed":
            advice.append(product.advise(metrics, window))
        asyncio.run(idle(plain.metrics_url))
        r.plain, failed_plain = asyncio.run(
            phase(plain.base_url, routes, c, args.phase, timeline=spans["plain"])
        )
        for server, timeline in spans.items():
            split.write(run.out / "timelines" / f"{label}-c{c}-r{n}-{server}.jsonl", timeline)
        plain_splits.append({x.route: x for x in split.split(spans["plain"])})
        rounds.append(r)
        figures = " ".join(f"{name} x{x:.3f}" for name in names if (x := r.ab(name)) is not None)
        lost = failed + failed_plain
        run.log(f"  {label} c={c} round {n}: {figures}" + (f" ({lost} failed)" if lost else ""))
    found: dict[str, Any] = {"concurrency": c, "routes": {}}
    for name in names:
        v = verdict(rounds, name)
        used = list(v.pair) if v.pair is not None else list(range(len(rounds)))
        mine = [readings[i][name] for i in used]

        def mean(field: str, mine: Sequence[object] = mine) -> float | None:
            values = [x for m in mine if (x := getattr(m, field)) is not None]
            return statistics.fmean(values) if values else None

        plain = [plain_splits[i][name] for i in used if name in plain_splits[i]]

        by_k: dict[int, list[float]] = {}
        for m in mine:
            for k, x in m.by_draft_length.items():
                by_k.setdefault(k, []).append(x)
        found["routes"][name] = {
            "truth": v.truth,
            "rounds": v.figures,
            "pair": v.pair,
            "outliers": v.outliers,
            "spec_rates": [r.spec[name].per_second for r in rounds],
            "plain_rates": [r.plain[name].per_second for r in rounds],
            # the plain phases of the rounds used: the rate, the gaps seen, the gaps' line
            "plain": {
                "rate": mean("rate", plain),
                "gaps": mean("gaps", plain),
                "line": mean("predicted", plain),
            },
            "requests": [r.spec[name].requests for r in rounds],
            "estimated": mean("estimated"),
            "measured": mean("measured"),
            "acceptance": mean("acceptance"),
            "tokens_per_step": mean("tokens_per_step"),
            "batch": mean("batch"),
            "by_draft_length": {k: statistics.fmean(x) for k, x in sorted(by_k.items())},
            "best_draft_length": [m.best_draft_length for m in mine],
            "readings": [asdict(m) for m in mine],
            "estimated_within_10pct": within(mean("estimated"), v.truth, 0.10),
            "measured_within_10pct": within(mean("measured"), v.truth, 0.10),
        }
    if advice:
        found["advise"] = advice[-1]
    return found


def traffic(args: argparse.Namespace) -> tuple[Route, ...]:
    """The two routes at the run's --length-spread."""
    return spread(ROUTES, args.length_spread)


def run_ab(run: Run, spec: Server, plain: Server, args: argparse.Namespace) -> None:
    work = Path(args.work)
    routes = traffic(args)
    pack = product.scenario_pack(work / "pack.jsonl", routes)
    t0 = time.monotonic()
    warm([spec, plain], args)
    printed = product.measure(spec.base_url, plain.base_url, args.levels, pack,
                              run.out / "measure.log", args.context_tokens,
                              args.replicates)  # fmt: skip
    block = product.models_block(printed)
    run.data["measure"] = {"printed": printed, "seconds": time.monotonic() - t0,
                           "curve": product.curve(block)}  # fmt: skip
    run.save()
    run.log(f"measure --concurrency {args.levels}: {time.monotonic() - t0:.0f} s\n{printed}")
    window = f"{int(args.phase + 1)}s"
    proxy_port, side_port = free_port(), free_port()
    config = work / "specdec.yaml"
    product.sidecar_config(config, spec.base_url, proxy_port, window, routes, block)
    with product.serve(config, side_port, run.out / "serve.log") as metrics:
        proxy = f"http://127.0.0.1:{proxy_port}"
        up = time.monotonic()
        while time.monotonic() - up < args.phase + 2:  # a window's gauge needs that much history
            time.sleep(0.2)
        for c in args.levels:
            found = ab_level(run, spec, plain, proxy, metrics, routes, c, args, window, "mixed")
            run.data["levels"].append(found)
            run.save()
        for c in args.alone:
            for route in routes:
                found = ab_level(run, spec, plain, proxy, metrics, [route], c, args, window,
                                 f"alone-{route.name}")  # fmt: skip
                found["alone"] = route.name
                run.data["alone"].append(found)
                run.save()


def run_repeat(run: Run, spec: Server, plain: Server, args: argparse.Namespace) -> None:
    """`measure --concurrency --replicates 1` --repeat times against the same warmed servers:
    each level's plain and verify seconds per step in every run, and their spread (max / min -
    1): what a single phase per point gives."""
    pack = product.scenario_pack(Path(args.work) / "pack.jsonl", traffic(args))
    warm([spec, plain], args)
    curves = []
    for i in range(args.repeat):
        t0 = time.monotonic()
        printed = product.measure(spec.base_url, plain.base_url, args.levels, pack,
                                  run.out / "measure.log", args.context_tokens, 1,
                                  args.measure_runs)  # fmt: skip
        curves.append(product.curve(product.models_block(printed)))
        run.log(f"measure {i + 1} of {args.repeat}: {time.monotonic() - t0:.0f} s")
    run.data["repeat"] = curves
    run.save()
    for key in ("plain_seconds", "verify_seconds"):
        for j, c in enumerate(args.levels):
            figures = [curve[j][key] for curve in curves if j < len(curve)]
            spread = max(figures) / min(figures) - 1 if figures else float("nan")
            each = " ".join(f"{1e3 * f:.2f}" for f in figures)
            run.log(f"  c={c} {key} ms: {each}  spread {100 * spread:.1f}%")


def warm(servers: Sequence[Server], args: argparse.Namespace) -> None:
    """--warm seconds of both routes at the top level on each server: llama-server's step time
    depends on which of its slots have been used (docs/BENCHMARKS.md §11, runs 4 and 15), so
    every server a figure compares must have the same history."""
    for server in servers:
        asyncio.run(phase(server.base_url, traffic(args), max(args.levels), args.warm))
        asyncio.run(idle(server.metrics_url))


def run_sweep(run: Run, sweep: Server, plain: Server, args: argparse.Namespace) -> None:
    """Per level and --sweep-mix, the A/B at k = 0..K (bench/gpu/sweep.py): the routes
    together (`mixed`) or each alone, two rounds, ascending then descending k; the sweep
    server warmed as the A/B's were."""
    warm([sweep, plain], args)
    ks = list(range(args.sweep_k + 1))
    both = traffic(args)
    for c in args.sweep_levels:
        for mix in args.sweep_mix:
            for routes in [both] if mix == "mixed" else [[r] for r in both]:
                rounds: list[dict[int, dict[str, Rate]]] = []
                for order in (ks, ks[::-1]):
                    rates: dict[int, dict[str, Rate]] = {}
                    for k in order:
                        server = plain if k == 0 else sweep
                        asyncio.run(idle(server.metrics_url))
                        rates[k], _ = asyncio.run(
                            phase(server.base_url, routes, c, args.sweep_phase, k=k or None)
                        )
                    rounds.append(rates)
                for route in routes:
                    mine = [{k: r[k][route.name] for k in ks} for r in rounds]
                    found = sweeping.entry(c, route.name, mix, mine, route.rates)
                    run.data["sweep"].append(found)
                    run.save()
                    figures = " ".join(f"k={k} x{found['speedup'][k] or 0:.3f}" for k in ks)
                    run.log(f"  sweep {mix} {route.name} c={c}: {figures}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "specdec-gpu-bench")
    ap.add_argument("--work", default="/dev/shm/specdec-gpu", help="models and builds (tmpfs)")
    ap.add_argument("--source", type=Path, help="the llama-cpp-python sdist or a packed tree")
    ap.add_argument("--server", type=Path, help="a llama-server built with the patch (skip build)")
    ap.add_argument("--gguf-py", type=Path, help="llama.cpp's gguf-py (default: the source's)")
    ap.add_argument("--steps", default="build,models,ab,sweep", help=f"of {','.join(STEPS)}")
    ap.add_argument("--levels", default="1,4,16,32")
    ap.add_argument("--alone", default="16", help="levels with each route alone too ('' none)")
    ap.add_argument("--advise-at", default="1,16")
    ap.add_argument("--phase", type=float, default=10.0, help="seconds per A/B phase")
    ap.add_argument("--max-rounds", type=int, default=4)
    ap.add_argument("--warm", type=float, default=10.0,
                    help="seconds of top-level traffic on each server before measure")  # fmt: skip
    ap.add_argument("--context-tokens", type=int, default=48,
                    help="measure's --context-tokens: the filler's words (the bench's toy "
                         "vocabulary makes ~7 tokens of each)")  # fmt: skip
    add_spread_flag(ap)
    ap.add_argument("--replicates", type=int, default=2, help="measure's --replicates")
    ap.add_argument("--repeat", type=int, default=2, help="the repeat step's measure runs")
    ap.add_argument("--measure-runs", type=int, default=1, help="measure's --runs")
    ap.add_argument("--k", type=int, default=3, help="the deployed draft length")
    ap.add_argument("--sweep-levels", default="1,16")
    ap.add_argument("--sweep-k", type=int, default=5)
    ap.add_argument("--sweep-phase", type=float, default=6.0)
    ap.add_argument("--sweep-mix", default="mixed",
                    help="mixed (the routes together), alone (each alone), or both")  # fmt: skip
    Launch.add_flags(ap)
    ap.add_argument("--jobs", type=int, default=16)
    ap.add_argument("--cpu", action="store_true", help="CPU build, CI's tiny model: the logic only")
    add_outputs(ap, json_file=False)
    args = ap.parse_args()
    steps = set(args.steps.split(","))
    if not steps <= set(STEPS):
        print(f"gpu_payoff: --steps takes {','.join(STEPS)}, got {args.steps!r}", file=sys.stderr)
        return 2
    if error := spread_error(args):
        print(f"gpu_payoff: {error}", file=sys.stderr)
        return 2
    args.sweep_mix = [m for m in args.sweep_mix.split(",") if m]
    if not set(args.sweep_mix) <= set(sweeping.MIXES):
        print(f"gpu_payoff: --sweep-mix takes {','.join(sweeping.MIXES)}, got "
              f"{','.join(args.sweep_mix)!r}", file=sys.stderr)  # fmt: skip
        return 2
    for name in ("levels", "alone", "advise_at", "sweep_levels"):
        text = getattr(args, name)
        try:
            setattr(args, name, [int(x) for x in text.split(",") if x])
        except ValueError:
            flag = "--" + name.replace("_", "-")
            print(f"gpu_payoff: {flag} takes N,N,..., got {text!r}", file=sys.stderr)
            return 2
    if steps & {"ab", "repeat"} and len(args.levels) < 2:
        # measure's curve needs two levels: with one, `measure --concurrency N` is the
        # closed-loop measure and prints no models: block
        print(f"gpu_payoff: --levels takes two levels or more for measure's curve, got "
              f"{','.join(map(str, args.levels))!r}", file=sys.stderr)  # fmt: skip
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    run = Run(args.out, args, steps)
    for sig in (signal.SIGTERM, signal.SIGHUP):  # the servers are stopped on the way out
        signal.signal(sig, lambda *_: signal.raise_signal(signal.SIGINT))
    try:
        return _main(run, args, steps, work)
    except KeyboardInterrupt:
        run.log("gpu_payoff: interrupted; what was measured is in results.json")
        return 130
    except (builder.BuildError, RuntimeError, TimeoutError, urllib.error.URLError) as exc:
        run.log(f"gpu_payoff: {exc}")
        return 1
    finally:
        run.save()
        if run.data["levels"] or run.data["sweep"]:
            text = report(run.data)
            (args.out / "table.txt").write_text(text + "\n", encoding="utf-8")
            print(text)
            keep(args, "gpu_payoff", {"printed": text, "out": str(args.out)})


def _main(run: Run, args: argparse.Namespace, steps: set[str], work: Path) -> int:
    t0 = time.monotonic()
    src = None
    if args.server is None or args.gguf_py is None:
        src = builder.prepare(args.source, work)
    binary = args.server
    if binary is None:
        if "build" not in steps:
            raise builder.BuildError("give --server or include the build step")
        binary = builder.build(src, work / ("build-cpu" if args.cpu else "build-cuda"),
                               not args.cpu, args.jobs, args.out / "build.log")  # fmt: skip
        run.log(f"built {binary} in {time.monotonic() - t0:.0f} s")
    run.data["server"] = str(binary)
    if not steps & {"models", "ab", "repeat", "sweep"}:
        return 0
    gguf_py = args.gguf_py or (src / "gguf-py")  # type: ignore[operator]
    t1 = time.monotonic()
    models = write_models(gguf_py, work / ("models-tiny" if args.cpu else "models"), args.cpu)
    run.log(f"models in {time.monotonic() - t1:.0f} s: {models}")
    if not steps & {"ab", "repeat", "sweep"}:
        return 0
    launch = Launch.from_flags(args, gpu=not args.cpu)
    logs = args.out / "logs"

    def server(name: str, k: int | None) -> Server:
        port = free_port()
        return Server(name, port, command(binary, models, port, launch, k, VOICE.rates),
                      logs / f"{name}.log")  # fmt: skip

    plain, spec = server("plain", None), server("spec", args.k)
    sweep = server("sweep", args.sweep_k) if "sweep" in steps else None
    t2 = time.monotonic()
    with running([s for s in (plain, spec, sweep) if s is not None]):
        run.log(f"servers up in {time.monotonic() - t2:.0f} s")
        if "ab" in steps:
            run_ab(run, spec, plain, args)
        if "repeat" in steps:
            run_repeat(run, spec, plain, args)
        if sweep is not None:
            run_sweep(run, sweep, plain, args)
    run.log(f"done in {time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
