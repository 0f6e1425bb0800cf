"""Replays scenarios one after another against an OpenAI-compatible endpoint.

Per request: TTFT and decode rate (completion tokens / seconds after the first token) from
the stream, and the request's own counts where its engine sends them (`Engine.stream_counts`:
vLLM's per-request object, llama.cpp's timings, SGLang's details). Per scenario: acceptance
from the engine's /metrics delta around the scenario (the published method), restart-safe. The
engine is told (`--engine`) or recognised from its /metrics page, never assumed.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import aiohttp

from exporter.core.counts import Counts, ratios, total
from exporter.core.payoff import decode_steps
from exporter.engines import DEFAULT, recognise
from exporter.engines.base import Engine, LoadHooks
from exporter.measure.scenarios import Scenario
from exporter.measure.stream_client import RequestFailed, Result, stream_chat
from exporter.scrape.derive import delta


class MeasureError(Exception):
    """The endpoint cannot be measured (unreachable, refuses every request)."""


@dataclass(frozen=True, slots=True)
class Request:
    """One measured request and its own counts as its engine states them (None: not sent)."""

    result: Result
    counts: Counts | None
    prompt_tokens: int | None = None  # as its engine stated them

    def decode(self) -> tuple[float, float, float | None]:
        """(tokens after the first, their seconds, decode steps or None when not known)."""
        r, c = self.result, self.counts
        tokens = float(max(r.completion_tokens - 1, 0))
        if c is None or c.accepted is None:
            return tokens, r.decode_seconds, None
        return tokens, r.decode_seconds, decode_steps(tokens, c.accepted, c.drafts)


@dataclass
class ScenarioResult:
    name: str
    requests: list[Request] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    counted: Counts | None = None  # the engine's /metrics delta; None without spec counters
    interrupted: bool = False  # stopped before the engine's counters were read again
    model: str = ""  # the model name the requests asked for

    @property
    def per_request(self) -> Counts | None:
        own = [r.counts for r in self.requests if r.counts is not None]
        return total(own) if own else None

    def row(self) -> dict[str, Any]:
        """The scenario as the `--json` document has it."""
        results = [r.result for r in self.requests]
        ttft = [r.ttft * 1000 for r in results if r.ttft is not None]
        rates = [x for r in results if (x := r.decode_tokens_per_second) is not None]
        e, p = self.counted, self.per_request
        return {
            "name": self.name,
            "requests": len(results),
            "ttft_ms_median": statistics.median(ttft) if ttft else None,
            "decode_tokens_per_second_median": statistics.median(rates) if rates else None,
            "drafts": None if e is None else e.drafts,
            "draft_tokens": None if e is None else e.draft_tokens,
            "accepted_tokens": None if e is None else e.accepted,
            "draft_length": draft_length(e) if e else None,
            "acceptance_rate": ratios(e).acceptance if e else None,
            "per_request_acceptance_rate": ratios(p).acceptance if p else None,
            # every request's own draft tokens, where each sent them and none failed: against
            # the engine's delta, what tells whether other traffic shared the engine meanwhile
            "per_request_draft_tokens": p.draft_tokens
            if p and not self.failures and all(r.counts is not None for r in self.requests)
            else None,
            "mean_acceptance_length": ratios(e).mean_acceptance_length if e else None,
            "interrupted": self.interrupted,
        }


def prompt_tokens(engine: LoadHooks, result: Result) -> int | None:
    """A streamed request's prompt tokens from its events: the usage event's, else the
    engine's timings (llama.cpp's finish event)."""
    usage: dict[str, Any] = {}
    timings: Mapping[str, Any] = {}
    for event in result.events:
        if isinstance(event.get("usage"), dict):
            usage = event["usage"]
        found, _ = engine.timings(event, None)
        timings = found or timings
    return engine.prompt_tokens(usage, timings)


def draft_length(counts: Counts) -> int | None:
    """k from the engine's counters: its per-position series (one per position it drafts:
    vLLM's and llama.cpp's), else draft tokens per verify step rounded."""
    if counts.per_position:
        return len(counts.per_position)
    if counts.drafts and counts.draft_tokens is not None:
        return round(counts.draft_tokens / counts.drafts)
    return None


Progress = Callable[[str, int, int], None]


def stderr_note(line: str) -> None:
    """A line about the run as a whole (`measure --concurrency`'s plan, the time left)."""
    print(f"specdec measure: {line}", file=sys.stderr, flush=True)


def shown(url: str) -> str:
    """An endpoint as the progress lines name it: without a user:password it may carry."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[-1]))


def stderr_progress(name: str, done: int, todo: int) -> None:
    """A progress bar on a terminal; elsewhere (a log, a CI job) one line per finished run."""
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
    elif done == todo:
        print(f"specdec measure: {name}: {done} request(s) done", file=sys.stderr, flush=True)


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


async def detect(metrics_url: str) -> Engine | None:
    """The engine serving `metrics_url`, recognised from its page (None: no known engine's)."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        return recognise(await engine_page(session, metrics_url))


def client_session(engine: LoadHooks) -> aiohttp.ClientSession:
    """A client session for the engine: a connection is not reused after a stream where the
    engine closes it then (llama-server), or the next request would meet the close."""
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=600)
    connector = aiohttp.TCPConnector(force_close=not engine.keeps_chunked_connections)
    return aiohttp.ClientSession(timeout=timeout, connector=connector)


@dataclass(frozen=True)
class Plan:
    """How to replay: times each prompt is sent, requests in flight, sampling temperature, and
    the engine whose families and per-request figures are read."""

    runs: int = 1
    concurrency: int = 1
    temperature: float | None = None  # None: the server's default
    progress: Progress = stderr_progress
    engine: Engine = DEFAULT
    label: str = ""  # what progress names beside the scenario: measure --concurrency's phase
    note: Callable[[str], None] = stderr_note  # the run's plan and the time left


def interleaved(scenarios: list[Scenario], runs: list[int]) -> list[tuple[Scenario, int]]:
    """Each scenario's requests (`runs` times its prompts), each spread evenly over the whole
    sequence (in turn where their numbers are equal): sent by a pool of workers, the
    scenarios run together in the mix they are given from first to last, as routes sharing an
    engine do (in turn, a larger scenario's extra requests would all come last, alone)."""
    todo = [r * len(s.prompts) for s, r in zip(scenarios, runs, strict=True)]
    order = sorted(((i + 0.5) / n, j, i) for j, n in enumerate(todo) for i in range(n))
    return [(scenarios[j], i) for _, j, i in order]


async def replay(
    session: aiohttp.ClientSession,
    base_url: str,
    metrics_url: str,
    model: str,
    items: list[tuple[Scenario, int]],
    plan: Plan,
    results: dict[str, ScenarioResult],
    on_drain: Callable[[], None] | None = None,
) -> Counts | None:
    """Send `items` with `plan.concurrency` workers, each request's result into its scenario's
    (so an interrupted run still has what it got); the engine's /metrics delta around them
    (None without speculative-decoding counters). `on_drain` is called when a worker first
    finds nothing left to send: from then on the batch falls."""
    fams = plan.engine.families()
    before = await engine_page(session, metrics_url)
    queue = list(items)
    todo = {name: sum(1 for s, _ in items if s.name == name) for name in results}
    url = f"{base_url}/v1/chat/completions"
    flag = plan.engine.request_flag
    draining = False
    prefix, endpoint = f"{plan.label}: " if plan.label else "", shown(base_url)

    async def worker(index: int) -> None:
        nonlocal draining
        pinned = plan.engine.worker_fields(index)
        while queue:
            scenario, i = queue.pop(0)
            result = results[scenario.name]
            body: dict[str, Any] = {
                **dict(scenario.extra_body),
                "model": result.model,
                "messages": scenario.messages(i),
                "max_tokens": scenario.max_tokens,
                **pinned,
            }
            if plan.temperature is not None:
                body["temperature"] = plan.temperature
            if flag is not None:
                body[flag] = True
            try:
                r = await stream_chat(session, url, body)
                counts = plan.engine.stream_counts(r.events)
                result.requests.append(Request(r, counts, prompt_tokens(plan.engine, r)))
            except (RequestFailed, aiohttp.ClientError) as exc:
                result.failures.append(str(exc) or type(exc).__name__)
            done = len(result.requests) + len(result.failures)
            plan.progress(f"{prefix}{scenario.name} on {endpoint}", done, todo[scenario.name])
        if not draining and on_drain is not None:
            on_drain()
        draining = True

    for result in results.values():
        result.model = model
    await asyncio.gather(*(worker(w) for w in range(plan.concurrency)))
    for name, result in results.items():
        if not result.requests:
            raise MeasureError(f"every request of {name} failed: {result.failures[0]}")
    after = await engine_page(session, metrics_url)
    found = delta(before, after, fams)
    if found.series and not found.after_empty:
        return total(list(found.series.values()))
    return None


async def run_scenario(
    session: aiohttp.ClientSession,
    base_url: str,
    metrics_url: str,
    model: str,
    scenario: Scenario,
    plan: Plan,
    result: ScenarioResult,
) -> None:
    """One scenario alone; fills `result` as requests complete."""
    items = interleaved([scenario], [plan.runs])
    result.counted = await replay(
        session, base_url, metrics_url, model, items, plan, {scenario.name: result}
    )


async def measure(
    base_url: str,
    metrics_url: str,
    scenarios: list[Scenario],
    model: str | None,
    plan: Plan,
    into: list[ScenarioResult],
) -> None:
    """Run every scenario in turn, appending to `into` as it goes."""
    async with client_session(plan.engine) as client:
        name = model or await model_name(client, base_url)
        for scenario in scenarios:
            result = ScenarioResult(scenario.name)
            into.append(result)
            await run_scenario(client, base_url, metrics_url, name, scenario, plan, result)
