"""The product's own path on the bench's servers, as a user runs it: `specdec measure
--concurrency` against the speculative and the plain server (the routes' prompts, caps and
request fields), its printed `models:` block pasted as it is into a sidecar config, `specdec
serve` with the proxy and both routes, the sidecar's figures read off its /metrics, and
`specdec advise`."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

from bench.gpu.traffic import Route
from exporter.measure.scenarios import builtin

Samples = dict[str, list[tuple[dict[str, str], float]]]


def specdec(*args: str) -> list[str]:
    return [sys.executable, "-m", "exporter", *args]


def scenario_pack(path: Path, routes: Sequence[Route], prompts: int = 8, caps: int = 4) -> Path:
    """The routes as `measure` scenarios: their prompts (the first `prompts`), lengths and
    request fields, so measure's curve sees the traffic the A/B sends. A scenario has one
    length (`max_tokens`), so a route with a spread is `caps` scenarios, `ROUTE_j` at the
    spread's quantiles, each with its share of the prompts. Each route's weight is inverse to
    its mean length, so each holds the same share of measure's batch as of the A/B's, where
    half the clients send each route. Runs 22-23 sent equal numbers, so the agent's
    200-token requests held about 200 / (200 + 80) = 71 % of measure's batch; there, at
    c = 16, measure's steps at k = 2-3 ran 10-11 % longer than the A/B's (its plain step
    3.5 %, at k = 1 within 1 %). A longer context costs a step more; whether the mix was the
    cause, a run with these weights says (docs/BENCHMARKS.md §11)."""
    longest = max(r.mean_tokens for r in routes)
    lines = []
    for r in routes:
        s = builtin(r.scenario)
        extra = {k: v for k, v in r.body(0, None).items() if k not in ("model", "messages",
                                                                         "max_tokens")}  # fmt: skip
        lengths = r.caps(caps)
        share = max(1, prompts // len(lengths))
        for j, tokens in enumerate(lengths):
            name = r.name if len(lengths) == 1 else f"{r.name}_{j}"
            mine = list(s.prompts[:prompts])[j * share : (j + 1) * share] or list(s.prompts[:share])
            lines.append(json.dumps({"name": name, "max_tokens": tokens, "system": s.system,
                                     "prompts": mine, "extra_body": extra,
                                     "weight": round(longest / r.mean_tokens, 4)},
                                    ensure_ascii=False))  # fmt: skip
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def measure(
    spec: str,
    plain: str,
    levels: Sequence[int],
    pack: Path,
    log: Path,
    context_tokens: int,
    replicates: int,
    runs: int = 1,
) -> str:
    """`specdec measure --concurrency` as printed (a table, then the `models:` block)."""
    cmd = specdec("measure", "--base-url", spec, "--baseline-url", plain, "--scenario-file",
                  str(pack), "--concurrency", ",".join(map(str, levels)),
                  "--context-tokens", str(context_tokens), "--replicates", str(replicates),
                  "--runs", str(runs))  # fmt: skip
    with log.open("ab") as err:
        out = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=err, text=True, timeout=1200)
    if out.returncode:
        raise RuntimeError(f"measure exited {out.returncode}: {log.read_text()[-2000:]}")
    return out.stdout


def models_block(printed: str) -> str:
    """The `models:` block measure printed (the last part of its output), as it is."""
    lines = printed.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("models:")), None)
    if start is None:
        raise RuntimeError(f"measure printed no models: block:\n{printed[-2000:]}")
    return "\n".join(lines[start:]) + "\n"


def curve(block: str) -> list[dict[str, float]]:
    """The step-time points of a models: block."""
    models = yaml.safe_load(block)["models"]
    return list(models[0].get("step_time") or [])


def sidecar_config(path: Path, spec: str, proxy_port: int, window: str,
                   routes: Sequence[Route], block: str) -> None:  # fmt: skip
    """A sidecar config: the speculative server scraped and fronted, a route per header, one
    window, and measure's block pasted as printed."""
    rules = "\n".join(
        f"    - {{name: {r.name}, when: {{header: {{x-route: {r.header}}}}}}}" for r in routes
    )
    path.write_text(
        f"""targets:
  - {{name: llamacpp, url: "{spec}/metrics", engine: llamacpp, interval: 250ms}}
windows: [{window}]
proxy:
  upstream: {spec}
  listen: 127.0.0.1:{proxy_port}
  routes:
{rules}
{block}""",
        encoding="utf-8",
    )


