"""What a scrape of the routes' families costs the sidecar: the route and request collectors over
one accounting with --routes routes x --models models, after --requests exact requests spread
over ticks (every window filled), page rendered as Prometheus gets it (`generate_latest`).
`--target`: a fronted target too (two ranks per model, scraped each tick), its collector beside
them and the route collector reading its batch, as `serve` wires them.

The reference is another checkout of the project (`--reference DIR`, e.g. a `git worktree` of an
earlier commit), run in its own interpreter alternately with this one, --rounds times each: the
ratio this / reference is the figure (docs/BENCHMARKS.md §5).

    python bench/bench_collect.py --reference /tmp/before [--rounds 3] [--scrapes 50] [--target]
                                  [--record]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

from _run import REPO, add_outputs, keep


def engine_page(models: list[str], i: int) -> str:
    """A vLLM page of two ranks per model, its counters at tick `i`, a batch of 4 + rank."""
    lines = []
    for model in models:
        for rank in ("0", "1"):
            labels = f'engine="{rank}",model_name="{model}"'
            lines += [
                f"vllm:spec_decode_num_drafts_total{{{labels}}} {30 * i}",
                f"vllm:spec_decode_num_draft_tokens_total{{{labels}}} {90 * i}",
                f"vllm:spec_decode_num_accepted_tokens_total{{{labels}}} {50 * i}",
                *(
                    f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{labels},position="{p}"}}'
                    f" {n * i}"
                    for p, n in enumerate((20, 18, 12))
                ),
                f"vllm:num_requests_running{{{labels}}} {4 + int(rank)}",
            ]
    return "\n".join(lines) + "\n"


def one(tree: Path, routes: int, models: int, requests: int, scrapes: int, target: bool) -> float:
    """Milliseconds per scrape, the best of five batches, in `tree`'s code."""
    sys.path.insert(0, str(tree))
    from prometheus_client import CollectorRegistry, generate_latest

    from exporter.config import ModelConfig, Target
    from exporter.core.counts import Counts
    from exporter.core.windows import DEFAULT_WINDOWS
    from exporter.engines import DEFAULT
    from exporter.export.request_collector import RequestCollector
    from exporter.export.route_collector import RouteCollector
    from exporter.export.target_collector import TargetCollector
    from exporter.scrape.target import TargetState

    try:  # the ledger's home before 7fe446d (first: an editable install would lend the new one)
        from exporter.proxy.accounting import Accounting, RequestOutcome
    except ImportError:
        from exporter.accounting.ledger import (  # type: ignore[no-redef]
            Accounting,
            RequestOutcome,
        )
    rng = random.Random(1)
    names = [f"route{i}" for i in range(routes)]
    configs = {f"model{i}": ModelConfig(f"model{i}", 3, 1.5) for i in range(models)}
    acc = Accounting(names, DEFAULT_WINDOWS, configs)
    gpu0 = Target("gpu0", "http://gpu0/metrics")
    fronted = TargetState(gpu0, DEFAULT_WINDOWS) if target else None
    now = 0.0
    bands = (("temperature", "greedy"), ("output", "text"), ("prompt_tokens", "le512"))
    for i in range(requests):
        acc.record(
            RequestOutcome(
                rng.choice(names),
                rng.choice(list(configs)),
                "200",
                100,
                prompt_tokens=300,
                ttft=0.1,
                decode_seconds=1.0,
                exact=Counts(30, 90, 50, (20, 18, 12)),
                increments=(1,) + (3,) * 33,
                slices=bands,
            )
        )
        if i % 10 == 0:
            now += 1.0
            if fronted is not None:
                fronted.ingest(engine_page(list(configs), i // 10), now)
                acc.apportion(fronted.work_by_model())
            acc.tick(now)
    registry = CollectorRegistry()
    registry.register(RouteCollector(acc, configs, fronted, DEFAULT, lambda: now))
    registry.register(RequestCollector(acc, lambda: now))
    if fronted is not None:
        registry.register(TargetCollector((fronted,), lambda: now, configs))
    generate_latest(registry)
    batches = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(scrapes):
            generate_latest(registry)
        batches.append((time.perf_counter() - t0) / scrapes * 1e3)
    return min(batches)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reference", type=Path, required=True, help="another checkout's root")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--scrapes", type=int, default=50)
    ap.add_argument("--routes", type=int, default=6)
    ap.add_argument("--models", type=int, default=2)
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--target", action="store_true", help="a fronted target and its collector too")
    ap.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    add_outputs(ap)
    args = ap.parse_args()
    if args.child is not None:
        ms = one(args.child, args.routes, args.models, args.requests, args.scrapes, args.target)
        print(json.dumps(ms))
        return 0
    if not (args.reference / "exporter").is_dir():
        print(f"bench_collect: --reference {args.reference}: no exporter/ there", file=sys.stderr)
        return 2
    figures: dict[str, list[float]] = {"this": [], "reference": []}
    for _ in range(args.rounds):
        for side, tree in (("this", REPO), ("reference", args.reference)):
            cmd = [sys.executable, __file__, "--reference", str(args.reference), "--child",
                   str(tree), "--scrapes", str(args.scrapes), "--routes", str(args.routes),
                   "--models", str(args.models), "--requests", str(args.requests),
                   *(["--target"] if args.target else [])]  # fmt: skip
            out = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd="/")
            figures[side].append(json.loads(out.stdout))
    for side, values in figures.items():
        print(f"{side:9} ms per scrape: " + ", ".join(f"{v:.2f}" for v in values))
    ratio = statistics.median(figures["this"]) / statistics.median(figures["reference"])
    print(f"this / reference (medians): x{ratio:.3f}")
    keep(args, "bench_collect", {
        "reference": str(args.reference),
        "ms_per_scrape": figures,
        "this_over_reference": round(ratio, 4),
        "routes": args.routes, "models": args.models, "requests": args.requests,
        "target": args.target,
    })  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
