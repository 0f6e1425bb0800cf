"""Fault isolation: an exception in routing, in the stream tap's observing, in accounting or in
a collector costs a figure, never a byte. Faults are injected into every third call of one
stage while 200 streams run at once: every client gets exactly what vLLM sends a client
directly, the faults are counted per stage, and the requests the fault spared are accounted as
if nothing happened."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest

from exporter.accounting.ledger import Accounting
from exporter.export.route_collector import RouteCollector
from exporter.proxy.routes import Router
from exporter.proxy.sse import StreamTap
from harness.pages import samples
from harness.rig import sidecar
from harness.scripted import scripted, sse_completion, streaming

STREAMS, EVENTS = 200, 12
TARGETS = {  # stage -> the method that raises on every third call
    "routing": (Router, "match"),
    "tap": (StreamTap, "_content"),
    "accounting": (Accounting, "record"),
    "collector": (RouteCollector, "collect"),
}


class Injected(RuntimeError):
    pass


def every_third(method: Callable[..., Any]) -> tuple[Callable[..., Any], list[int]]:
    calls = itertools.count()
    raised: list[int] = []

    def faulty(*args: Any, **kwargs: Any) -> Any:
        n = next(calls)
        if n % 3 == 0:
            raised.append(n)
            raise Injected(f"injected fault #{n}")
        return method(*args, **kwargs)

    return faulty, raised


async def one(session: aiohttp.ClientSession, base: str, tag: str) -> bytes:
    body = {"model": "sim-27b", "stream": True, "user": tag, "messages": []}
    headers = {"X-Route": "voice"}
    async with session.post(base + "/v1/chat/completions", json=body, headers=headers) as resp:
        assert resp.status == 200
        return await resp.read()


@pytest.mark.parametrize("stage", list(TARGETS))
async def test_a_fault_in_one_stage_costs_no_byte(
    stage: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    cls, name = TARGETS[stage]
    faulty, raised = every_third(getattr(cls, name))
    monkeypatch.setattr(cls, name, faulty)
    async with (
        scripted(streaming(EVENTS, 0.01)) as (up, _),
        sidecar(up) as (side, proxy, metrics_url),
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session,
    ):
        tags = [f"t{i}" for i in range(STREAMS)]
        streams = [asyncio.create_task(one(session, proxy, t)) for t in tags]
        pages = []
        while not all(s.done() for s in streams):  # scrape the sidecar under the load
            async with session.get(metrics_url) as resp:
                assert resp.status == 200
                pages.append(samples(await resp.text()))
            await asyncio.sleep(0.05)
        bodies = await asyncio.gather(*streams)
        async with session.get(metrics_url) as resp:
            last = samples(await resp.text())
        faults = dict(side.faults.counts)
    for tag, body in zip(tags, bodies, strict=True):
        assert body == b"".join(sse_completion(tag, EVENTS, usage=False)), tag
    assert raised and faults[stage] == len(raised), (faults, len(raised))
    assert sum(faults.values()) == faults[stage]  # no other stage broke
    counted = {k: v for k, v in last.items() if k[0] == "specdec_proxy_internal_errors_total"}
    assert counted[("specdec_proxy_internal_errors_total", (("stage", stage),))] >= 1
    requests = sum(v for (n, _), v in last.items() if n == "specdec_route_requests_total")
    if stage == "collector":
        assert len(pages) >= 3 and all("specdec_build_info" in {n for n, _ in p} for p in pages)
        assert requests in (0, STREAMS)  # the route families: whole or absent, never torn
    else:  # each fault cost its own request's figures (a tap fault stops that stream's)
        assert requests == STREAMS - len(raised), (requests, len(raised))
