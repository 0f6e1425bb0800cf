"""`specdec demo`: the whole bundle on a laptop, in one process.

Starts the vLLM simulator, the sidecar scraping it with its route-tagging proxy in front, and
traffic from two workloads sharing the engine through the proxy (Japanese voice chat tagged by
a header, an English coding agent by a path prefix); prints the URLs, then every few seconds
one line per route (the proxy's exact per-request accounting) and one for the engine (the
sidecar's rolling window over vLLM's counters). `--with-prometheus` also runs Debian's
prometheus on the repo's prometheus.yml. `--schedule` runs a dynamic speculative decoding
schedule (as `specdec advise` prints it) on the simulator and in the sidecar's config, and adds
a line: the schedule's range the engine's batch is in, the k it gives, and each workload's
drafts per step since the last line (advise -> apply -> verify). `--scenario drop`: after a
quiet start, the coding agent's clients move to a sampled temperature (its traffic changes: a
mix drop along temperature) while the engine accepts less of the voice chat's drafts (a within
drop), so the Payoff board's "Why acceptance moved" row and SpecDecodeAcceptanceDrop's labels
tell the two apart. Ctrl-C stops everything.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from dataclasses import dataclass, replace
from typing import TypeVar

import aiohttp
from aiohttp import web

from exporter.accounting.snapshot import WindowReading
from exporter.config import (
    DEFAULT_KIND,
    Config,
    ModelConfig,
    ProxyConfig,
    Route,
    StepTimePoint,
    Target,
)
from exporter.core.payoff import Speedups, StepCurve
from exporter.core.reading import read_route
from exporter.core.schedule import Schedule
from exporter.core.stats import LOW_CONFIDENCE_REQUESTS
from exporter.core.windows import DEFAULT_WINDOWS
from exporter.demo_history import RouteDay, history
from exporter.demo_prometheus import log_path, prometheus_child
from exporter.measure.scenarios import Scenario, builtin
from exporter.measure.stream_client import RequestFailed, stream_chat
from exporter.measure.workload import AGENT, VOICE, Workload
from exporter.process import graceful, run_until_stopped
from exporter.sidecar import Sidecar
from exporter.sim.decoder import SimEngine, sampled_share
from exporter.sim.profiles import Profile
from exporter.sim.server import build_app
from exporter.sim.steptime import MODEL as STEP_TIME
from exporter.sim.steptime import SINGLE_STREAM_STEP_SECONDS as STEP

MODEL = "sim-27b"
DRAFT_LENGTH = 3  # the simulator's k
CURVE_BATCHES = (1, 2, 4, 8, 16, 32, 64)  # to the dashboards' last "speedup at batch" column
CONTEXT = 160  # tokens a decoding request of the demo's two workloads holds, time-weighted
V = TypeVar("V")
AGREE = 0.05  # the two speedups agree within this share
ENGINE_JOB = DEFAULT_KIND  # the simulated engine's Prometheus job, as prometheus.yml names it
# --scenario drop: the agent's clients sample at 0.9 (the simulator keeps 0.64 of a request's
# acceptance: 71 % -> 45 %, its traffic's change) and the engine accepts 0.20 of the voice
# chat's drafts (was 0.36: the engine's change); both fall by more than the drop alert's 30 %.
# With Prometheus, whose TSDB holds a backfilled quiet day (demo_history.py), the drop comes
# after two quiet minutes (the 1-day group's first evaluations, every minute); without, the
# sidecar's split needs its own baseline before a 10-minute window: eleven minutes
DROP_AFTER = 660.0
DROP_AFTER_BACKFILLED = 120.0
DROP_TEMPERATURE = 0.9
DROP_ACCEPTANCE = 0.20
VOICE_PROFILE = "ja_chat"  # the simulator's profile for the voice chat's Japanese prompts


@dataclass
class Options:
    host: str = "127.0.0.1"
    sim_port: int = 8000
    sidecar_port: int = 10419
    proxy_port: int = 8001
    speed: float = 1.0
    concurrency: int = 2
    report_every: float = 5.0
    duration: float | None = None
    with_prometheus: bool = False
    prometheus_port: int = 9090
    schedule: Schedule | None = None
    scenario: str = "steady"  # or "drop"
    drop_after: float | None = None  # seconds of real time before the drop (None: as above)

    def drop_delay(self) -> float:
        if self.drop_after is not None:
            return self.drop_after
        return DROP_AFTER_BACKFILLED if self.with_prometheus else DROP_AFTER


# the two routes at a laptop's lengths (each request its route's mean), the agent routed by
# path prefix to show the other kind of rule
WORKLOADS = (
    replace(VOICE, mean_tokens=160, spread=0),
    replace(AGENT, mean_tokens=400, header=None, path_prefix="/agent", spread=0),
)
# the quiet day backfilled for --scenario drop: what the demo's requests accept counted by
# token (a request that accepts less runs more steps, so drafts more, and weighs more: 0.33 and
# 0.675 measured on the demo over 8 minutes, below the profiles' 0.36 and 0.71, which a live
# window would read as a drop), at a day's rates
QUIET_DAY = (
    RouteDay(VOICE.name, 0.33, 8, 300, WORKLOADS[0].mean_tokens),
    RouteDay(AGENT.name, 0.675, 4, 1000, WORKLOADS[1].mean_tokens),
)


def config(opts: Options) -> Config:
    """The sidecar config the demo runs: one target, the proxy with two routes, the model."""
    base = f"http://{opts.host}"
    routes = tuple(
        Route(w.name, headers=tuple((k.lower(), v) for k, v in w.headers.items()),
              path_prefix=w.path_prefix)
        for w in WORKLOADS
    )  # fmt: skip
    # the step-time curve `specdec measure --concurrency` finds on the simulator (in real
    # time), at the demo's contexts, and what a step gains per token more of it
    curve = tuple(
        StepTimePoint(
            b,
            STEP_TIME.plain(b, b * CONTEXT) / opts.speed,
            STEP_TIME.verify(b, DRAFT_LENGTH, b * CONTEXT) / opts.speed,
            context_tokens=CONTEXT,
            plain_seconds_per_context_token=b * STEP_TIME.kv_per_token * STEP / opts.speed,
            verify_seconds_per_context_token=b * STEP_TIME.kv_per_token * STEP / opts.speed,
        )
        for b in CURVE_BATCHES
    )
    step_cost = STEP_TIME.verify(1, DRAFT_LENGTH) / STEP_TIME.plain(1)
    return Config(
        listen=(opts.host, opts.sidecar_port),
        targets=(Target("sim", f"{base}:{opts.sim_port}/metrics"),),
        windows=DEFAULT_WINDOWS,
        proxy=ProxyConfig(f"{base}:{opts.sim_port}", (opts.host, opts.proxy_port), "sim", routes),
        # the published dense-27B figures: ~20 GB read per token, 1.7 TB/s -> ~85 tok/s ceiling
        models=(
            ModelConfig(
                MODEL,
                DRAFT_LENGTH,
                step_cost,
                1 / STEP_TIME.plain(1),
                20e9,
                1.7e12,
                curve,
                opts.schedule,
            ),
        ),
    )


async def _traffic(
    session: aiohttp.ClientSession,
    base: str,
    load: Workload,
    scenario: Scenario,
    offset: int,
    failures: list[int],
    stop: asyncio.Event,
    temperatures: dict[str, float],
) -> None:
    """One client of `load`, request after request; `temperatures`: the workload's sampling
    temperature from the next request on, where set (else none is sent: the engine's default)."""
    for i in itertools.count(offset):
        if stop.is_set():
            return
        body: dict[str, object] = {
            "model": MODEL,
            "messages": scenario.messages(i),
            "max_tokens": load.tokens(i),
        }
        if load.name in temperatures:
            body["temperature"] = temperatures[load.name]
        try:
            await stream_chat(session, base + load.path, body, headers=load.headers)
        except (RequestFailed, aiohttp.ClientError):
            failures[0] += 1
            await asyncio.sleep(1.0)


def route_line(
    seen: WindowReading, route: str, curve: StepCurve | None, running: float | None = None
) -> str:
    """The route over the last window, or the part of it the sidecar has seen (a snapshot of
    the proxy's accounting read partial, each route read as the collectors read it:
    `core.reading.read_route`): the exact acceptance with its 95 % interval when the window
    holds enough requests (marked below LOW_CONFIDENCE_REQUESTS), else the estimate, said so;
    tokens per step, decode rate, the speedup at the engine's mean batch `running` (the
    sidecar's estimate; the measured one beside it only when the two differ by more than 5 %,
    with why), requests."""
    span = _span(seen.covered)
    route_window = seen.routes.get((route, MODEL))
    reading = None if route_window is None else read_route(route_window, curve, own_positions=True)
    if route_window is None or reading is None or reading.acceptance is None:
        return f"{route:<13} no completed requests in the last {span}"
    moments, interval = route_window.moments, reading.interval
    if interval is not None:
        figure = f"{100 * interval.estimate:5.1f}% ±{100 * interval.halfwidth:4.1f}"
    elif moments.requests:
        figure = f"{100 * moments.accepted / moments.draft_tokens:5.1f}%      "
    else:
        figure = f"{100 * reading.acceptance:5.1f}% (est.)"
    decoded = route_window.decoded
    rate = f"{decoded.rate:6.1f}" if decoded.rate else "     -"
    note = "" if moments.requests >= LOW_CONFIDENCE_REQUESTS else "  (low confidence)"
    return (
        f"{route:<13} acceptance {figure} over {span} (proxy)  tokens/step "
        f"{reading.tokens_per_step or 0:.2f}  decode {rate} tok/s"
        f"{_speedup(reading.payoff, running)}  requests {moments.requests:.0f}{note}"
    )


def _speedup(payoff: Speedups, running: float | None) -> str:
    """`  speedup x1.15 at batch 4.0`, and the measured figure when it disagrees."""
    if payoff.estimated is None or running is None:
        return ""
    text = f"  speedup x{payoff.estimated:.2f} at batch {running:.1f}"
    measured = payoff.measured
    if measured is not None and abs(measured / payoff.estimated - 1) > AGREE:
        text += f" (decode rate says x{measured:.2f}: max_tokens cuts or few streamed requests)"
    return text


def _span(seconds: float) -> str:
    """A window's label, or the seconds of it seen so far ("23s")."""
    whole = round(seconds)
    return f"{whole // 60}m" if whole % 60 == 0 and whole else f"{whole}s"


Steps = dict[tuple[str, str, str], int]  # (route, model, draft length) -> decode steps


def schedule_line(schedule: Schedule, running: float | None, steps: Steps, before: Steps) -> str:
    """The schedule's range at the engine's mean batch and its k, and each workload's drafts
    per decode step since the last line (`specdec_route_steps_total`'s increase, plain steps
    counted as 0): equal where the schedule is in effect."""
    if running is None:
        return f"{'schedule':<13} no batch seen yet"
    start, end, k = schedule.range_at(running)
    parts = []
    for load in WORKLOADS:
        made = {
            int(length): n - before.get((route, model, length), 0)
            for (route, model, length), n in steps.items()
            if route == load.name
        }
        count = sum(made.values())
        drafts = sum(length * n for length, n in made.items()) / count if count else None
        parts.append(f"{load.name} " + ("-" if drafts is None else f"{drafts:.2f}"))
    return (
        f"{'schedule':<13} batch {running:.1f} in range {start}-{end}: k = {k}; drafts per step "
        f"since the last line: {', '.join(parts)}"
    )


def engine_line(acceptance: float | None, tokens_per_step: float | None, covered: float) -> str:
    """The engine over the last window (the part of it the sidecar has seen: `covered`
    seconds), as the target's snapshot reads it (`scrape.figures`: every series summed)."""
    span = _span(covered)
    if acceptance is None or tokens_per_step is None:
        return f"{'engine':<13} no drafts in the last {span} yet"
    return (
        f"{'engine':<13} acceptance {100 * acceptance:5.1f}%       over {span} "
        f"(vLLM)   tokens/step {tokens_per_step:.2f}"
    )


def drop(engine: SimEngine, temperatures: dict[str, float]) -> str:
    """The drop scenario's change, and its line: the agent's clients sample (their traffic
    moves between temperature bands), the engine accepts less of the voice chat's drafts (its
    requests unchanged)."""
    agent, voice = AGENT.name, VOICE.name
    temperatures[agent] = DROP_TEMPERATURE
    before = engine.profiles[VOICE_PROFILE]
    engine.profiles[before.name] = Profile(
        before.name, DROP_ACCEPTANCE, before.decay, before.concentration, before.loop_share
    )
    kept = sampled_share(DROP_TEMPERATURE)
    return (
        f"drop: {agent}'s clients now sample at temperature {DROP_TEMPERATURE:g} (traffic: its "
        f"requests keep {kept:.0%} of their acceptance); the engine now accepts "
        f"{DROP_ACCEPTANCE:.0%} of {voice}'s drafts (was {before.acceptance:.0%}: the engine)"
    )


async def run(opts: Options) -> None:
    engine = SimEngine(MODEL, speed=opts.speed, schedule=opts.schedule)
    # a schedule mixes draft lengths within a request: only vLLM's `detailed` level splits them
    level = "summary" if opts.schedule is None else "detailed"
    runner = web.AppRunner(build_app(engine, level), access_log=None)
    await runner.setup()
    sidecar = Sidecar(config(opts))
    task = asyncio.current_task()
    assert task is not None
    try:
        await web.TCPSite(runner, opts.host, opts.sim_port).start()
        await sidecar.start()
        scraped = {"specdec": opts.sidecar_port, ENGINE_JOB: opts.sim_port}
        day = history(time.time(), MODEL, QUIET_DAY) if opts.scenario == "drop" else None
        prometheus = (
            prometheus_child(opts.host, opts.prometheus_port, scraped, history=day)
            if opts.with_prometheus
            else contextlib.nullcontext(None)
        )
        async with prometheus as url:
            await _report(opts, sidecar, url, graceful(task), engine)
    finally:
        await sidecar.stop()
        await runner.cleanup()


async def _report(
    opts: Options,
    sidecar: Sidecar,
    prometheus: str | None,
    stop: asyncio.Event,
    engine: SimEngine,
) -> None:
    """Print the lines until `duration` or a stop signal; then the workloads start nothing
    new and the proxy drains (their requests in flight complete), as `serve` does. The drop
    scenario's change comes `drop_after` seconds in."""
    base = f"http://{opts.host}"
    print(f"simulated vLLM   {base}:{opts.sim_port}/v1  (metrics: {base}:{opts.sim_port}/metrics)")
    print(
        f"specdec proxy    {base}:{opts.proxy_port}/v1  (voice: header X-Route: voice; "
        f"agent: {base}:{opts.proxy_port}/agent/v1)"
    )
    print(f"specdec sidecar  {base}:{opts.sidecar_port}/metrics")
    if prometheus:
        print(f"prometheus       {prometheus}  (log: {log_path(opts.prometheus_port)})")
    print(
        "traffic: Japanese voice chat and an English coding agent on one engine; Ctrl-C stops",
        flush=True,
    )
    if opts.scenario == "drop":
        print(drop_plan(opts.drop_delay(), prometheus is not None), flush=True)
    failures = [0]
    proxy = f"{base}:{opts.proxy_port}"
    curve = sidecar.wiring.models[MODEL].curve
    temperatures: dict[str, float] = {}
    async with aiohttp.ClientSession() as session:
        tasks = [
            asyncio.create_task(
                _traffic(
                    session, proxy, load, builtin(load.scenario), worker, failures, stop,
                    temperatures,
                )
            )
            for load in WORKLOADS
            for worker in range(opts.concurrency)
        ]  # fmt: skip
        if opts.scenario == "drop":
            tasks.append(asyncio.create_task(_drop_later(opts.drop_delay(), engine, temperatures)))
        try:
            started = time.monotonic()
            seen: Steps = {}
            while opts.duration is None or time.monotonic() - started < opts.duration:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), opts.report_every)
                if stop.is_set():
                    break
                assert sidecar.proxy is not None
                now = time.monotonic()
                # one reading of the engine and one of the routes, partial, as a scrape's
                target = sidecar.targets[0].read(now, partial=True)
                acc = sidecar.proxy.accounting.read(now, target.running, partial=True)
                last = target.windows[0]
                running = last.running.get(MODEL)
                for load in WORKLOADS:
                    print(route_line(acc.windows[0], load.name, curve, running))
                if opts.schedule is not None:
                    steps = dict(acc.steps_by_length)
                    print(schedule_line(opts.schedule, running, steps, seen))
                    seen = steps
                work = last.work.total
                print(
                    engine_line(work.acceptance, work.mean_acceptance_length, last.covered)
                    + (f"  failed requests {failures[0]}" if failures[0] else ""),
                    flush=True,
                )
            stop.set()  # the workloads start nothing new
            await sidecar.drain()
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


