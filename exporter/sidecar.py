"""`specdec serve`: one asyncio process running the scrape loops, the sidecar's /metrics and,
when configured, the route-tagging proxy."""

from __future__ import annotations

import asyncio
import contextlib
import html
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector
from structlog.stdlib import BoundLogger

from exporter import __version__, logs
from exporter.accounting.ledger import Accounting
from exporter.config import Config, ConfigError, ModelConfig, redact
from exporter.core.faults import Faults
from exporter.engines import DEFAULT, engine
from exporter.engines.base import Engine
from exporter.export.guarded import Guarded
from exporter.export.lifecycle_collector import LifecycleCollector, ReloadStatus
from exporter.export.model_collector import ModelCollector
from exporter.export.proxy_collector import ProxyCollector
from exporter.export.request_collector import RequestCollector
from exporter.export.route_collector import RouteCollector
from exporter.export.target_collector import TargetCollector
from exporter.process import Runtime, graceful, return_freed_memory, run_until_stopped
from exporter.proxy.forward import Proxy
from exporter.proxy.settings import build as proxy_settings
from exporter.scrape.target import Clock, Scraper, TargetState

LANDING = """<!doctype html><html><head><title>specdec</title></head><body>
<h1>specdec {version}</h1><p>Live speculative-decoding payoff for vLLM.</p>
<ul><li><a href="metrics">/metrics</a></li><li><a href="-/healthy">/-/healthy</a></li>
<li><a href="-/ready">/-/ready</a></li></ul>
<h2>Targets</h2><ul>{targets}</ul>{proxy}</body></html>"""
TICK_SECONDS = 1.0
EXIT_CUT_SHORT = 1  # a second stop signal cut the drain short: requests were cut


class NeedsRestart(Exception):
    """A reloaded config changes what only a restart can (listen addresses, the proxy on or
    off): nothing of it is applied. `str()` lists what, one line each."""


