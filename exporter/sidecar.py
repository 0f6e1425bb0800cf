"""`specdec serve`: one asyncio process running the scrape loops, the sidecar's /metrics and,
when configured, the route-tagging proxy."""

from __future__ import annotations

import asyncio
import contextlib
import html
import time

import aiohttp
from aiohttp import web
from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.exposition import choose_encoder

from exporter import __version__, logs
from exporter.config import Config, redact
from exporter.export.model_collector import ModelCollector
from exporter.export.request_collector import RequestCollector
from exporter.export.route_collector import RouteCollector, engine_by_model
from exporter.export.target_collector import TargetCollector
from exporter.process import run_until_stopped
from exporter.proxy.accounting import Accounting
from exporter.proxy.forward import Proxy
from exporter.scrape.target import Clock, Scraper, TargetState

LANDING = """<!doctype html><html><head><title>specdec</title></head><body>
<h1>specdec {version}</h1><p>Live speculative-decoding payoff for vLLM.</p>
<ul><li><a href="metrics">/metrics</a></li><li><a href="-/healthy">/-/healthy</a></li></ul>
<h2>Targets</h2><ul>{targets}</ul>{proxy}</body></html>"""
TICK_SECONDS = 1.0


class Sidecar:
    """Owns the targets' state, the proxy, their tasks and the registry served on /metrics."""

    def __init__(self, config: Config, clock: Clock = time.monotonic) -> None:
        self.config = config
        self.clock = clock
        self.targets = [TargetState(t, config.windows) for t in config.targets]
        self.registry = CollectorRegistry()
        self.registry.register(TargetCollector(self.targets, clock))
        models = {m.name: m for m in config.models}
        if models:
            self.registry.register(ModelCollector(models))
        ProcessCollector(namespace="specdec", registry=self.registry)
        self.proxy: Proxy | None = None
        self.fronted: TargetState | None = None
        if config.proxy is not None:
            accounting = Accounting(config.proxy.route_names, config.windows, models)
            self.proxy = Proxy(config.proxy, accounting)
            by_name = {t.target.name: t for t in self.targets}
            name = config.proxy.target or (
                config.targets[0].name if len(config.targets) == 1 else None
            )
            self.fronted = by_name.get(name) if name else None
            self.registry.register(RouteCollector(self.proxy, models, self.fronted, clock))
            self.registry.register(RequestCollector(accounting, clock))
        self._tasks: list[asyncio.Task[None]] = []
        self._runners: list[web.BaseRunner] = []
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        """Start scraping, serve /metrics and (if configured) the proxy."""
        self._session = aiohttp.ClientSession(headers={"User-Agent": f"specdec/{__version__}"})
        for state in self.targets:
            scraper = Scraper(state, self._session, self.clock)
            self._tasks.append(asyncio.create_task(scraper.run(), name=state.target.name))
        await self._serve(web.AppRunner(self._metrics_app(), access_log=None), self.config.listen)
        if self.proxy is not None and self.config.proxy is not None:
            await self.proxy.start()
            self._tasks.append(asyncio.create_task(self._tick(), name="accounting"))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for runner in reversed(self._runners):
            await runner.cleanup()
        if self._session is not None:
            await self._session.close()
        if self.proxy is not None:
            await self.proxy.stop()

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
                accounting.apportion(engine_by_model(self.fronted))
            accounting.tick(self.clock())
            await asyncio.sleep(TICK_SECONDS)

    def _metrics_app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/", self._landing)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/-/healthy", self._healthy)
        return app

    async def _metrics(self, request: web.Request) -> web.Response:
        encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
        return web.Response(body=encoder(self.registry), headers={"Content-Type": content_type})

    async def _landing(self, _: web.Request) -> web.Response:
        targets = "".join(
            f"<li>{html.escape(t.name)}: {html.escape(redact(t.url))} ({t.engine})</li>"
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


async def run(config: Config) -> None:
    """Run until cancelled (a stop signal, see exporter/process.py); whatever started is
    stopped again, also when starting fails half-way."""
    sidecar = Sidecar(config)
    log = logs.get("serve")
    try:
        await sidecar.start()
        host, port = config.listen
        log.info("listening", url=f"http://{host}:{port}/metrics", targets=len(config.targets))
        if config.proxy is not None:
            log.info(
                "proxy listening",
                listen=f"{config.proxy.listen[0]}:{config.proxy.listen[1]}",
                upstream=config.proxy.upstream,
                routes=list(config.proxy.route_names),
            )
        await asyncio.Event().wait()
    finally:
        await sidecar.stop()
        log.info("stopped")


def serve(config: Config) -> None:
    """`specdec serve`: until SIGINT, SIGTERM or SIGHUP (exit 0)."""
    run_until_stopped(lambda: run(config))
