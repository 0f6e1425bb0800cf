"""Replays scenarios one after another against an OpenAI-compatible endpoint.

Per request: TTFT and decode rate (completion tokens / seconds after the first token) from
the stream, and vLLM's per-request spec-decode object when it comes. Per scenario: acceptance
from the engine's /metrics delta around the scenario (the published method), restart-safe.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from exporter.core.counts import Counts, from_spec_object, ratios, total
from exporter.measure.scenarios import Scenario
from exporter.measure.stream_client import RequestFailed, Result, stream_chat
from exporter.scrape.derive import delta
from exporter.scrape.families import families


class MeasureError(Exception):
    """The endpoint cannot be measured (unreachable, refuses every request)."""


@dataclass
class ScenarioResult:
    name: str
    results: list[Result] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    engine: Counts | None = None  # /metrics delta; None without spec counters
    interrupted: bool = False  # stopped before the engine's counters were read again
    model: str = ""  # the model name the requests asked for

    @property
    def per_request(self) -> Counts | None:
        objects = [from_spec_object(r.spec) for r in self.results if r.spec is not None]
        return total(objects) if objects else None

    def row(self) -> dict[str, Any]:
        """The scenario as the `--json` document has it."""
        ttft = [r.ttft * 1000 for r in self.results if r.ttft is not None]
        rates = [x for r in self.results if (x := r.decode_tokens_per_second) is not None]
        e, p = self.engine, self.per_request
        return {
            "name": self.name,
            "requests": len(self.results),
            "ttft_ms_median": statistics.median(ttft) if ttft else None,
            "decode_tokens_per_second_median": statistics.median(rates) if rates else None,
            "drafts": None if e is None else e.drafts,
            "draft_tokens": None if e is None else e.draft_tokens,
            "accepted_tokens": None if e is None else e.accepted,
            "acceptance_rate": ratios(e).acceptance if e else None,
            "per_request_acceptance_rate": ratios(p).acceptance if p else None,
            "mean_acceptance_length": ratios(e).mean_acceptance_length if e else None,
            "interrupted": self.interrupted,
        }


Progress = Callable[[str, int, int], None]


def tty_progress(name: str, done: int, todo: int) -> None:
    """A progress bar on stderr, only on a terminal."""
    if sys.stderr.isatty():
        width = 30
        filled = width * done // max(todo, 1)
        end = "\n" if done == todo else ""
        print(
            f"\r{name:<14} [{'#' * filled}{'.' * (width - filled)}] {done}/{todo}",
            end=end,
            file=sys.stderr,
            flush=True,
        )


async def model_name(session: aiohttp.ClientSession, base_url: str) -> str:
    """The first served model, as `GET /v1/models` lists it."""
    try:
        async with session.get(f"{base_url}/v1/models") as resp:
            if resp.status != 200:
                raise MeasureError(f"{base_url}/v1/models answered HTTP {resp.status}")
            data = await resp.json()
    except aiohttp.ClientError as exc:
        raise MeasureError(f"cannot reach {base_url}: {exc}") from exc
    try:
        return str(data["data"][0]["id"])
    except (KeyError, IndexError, TypeError):
        raise MeasureError(f"{base_url}/v1/models lists no model; pass --model") from None


async def engine_page(session: aiohttp.ClientSession, metrics_url: str) -> str:
    try:
        async with session.get(metrics_url) as resp:
            if resp.status != 200:
                raise MeasureError(f"{metrics_url} answered HTTP {resp.status}")
            return await resp.text()
    except aiohttp.ClientError as exc:
        raise MeasureError(f"cannot reach {metrics_url}: {exc}") from exc


@dataclass(frozen=True)
class Plan:
    """How to replay: times each prompt is sent, requests in flight, sampling temperature."""

    runs: int = 1
    concurrency: int = 1
    temperature: float | None = None  # None: the server's default
    progress: Progress = tty_progress


async def run_scenario(
    session: aiohttp.ClientSession,
    base_url: str,
    metrics_url: str,
    model: str,
    scenario: Scenario,
    plan: Plan,
    result: ScenarioResult,
) -> None:
    """Fill `result` as requests complete (so an interrupted run still has what it got)."""
    result.model = model
    fams = families("vllm")
    before = await engine_page(session, metrics_url)
    todo = plan.runs * len(scenario.prompts)
    queue = list(range(todo))
    url = f"{base_url}/v1/chat/completions"

    async def worker() -> None:
        while queue:
            i = queue.pop(0)
            body = {
                "model": model,
                "messages": scenario.messages(i),
                "max_tokens": scenario.max_tokens,
            }
            try:
                result.results.append(await stream_chat(session, url, body))
            except (RequestFailed, aiohttp.ClientError) as exc:
                result.failures.append(str(exc))
            plan.progress(scenario.name, len(result.results) + len(result.failures), todo)

    await asyncio.gather(*(worker() for _ in range(plan.concurrency)))
    if not result.results:
        raise MeasureError(f"every request of {scenario.name} failed: {result.failures[0]}")
    after = await engine_page(session, metrics_url)
    found = delta(before, after, fams)
    if found.series and not found.after_empty:
        result.engine = total(list(found.series.values()))


async def measure(
    base_url: str,
    metrics_url: str,
    scenarios: list[Scenario],
    model: str | None,
    plan: Plan,
    into: list[ScenarioResult],
) -> None:
    """Run every scenario in turn, appending to `into` as it goes."""
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=600)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        name = model or await model_name(session, base_url)
        for scenario in scenarios:
            result = ScenarioResult(scenario.name)
            into.append(result)
            await run_scenario(session, base_url, metrics_url, name, scenario, plan, result)