class Sidecar:
    """Owns the targets' state, the proxy, their tasks and the registry served on /metrics;
    drains on a stop signal, applies a reloaded config."""

    def __init__(self, config: Config, clock: Clock = time.monotonic) -> None:
        self.clock = clock
        self.faults = Faults()
        self.reloads = ReloadStatus()
        self.runtime = Runtime.current()
        self.ready = False  # /-/ready: started and not draining
        self.proxy: Proxy | None = None
        if config.proxy is not None:
            models = {m.name: m for m in config.models}
            accounting = Accounting(
                config.proxy.route_names, config.windows, models, breakdown=config.breakdown
            )
            settings = proxy_settings(config.proxy, _proxied_engine(config))
            self.proxy = Proxy(settings, accounting, self.faults)
        self.wiring = self._wire(config, {})
        self._scrapers: dict[str, asyncio.Task[None]] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._runners: list[web.BaseRunner] = []
        self._session: aiohttp.ClientSession | None = None

    @property
    def config(self) -> Config:
        return self.wiring.config

    @property
    def targets(self) -> tuple[TargetState, ...]:
        return self.wiring.targets

    @property
    def fronted(self) -> TargetState | None:
        return self.wiring.fronted

    @property
    def registry(self) -> CollectorRegistry:
        return self.wiring.registry

    def _wire(self, config: Config, carried: dict[str, TargetState]) -> Wiring:
        """The objects `config` implies: each target's state (a kept one's carried over from
        `carried`), the models, the fronted target and a registry of collectors over them.
        Built beside the running ones; nothing running is touched."""
        # an engine page without model_name (llama.cpp) is the config's one model, if one
        only = config.models[0].name if len(config.models) == 1 else ""
        curves = {m.name: c for m in config.models if (c := m.curve) is not None}
        targets = tuple(
            TargetState(t, config.windows, only, curves)
            if t.name not in carried
            else carried[t.name].carried(t, config.windows, only, curves)
            for t in config.targets
        )
        models = {m.name: m for m in config.models}
        fronted = _fronted_target(config, targets)
        registry = CollectorRegistry()

        def register(collector: Collector) -> None:
            registry.register(Guarded(collector, self.faults))

        register(TargetCollector(targets, self.clock, models))
        register(ModelCollector(models))
        ProcessCollector(namespace="specdec", registry=registry)
        registry.register(LifecycleCollector(self.reloads, self.faults, self.runtime))
        if self.proxy is not None:
            accounting = self.proxy.accounting
            proxied = _proxied_engine(config)
            register(RouteCollector(accounting, models, fronted, proxied, self.clock))
            register(ProxyCollector(self.proxy))
            register(RequestCollector(accounting, self.clock))
        return Wiring(config, targets, models, fronted, registry)

    async def start(self) -> None:
        """Start scraping, serve /metrics and (if configured) the proxy. The proxy's address is
        taken first and accepted on last: one another process holds fails before /metrics
        answers (a readiness check sees nothing come up), and no client is accepted by a
        proxy whose /metrics then fails to bind."""
        if self.proxy is not None:
            self.proxy.bind()
        self._session = aiohttp.ClientSession(headers={"User-Agent": f"specdec/{__version__}"})
        for state in self.targets:
            self._scrape(state)
        await self._serve(web.AppRunner(self._metrics_app(), access_log=None), self.config.listen)
        if self.proxy is not None and self.config.proxy is not None:
            await self.proxy.start()
            self._tasks.append(asyncio.create_task(self._tick(), name="accounting"))
        self.ready = True

    async def drain(self) -> None:
        """A stop signal: /-/ready says 503 first, then the proxy stops accepting and lets the
        requests in flight complete, up to proxy.drain_timeout; /metrics serves on."""
        self.ready = False
        if self.proxy is not None and self.config.proxy is not None:
            await self.proxy.drain(self.config.proxy.drain_timeout)

    async def stop(self) -> None:
        self.ready = False
        tasks = [*self._scrapers.values(), *self._tasks]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for runner in reversed(self._runners):
            await runner.cleanup()
        if self._session is not None:
            await self._session.close()
        if self.proxy is not None:
            await self.proxy.stop()

    def apply(self, new: Config) -> None:
        """A reloaded config, the blackbox way: the objects it implies are built beside the
        running ones (`_wire`), then swapped whole, with no await between (no scrape, request
        or /metrics sees half of it). Targets are matched by name: a kept one carries its
        running totals and history over, a new one starts, a removed one stops. Windows change
        over the same history: a kept one keeps its figures, a longer new one appears once the
        history covers it. Routes, models and the proxy's limits and timeouts apply to new
        requests. NeedsRestart, and nothing applied, for what only a restart can change; an
        error while building leaves the running objects as they were."""
        old = self.config
        needs = []
        if new.listen != old.listen:
            needs.append(f"listen: {_address(old.listen)} -> {_address(new.listen)}")
        if (new.proxy is None) != (old.proxy is None):
            needs.append("proxy: a proxy section added or removed")
        elif (
            new.proxy is not None and old.proxy is not None and new.proxy.listen != old.proxy.listen
        ):
            needs.append(
                f"proxy.listen: {_address(old.proxy.listen)} -> {_address(new.proxy.listen)}"
            )
        if needs:
            raise NeedsRestart("\n".join(f"{n} needs a restart" for n in needs))
        wiring = self._wire(new, {state.target.name: state for state in self.targets})
        settings = None
        if self.proxy is not None and new.proxy is not None:  # built beside the running one
            settings = proxy_settings(new.proxy, _proxied_engine(new), self.proxy.settings)
        # the swap: no await from here, so no scrape, request or /metrics sees half of it
        for task in self._scrapers.values():
            task.cancel()  # each loop goes on with its carried state, from a scrape now
        self._scrapers.clear()
        self.wiring = wiring
        for state in wiring.targets:
            self._scrape(state)
        if self.proxy is not None and new.proxy is not None and settings is not None:
            # the accounting is history (carried); the rest is one pointer, which requests in
            # flight hold their own of
            self.proxy.accounting.reconfigure(
                new.proxy.route_names, new.windows, wiring.models, new.breakdown
            )
            self.proxy.swap(settings)

    def _scrape(self, state: TargetState) -> None:
        """(Re)start the scrape loop of `state`."""
        assert self._session is not None
        name = state.target.name
        if name in self._scrapers:
            self._scrapers[name].cancel()
        scraper = Scraper(state, self._session, self.clock)
        self._scrapers[name] = asyncio.create_task(scraper.run(), name=name)

    async def _serve(self, runner: web.BaseRunner, listen: tuple[str, int]) -> None:
        await runner.setup()
        await web.TCPSite(runner, listen[0], listen[1]).start()
        self._runners.append(runner)

    async def _tick(self) -> None:
        """Each second: apportion unexplained engine work to estimated routes, snapshot routes."""
        assert self.proxy is not None
        accounting = self.proxy.accounting
        while True:
            if self.fronted is not None:
                accounting.apportion(self.fronted.work_by_model())
            accounting.tick(self.clock())
            await asyncio.sleep(TICK_SECONDS)

    def _metrics_app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/", self._landing)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/-/healthy", self._healthy)
        app.router.add_get("/-/ready", self._ready)
        return app

    async def _metrics(self, request: web.Request) -> web.Response:
        encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
        return web.Response(body=encoder(self.registry), headers={"Content-Type": content_type})

    async def _landing(self, _: web.Request) -> web.Response:
        targets = "".join(
            f"<li>{html.escape(t.name)}: {html.escape(redact(t.url))} ({t.kind})</li>"
            for t in self.config.targets
        )
        proxy = ""
        if self.config.proxy is not None:
            host, port = self.config.proxy.listen
            routes = ", ".join(self.config.proxy.route_names)
            proxy = (
                f"<h2>Proxy</h2><p>{html.escape(host)}:{port} -> "
                f"{html.escape(self.config.proxy.upstream)}; routes: {html.escape(routes)}</p>"
            )
        page = LANDING.format(version=__version__, targets=targets, proxy=proxy)
        return web.Response(text=page, content_type="text/html")

    async def _healthy(self, _: web.Request) -> web.Response:
        return web.Response(text="OK\n")

    async def _ready(self, _: web.Request) -> web.Response:
        """Prometheus' convention: 200 while serving, 503 while starting or draining (so a
        Kubernetes Service sends no new requests to a pod on its way out)."""
        if self.ready:
            return web.Response(text="Ready.\n")
        return web.Response(status=503, text="Not ready: starting or draining.\n")


