"""The engine's step cost against the draft length, from llama-server's own counters: at each
level, closed-loop phases of both routes at k = 0..K and back (k = 0: a plain server), each
phase's wall seconds per target decode call (`llamacpp:n_decode_total`) and drafted tokens per
draft. What the options by draft length read through the steps `measure` measured at 1 and
k - 1 drafts and past k on the line from k - 1 (docs/BENCHMARKS.md §11, run 18).

    python -m bench.gpu.step_cost --server /dev/shm/llama-server --source trimmed.tgz \\
        --work /dev/shm/sd --levels 16 --k 5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from bench._run import free_port
from bench.gpu import build as builder
from bench.gpu.models import write_models
from bench.gpu.servers import Launch, Server, command, running
from bench.gpu.traffic import ROUTES, VOICE, add_spread_flag, idle, phase, spread, spread_error
from exporter.scrape.exposition import scan


def counters(metrics_url: str) -> dict[str, float]:
    """The server's `llamacpp:` samples, summed by name (the sidecar's own scanner)."""
    with urllib.request.urlopen(metrics_url, timeout=5) as reply:
        text = reply.read().decode()
    found: dict[str, float] = {}
    for sample in scan(text, ("llamacpp:",)).samples:
        found[sample.name] = found.get(sample.name, 0.0) + sample.value
    return found


def step_row(before: dict[str, float], after: dict[str, float], wall: float) -> dict[str, Any]:
    """A phase's wall milliseconds per target decode call and drafted tokens per draft."""
    d = {name: after[name] - before.get(name, 0.0) for name in after}
    calls = d.get("llamacpp:n_decode_total", 0.0)
    drafts = d.get("llamacpp:spec_decode_num_drafts_total", 0.0)
    tokens = d.get("llamacpp:spec_decode_num_draft_tokens_total", 0.0)
    return {
        "ms_per_decode": 1000 * wall / calls if calls else None,
        "drafted_per_draft": tokens / drafts if drafts else None,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--server", type=Path, required=True, help="the patched llama-server")
    ap.add_argument("--source", type=Path, help="the sdist or packed tree (its gguf-py)")
    ap.add_argument("--work", type=Path, default=Path("/dev/shm/specdec-gpu"))
    ap.add_argument("--levels", default="16")
    ap.add_argument("--k", type=int, default=5)
    ap.add_argument("--phase", type=float, default=6.0)
    ap.add_argument("--warm", type=float, default=10.0)
    Launch.add_flags(ap)
    add_spread_flag(ap)
    args = ap.parse_args()
    if error := spread_error(args):
        print(f"step_cost: {error}", file=sys.stderr)
        return 2
    routes = spread(ROUTES, args.length_spread)
    src = builder.prepare(args.source, args.work)
    models = write_models(src / "gguf-py", args.work / "models")
    launch = Launch.from_flags(args)
    ports = free_port(), free_port()
    plain = Server("plain", ports[0], command(args.server, models, ports[0], launch, None),
                   args.work / "plain.log")  # fmt: skip
    spec = Server("sweep", ports[1], command(args.server, models, ports[1], launch, args.k,
                  VOICE.rates), args.work / "sweep.log")  # fmt: skip
    ks = list(range(args.k + 1))
    with running([plain, spec]):
        for server in (plain, spec):  # the same slot history as the bench's servers
            asyncio.run(phase(server.base_url, routes, 32, args.warm))
            asyncio.run(idle(server.metrics_url))
        for c in (int(x) for x in args.levels.split(",")):
            for k in ks + ks[::-1]:
                server = plain if k == 0 else spec
                before, t0 = counters(server.metrics_url), time.monotonic()
                asyncio.run(phase(server.base_url, routes, c, args.phase, k=k or None))
                row = step_row(before, counters(server.metrics_url), time.monotonic() - t0)
                print(json.dumps({"concurrency": c, "k": k, **row}), flush=True)
                asyncio.run(idle(server.metrics_url))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