def get(url: str, timeout: float = 5.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return str(resp.read().decode("utf-8", errors="replace"))


@contextmanager
def serve(config: Path, listen_port: int, log: Path) -> Iterator[str]:
    """`specdec serve --config` until the with-block ends; yields its /metrics URL."""
    cmd = specdec("serve", "--config", str(config), "--listen", f"127.0.0.1:{listen_port}")
    with log.open("ab") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{listen_port}/metrics"
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"specdec serve exited: {log.read_text()[-2000:]}")
            try:
                get(url)
                break
            except (urllib.error.URLError, OSError):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"specdec serve not up: {log.read_text()[-2000:]}") from None
                time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()


def parse(page: str) -> Samples:
    found: Samples = {}
    for family in text_string_to_metric_families(page):
        for s in family.samples:
            found.setdefault(s.name, []).append((dict(s.labels), s.value))
    return found


def one(samples: Samples, name: str, **labels: str) -> float | None:
    hits = [v for lb, v in samples.get(name, []) if all(lb.get(k) == v for k, v in labels.items())]
    return hits[0] if hits else None


def summed(samples: Samples, name: str, **labels: str) -> float:
    return sum(
        v for lb, v in samples.get(name, []) if all(lb.get(k) == w for k, w in labels.items())
    )


def increase(after: Samples, before: Samples, name: str, **labels: str) -> float:
    """A counter's increase between two sidecar pages, its matching series summed."""
    return summed(after, name, **labels) - summed(before, name, **labels)


@dataclass
class Reading:
    """What the sidecar said of a route over one speculative phase (its window)."""

    estimated: float | None
    measured: float | None
    acceptance: float | None
    tokens_per_step: float | None  # per verify step (its mean acceptance length)
    by_draft_length: dict[int, float] = field(default_factory=dict)
    halfwidths: dict[int, float] = field(default_factory=dict)
    best_draft_length: int | None = None
    batch: float | None = None  # the engine's mean batch over the phase (its counters)


def reading(before: str, after: str, route: str, window: str) -> Reading:
    """A route's figures over `window` from the page at the phase's end, and the engine's
    batch over the phase from the two pages' counters (b dt / dt)."""
    a, b = parse(after), parse(before)
    key = {"route": route, "window": window}
    lengths = {int(lb["draft_length"]): v for lb, v in a.get(
        "specdec_route_speedup_at_draft_length_ratio", []) if _match(lb, key)}  # fmt: skip
    halves = {int(lb["draft_length"]): v for lb, v in a.get(
        "specdec_route_speedup_at_draft_length_ci_halfwidth", []) if _match(lb, key)}  # fmt: skip
    best = one(a, "specdec_route_best_draft_length", **key)
    return Reading(
        one(a, "specdec_route_estimated_speedup_ratio", **key),
        one(a, "specdec_route_speedup_ratio", **key),
        one(a, "specdec_route_acceptance_ratio", **key),
        one(a, "specdec_route_mean_acceptance_length", **key),
        lengths,
        halves,
        None if best is None else int(best),
        batch(a, b),
    )


def batch(after: Samples, before: Samples) -> float | None:
    """The engine's mean batch between two sidecar pages, as its running requests saw it: the
    request-weighted mean (batch seconds / request seconds); None where nothing ran."""
    request_s = increase(after, before, "specdec_engine_running_request_seconds_total")
    batch_s = increase(after, before, "specdec_engine_running_request_batch_seconds_total")
    return batch_s / request_s if request_s > 0 else None


def _match(labels: dict[str, str], want: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in want.items())


def advise(sidecar_metrics: str, window: str) -> dict[str, Any]:
    """`specdec advise --json` on the sidecar (its error, when it gives none)."""
    base = sidecar_metrics.removesuffix("/metrics")
    out = subprocess.run(specdec("advise", "--sidecar", base, "--window", window, "--json"),
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    if out.returncode:
        return {"error": out.stderr.strip()}
    return dict(json.loads(out.stdout))
