"""A fake vLLM /metrics endpoint whose spec-decode counters the test controls.

It serves the realistic 1-engine fixture page with the spec-decode block rewritten from the
current counts, and can misbehave (HTTP 500, slow, malformed lines) on demand.
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field

from aiohttp import web

from exporter.core.counts import Counts
from harness.helpers import FIXTURES

BASE = "\n".join(
    line
    for line in (FIXTURES / "vllm-0.33-1engine-k3.prom").read_text().splitlines()
    if "spec_decode" not in line
)
MODEL = "Qwen/Qwen3-32B"


def render(counts: dict[str, Counts], created: float, prefix: str = "vllm:") -> str:
    """A page with the spec-decode families of `counts` ({engine: Counts}) and vLLM's HELP/TYPE."""
    out = [BASE]
    families = [
        ("drafts", "Number of spec decoding drafts.", lambda c: [((), c.drafts)]),
        ("draft_tokens", "Number of draft tokens.", lambda c: [((), c.draft_tokens)]),
        ("accepted_tokens", "Number of accepted tokens.", lambda c: [((), c.accepted)]),
        (
            "accepted_tokens_per_pos",
            "Accepted tokens per draft position.",
            lambda c: [((("position", str(i)),), v) for i, v in enumerate(c.per_position)],
        ),
    ]
    for name, doc, values in families:
        for suffix, kind in (("total", "counter"), ("created", "gauge")):
            full = f"{prefix}spec_decode_num_{name}_{suffix}"
            out += [f"# HELP {full} {doc}", f"# TYPE {full} {kind}"]
            for engine, c in counts.items():
                for extra, v in values(c):
                    labels = [("engine", engine), ("model_name", MODEL), *extra]
                    text = ",".join(f'{k}="{val}"' for k, val in labels)
                    out.append(f"{full}{{{text}}} {created if suffix == 'created' else v}")
    return "\n".join(out) + "\n"


@dataclass
class FakeVllm:
    """Counters advance by `step` on every scrape, so any window's ratio is the step's ratio."""

    step: Counts = field(default_factory=lambda: Counts(10, 30, 12, (7, 4, 1)))
    engines: tuple[str, ...] = ("0",)
    mode: str = "ok"  # ok | http_500 | slow | malformed
    delay: float = 0.0
    counts: dict[str, Counts] = field(default_factory=dict)
    created: float = 1795961759.0
    requests: int = 0

    def restart(self) -> None:
        """Counters back to zero and a new `_created`, like a restarted vLLM."""
        self.counts = {}
        self.created += 1000.0

    async def metrics(self, _: web.Request) -> web.Response:
        self.requests += 1
        if self.mode == "http_500":
            return web.Response(status=500, text="boom")
        if self.mode == "slow":
            await asyncio.sleep(self.delay)
        for engine in self.engines:
            self.counts[engine] = self.counts.get(engine, Counts()) + self.step
        page = render(self.counts, self.created)
        if self.mode == "malformed":
            page += 'vllm:spec_decode_num_drafts_total{engine="9",model_name="x" 12\n'
            page += 'vllm:spec_decode_num_accepted_tokens_total{engine="0"} twelve\n'
        return web.Response(text=page, content_type="text/plain")


class Server:
    """Runs an aiohttp app on 127.0.0.1:`port` in a background thread."""

    def __init__(self, app: web.Application, port: int) -> None:
        self.app, self.port = app, port
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        runner = web.AppRunner(self.app, access_log=None)
        self.loop.run_until_complete(runner.setup())
        self.loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", self.port).start())
        self.ready.set()
        self.loop.run_forever()
        self.loop.run_until_complete(runner.cleanup())

    def __enter__(self) -> Server:
        self.thread.start()
        assert self.ready.wait(10), "fake server did not start"
        return self

    def __exit__(self, *_: object) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def serve_fake(fake: FakeVllm, port: int) -> Server:
    app = web.Application()
    app.router.add_get("/metrics", fake.metrics)
    return Server(app, port)
