"""The step-time curve: seconds per decode step, speculative and plain, against the batch.

At each concurrency level the scenarios are replayed together, their requests interleaved
(at least 3 x the level's requests, shared by the scenarios' weights: `level_runs`): the mix
the routes share the engine in, which a step's seconds depend on beyond the batch (new
requests' prefills land in the decode steps, and longer contexts cost more per step), so a
level measured one scenario at a time does not hold the step the routes see together. Against
the speculative endpoint, then the plain one (the same model without speculation), so the two
see the same load. What a level's phases read (the steady span, seconds per step, the
pooled replicates) is `measure.level`'s; here they run.
The engine's running requests (its batch gauge, `Engine.running_gauge`) are sampled from its
/metrics until the first worker finds nothing left (the steady span's end).

Where the engine takes a draft length per request (`LoadHooks.draft_length_fields`:
llama.cpp), phases at one draft a step and at k - 1 give the verify step's seconds there
(`Level.draft_seconds`): a step's cost is neither linear in k from a plain step (a draft model
costs a fixed part of a plain step whatever k) nor in k (the first drafts cost more than the
later ones), so the options by draft length need the points at both ends: 1 for the drafter's
fixed cost, k - 1 for the slope past k.

Replicates: a level's speculative and plain phases run `replicates` times, spec and plain
alternated, round-robin over the levels (every level once, then every level again), so a
level's replicates are a round, minutes, apart and a slow mode of the engine that lasts a while
hits one of them rather than all; once more where no two of a side's figures agree within
AGREE. On a real engine a single phase can read 20 % off the others of the same start at the
same batch and context, which the steady span's own spread does not see; a level's figure is
its fastest replicates (`measure.steps`: a disturbance only adds time).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from functools import partial

import aiohttp

from exporter.engines.base import LoadHooks
from exporter.measure.forecast import FEWER, LONGER, PLAIN, SPEC, Forecast, Planned, curve_plan
from exporter.measure.level import Level, Phase
from exporter.measure.runner import (
    MeasureError,
    Plan,
    ScenarioResult,
    client_session,
    draft_length,
    engine_page,
    interleaved,
    model_name,
    replay,
    shown,
)
from exporter.measure.scenarios import Scenario
from exporter.scrape.exposition import scan

SAMPLE_EVERY = 0.25  # seconds between two reads of the running-requests gauge
LEVEL_ROUNDS = 3  # each scenario sends at least this many times the level's concurrency
REPLICATES = 2  # each level's speculative and plain phases, by default


def running_requests(page: str, gauge: str) -> float | None:
    """The mean over the page's engines of the engine's batch gauge (None: absent)."""
    values = [s.value for s in scan(page, (gauge,)).samples if s.name == gauge]
    return sum(values) / len(values) if values else None


async def _sample(
    session: aiohttp.ClientSession,
    metrics_url: str,
    gauge: str,
    into: list[tuple[float, float]],
    until: asyncio.Event,
) -> None:
    while not until.is_set():
        with contextlib.suppress(MeasureError):
            value = running_requests(await engine_page(session, metrics_url), gauge)
            if value is not None:
                into.append((time.perf_counter(), value))
        await asyncio.sleep(SAMPLE_EVERY)


async def _phase(
    session: aiohttp.ClientSession,
    base_url: str,
    model: str,
    scenarios: list[Scenario],
    runs: list[int],
    plan: Plan,
    phase: Phase,
    label: str,
) -> None:
    """The scenarios together against one endpoint, its batch sampled while they run; its
    progress lines named by `label` (the level and side)."""
    plan = replace(plan, label=label)
    metrics_url = f"{base_url}/metrics"
    results = {s.name: ScenarioResult(s.name) for s in scenarios}
    phase.results.extend(results.values())
    items = interleaved(scenarios, runs)
    gauge = plan.engine.running_gauge
    phase.workers = plan.concurrency
    drained = asyncio.Event()

    def on_drain() -> None:
        phase.dry_at = time.perf_counter()
        drained.set()

    sampler = None
    if gauge is not None:  # TensorRT-LLM has none: the level has no batch to plot against
        sampler = asyncio.create_task(_sample(session, metrics_url, gauge, phase.running, drained))
    try:
        phase.counted = await replay(
            session, base_url, metrics_url, model, items, plan, results, on_drain
        )
    finally:
        if sampler is not None:
            sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampler


async def _shorter_drafts(
    level: Level, scenarios: list[Scenario], engine: LoadHooks, run: Callable[..., Awaitable[None]]
) -> bool:
    """Phases at 1 and k - 1 drafts a step (k: what the level's speculative phase drafted),
    each `run(scenarios, phase=...)` against the speculative endpoint; False where the engine
    takes no draft length per request or drafted more than asked (a build that ignores the
    field: asking again at the next level would only cost time)."""
    k = (None if level.spec.counted is None else draft_length(level.spec.counted)) or 0
    for length in sorted({1, k - 1} & set(range(1, k))):  # k = 1: none, k = 2: just 1
        fields = engine.draft_length_fields(length)
        if fields is None:
            return False
        extra = tuple(fields.items())
        shorter = [replace(s, extra_body=(*s.extra_body, *extra)) for s in scenarios]
        level.drafting[length] = phase = Phase()
        await run(
            shorter, phase=phase, label=f"c={level.concurrency} speculative, {length} draft(s)"
        )
        if length not in level.draft_seconds():
            return False
    return True


def phase_requests(scenarios: list[Scenario], runs: list[int]) -> int:
    """The requests of a phase that sends each scenario's prompts `runs` times."""
    return sum(r * len(s.prompts) for s, r in zip(scenarios, runs, strict=True))


def level_runs(scenarios: list[Scenario], concurrency: int, runs: int) -> list[int]:
    """How many times each scenario's prompts are sent at a level: enough requests that the
    batch stays near it (>= LEVEL_ROUNDS x the concurrency in all), shared by the scenarios'
    weights, and at least `runs` each. The weights set the mix a running batch holds: with
    workers taking the next request as one ends, a scenario's share of the batch is its
    requests x their length (equal numbers of 80- and 200-token requests hold 71 % of the
    batch in the longer ones; the GPU bench's A/B holds half, a client per route each)."""
    weights = sum(s.weight for s in scenarios)
    return [
        max(runs, -(-math.ceil(LEVEL_ROUNDS * concurrency * s.weight / weights) // len(s.prompts)))
        for s in scenarios
    ]


async def measure_curve(
    spec_url: str,
    plain_url: str,
    scenarios: list[Scenario],
    model: str | None,
    levels: list[int],
    plan: Plan,
    into: list[Level],
    longer: int = 0,
    replicates: int = REPLICATES,
) -> None:
    """Every level in turn, the scenarios together (the mix the routes share the engine in)
    against spec, spec at 1 and k - 1 drafts a step where the engine takes a draft length per
    request, then plain; then, where `longer` > 0, spec and plain again with every request
    `longer` tokens of context more (`Scenario.lengthened`): a step's cost per token of
    context, which the sidecar reads the curve at the live context with. Then the other
    `replicates` - 1 rounds of spec and plain over every level, and one more for a level where
    a side's do not agree (`Level.agrees`). Appends to `into`. Says its plan first and the
    time left after each phase (`forecast.Forecast`, through `plan.note`)."""
    requests = {c: phase_requests(scenarios, level_runs(scenarios, c, plan.runs)) for c in levels}
    fewer = plan.engine.draft_length_fields(1) is not None
    forecast = Forecast(curve_plan(requests, replicates, longer > 0, fewer), plan.note)
    forecast.maybe = 2 * len(requests) if replicates > 1 else 0
    async with client_session(plan.engine) as client:
        spec_model = model or await model_name(client, spec_url)
        plain_model = await model_name(client, plain_url)
        plan.note(forecast.describe(shown(spec_url), shown(plain_url), replicates, longer))

        async def run(
            spec: bool,
            scenarios: list[Scenario],
            runs: list[int],
            at: Plan,
            phase: Phase,
            label: str,
            kind: str,
        ) -> None:
            """One phase against the speculative or the plain endpoint, timed for the forecast."""
            url, name = (spec_url, spec_model) if spec else (plain_url, plain_model)
            planned = Planned(at.concurrency, kind, phase_requests(scenarios, runs))
            started, ended = time.monotonic(), 0

            def progress(scenario: str, done: int, todo: int) -> None:
                nonlocal ended
                ended += 1
                at.progress(scenario, done, todo)
                forecast.during(planned, ended, time.monotonic() - started)

            timed = replace(at, progress=progress)
            await _phase(client, url, name, scenarios, runs, timed, phase, label)
            forecast.done(planned, time.monotonic() - started, f"{label} on {shown(url)}")

        honoured = True  # the engine drafts what a request asks (until a phase says otherwise)
        measured: list[tuple[Level, list[int], Plan]] = []
        for concurrency in levels:
            level = Level(concurrency)
            into.append(level)
            runs = level_runs(scenarios, concurrency, plan.runs)
            at = replace(plan, concurrency=concurrency)
            measured.append((level, runs, at))
            side = f"c={concurrency} {SPEC}"
            await run(True, scenarios, runs, at, level.spec, side, SPEC)
            if honoured:
                spec = partial(run, True, runs=runs, at=at, kind=FEWER)
                honoured = await _shorter_drafts(level, scenarios, plan.engine, spec)
            forecast.drop_fewer_drafts(concurrency, every=not honoured)
            side = f"c={concurrency} {PLAIN}"
            await run(False, scenarios, runs, at, level.plain, side, PLAIN)
            if longer > 0:
                lengthened = [s.lengthened(longer) for s in scenarios]
                level.longer = (Phase(), Phase())
                for is_spec, phase, kind in zip(
                    (True, False), level.longer, (SPEC, PLAIN), strict=True
                ):
                    label = f"c={concurrency} {kind}{LONGER}"
                    await run(is_spec, lengthened, runs, at, phase, label, kind + LONGER)

        async def again(level: Level, runs: list[int], at: Plan) -> None:
            """One more replicate of a level: spec, then plain."""
            n = len(level.again) + 2
            level.again.append(pair := (Phase(), Phase()))
            for is_spec, phase, kind in zip((True, False), pair, (SPEC, PLAIN), strict=True):
                label = f"c={level.concurrency} {kind}, replicate {n}"
                await run(is_spec, scenarios, runs, at, phase, label, kind)

        # the other replicates round-robin over the levels: a level's replicates a round apart
        for _ in range(replicates - 1):
            for level, runs, at in measured:
                await again(level, runs, at)
        if replicates > 1:  # one more round for the levels where no two of a side's agree
            apart = [(level, runs, at) for level, runs, at in measured if not level.agrees()]
            n = {level.concurrency: requests[level.concurrency] for level, _, _ in apart}
            forecast.settle(Planned(c, kind, r) for c, r in n.items() for kind in (SPEC, PLAIN))
            for level, runs, at in apart:
                await again(level, runs, at)