def _address(listen: tuple[str, int]) -> str:
    return f"{listen[0]}:{listen[1]}"


async def run(config: Config, reload: Callable[[], Config] | None = None) -> int:
    """Serve until a stop signal, then drain and stop (0; 1 where a second signal cut the
    drain short); on SIGHUP apply `reload()` (a config read anew). Whatever started is stopped
    again, also when starting fails half-way."""
    sidecar = Sidecar(config)
    log = logs.get("serve")
    task = asyncio.current_task()
    assert task is not None
    try:
        await sidecar.start()
        host, port = config.listen
        log.info("listening", url=f"http://{host}:{port}/metrics", targets=len(config.targets))
        if config.proxy is not None:
            runtime = sidecar.runtime
            log.info(
                "proxy listening",
                listen=_address(config.proxy.listen),
                upstream=config.proxy.upstream,
                routes=list(config.proxy.route_names),
                event_loop=f"{runtime.event_loop} {runtime.event_loop_version}",
                http_parser=f"{runtime.http_parser} {runtime.http_parser_version}",
            )
            if runtime.event_loop != "uvloop":
                log.warning(
                    "the proxy runs on asyncio's own event loop, uvloop is not installed: it "
                    "costs several times the CPU per request (pip install uvloop)"
                )
        stop = graceful(task, (signal.SIGINT, signal.SIGTERM))
        if reload is not None:
            asyncio.get_running_loop().add_signal_handler(
                signal.SIGHUP, lambda: _reload(sidecar, reload, log)
            )
        await stop.wait()
        if sidecar.proxy is not None:
            log.info("draining", in_flight=sidecar.proxy.stats.in_flight)
        try:
            await sidecar.drain()
        except asyncio.CancelledError:  # the second stop signal (the proxy logged the cut)
            task.uncancel()
            return EXIT_CUT_SHORT
        return 0
    finally:
        await sidecar.stop()
        log.info("stopped")


def _reload(sidecar: Sidecar, load: Callable[[], Config], log: BoundLogger) -> None:
    """SIGHUP: the config read anew and applied, or (a bad file, a change that needs a
    restart) the running one kept, each error logged, the reload metric at 0."""
    try:
        config = load()
        sidecar.apply(config)
    except ConfigError as exc:
        sidecar.reloads.failed()
        for message in exc.messages:
            log.error("config reload failed; the running config is kept", error=message)
    except NeedsRestart as exc:
        sidecar.reloads.failed()
        for line in str(exc).splitlines():
            log.error("config reload not applied; the running config is kept", error=line)
    else:
        sidecar.reloads.succeeded()
        routes = list(config.proxy.route_names) if config.proxy is not None else []
        log.info("config reloaded", targets=len(config.targets), routes=routes)


def serve(config: Config, reload: Callable[[], Config] | None = None) -> int:
    """`specdec serve`: until SIGINT or SIGTERM (drained: exit 0; a second signal during the
    drain stops at once: exit 1); SIGHUP reloads."""
    return_freed_memory()
    return run_until_stopped(lambda: run(config, reload)) or 0


def _fronted_target(config: Config, targets: tuple[TargetState, ...]) -> TargetState | None:
    """The target the proxy fronts: named in the config, or the only one."""
    if config.proxy is None:
        return None
    name = config.proxy.target or (config.targets[0].name if len(config.targets) == 1 else None)
    return next((t for t in targets if t.target.name == name), None)


@dataclass(frozen=True)
class Wiring:
    """What one configuration implies: the targets' state, the models, the target the proxy
    fronts and the registry over them. A reload builds a new one and swaps it whole."""

    config: Config
    targets: tuple[TargetState, ...]
    models: dict[str, ModelConfig]
    fronted: TargetState | None
    registry: CollectorRegistry


def _proxied_engine(config: Config) -> Engine:
    """The proxied engine's kind (`proxy.engine`, else the fronted target's), which decides
    what the proxy asks it for: vLLM's usage, SGLang's spec details, nothing of llama.cpp."""
    proxy = config.proxy
    if proxy is not None and proxy.kind is not None:
        return engine(proxy.kind)
    name = None if proxy is None else proxy.target
    if name is None and len(config.targets) == 1:
        name = config.targets[0].name
    fronted = next((t for t in config.targets if t.name == name), None)
    return DEFAULT if fronted is None else engine(fronted.kind)
