"""`specdec serve`: one asyncio process running the scrape loops and the sidecar's HTTP server."""

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
from exporter.collector import SpecdecCollector
from exporter.config import Config, redact
from exporter.scrape import Clock, Scraper, TargetState

LANDING = """<!doctype html><html><head><title>specdec</title></head><body>
<h1>specdec {version}</h1><p>Live speculative-decoding payoff for vLLM.</p>
<ul><li><a href="metrics">/metrics</a></li><li><a href="-/healthy">/-/healthy</a></li></ul>
<h2>Targets</h2><ul>{targets}</ul></body></html>"""


class Sidecar:
    """Owns the targets' state, their scrape tasks and the registry served on /metrics."""

    def __init__(self, config: Config, clock: Clock = time.monotonic) -> None:
        self.config = config
        self.clock = clock
        self.targets = [TargetState(t, config.windows) for t in config.targets]
        self.registry = CollectorRegistry()
        self.registry.register(SpecdecCollector(self.targets, clock))
        ProcessCollector(namespace="specdec", registry=self.registry)
        self._tasks: list[asyncio.Task[None]] = []
        self._session: aiohttp.ClientSession | None = None

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/", self._landing)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/-/healthy", self._healthy)
        app.on_startup.append(self._start)
        app.on_cleanup.append(self._stop)
        return app

    async def _start(self, _: web.Application) -> None:
        self._session = aiohttp.ClientSession(headers={"User-Agent": f"specdec/{__version__}"})
        for state in self.targets:
            scraper = Scraper(state, self._session, self.clock)
            self._tasks.append(asyncio.create_task(scraper.run(), name=state.target.name))

    async def _stop(self, _: web.Application) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._session is not None:
            await self._session.close()

    async def _metrics(self, request: web.Request) -> web.Response:
        encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
        return web.Response(body=encoder(self.registry), headers={"Content-Type": content_type})

    async def _landing(self, _: web.Request) -> web.Response:
        targets = "".join(
            f"<li>{html.escape(t.name)}: {html.escape(redact(t.url))} ({t.engine})</li>"
            for t in self.config.targets
        )
        return web.Response(
            text=LANDING.format(version=__version__, targets=targets), content_type="text/html"
        )

    async def _healthy(self, _: web.Request) -> web.Response:
        return web.Response(text="OK\n")


def serve(config: Config) -> None:
    """Run until interrupted."""
    host, port = config.listen
    logs.get("serve").info(
        "listening", url=f"http://{host}:{port}/metrics", targets=len(config.targets)
    )
    web.run_app(Sidecar(config).app(), host=host, port=port, print=None, access_log=None)