def drop_plan(after: float, with_prometheus: bool) -> str:
    """What the drop scenario does, and when: printed at the start."""
    at, full = _clock(after), _clock(after + 600)
    where = (
        "SpecDecodeAcceptanceDrop fires a minute or two later for both, labelled cause=mix "
        "dimension=temperature and cause=within dimension=all, and the Payoff board's 'Why "
        f"acceptance moved' row names each (in full at {full}, its 10m window all drop); "
        "Prometheus holds a backfilled quiet day, the baseline both are judged against"
        if with_prometheus
        else "the sidecar's specdec_route_acceptance_change_ratio splits each (add "
        "--with-prometheus for the alert and the dashboards' row)"
    )
    return (
        f"scenario drop: at {at} {AGENT.name}'s clients move to temperature "
        f"{DROP_TEMPERATURE:g} (traffic) and the engine accepts less of {VOICE.name}'s drafts "
        f"(engine); {where}"
    )


def _clock(seconds: float) -> str:
    return f"{int(seconds // 60)}:{int(seconds % 60):02d}"


async def _drop_later(after: float, engine: SimEngine, temperatures: dict[str, float]) -> None:
    await asyncio.sleep(after)  # the scenario's clock, not a synchronisation
    print(drop(engine, temperatures), flush=True)


def main(opts: Options) -> None:
    """Until SIGINT, SIGTERM or SIGHUP: the proxy drains, then everything it started is
    stopped (exit 0); a second signal stops at once."""
    run_until_stopped(lambda: run(opts))
