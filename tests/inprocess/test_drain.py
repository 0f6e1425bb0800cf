"""The drain's order, seen from inside: readiness goes false before the proxy's listener
closes, idle keep-alive connections close at once, a busy one after its response."""

from __future__ import annotations

import asyncio

import aiohttp

from exporter.proxy.forward import Proxy
from tests.rig import sidecar
from tests.scripted import scripted, streaming


async def test_readiness_goes_false_before_the_listener_closes() -> None:
    async with scripted(streaming(10, 0.05)) as (up, _), sidecar(up) as (side, proxy_url, _):
        proxy = side.proxy
        assert isinstance(proxy, Proxy) and proxy._server is not None and side.ready
        seen: list[bool] = []
        close = proxy._server.close

        def recorded() -> None:
            seen.append(side.ready)
            close()

        proxy._server.close = recorded  # type: ignore[method-assign]
        body = {"model": "sim-27b", "stream": True, "user": "d", "messages": []}
        async with aiohttp.ClientSession() as session:
            idle = await session.get(proxy_url + "/v1/models")  # leaves an idle keep-alive
            await idle.read()
            async with session.post(proxy_url + "/v1/chat/completions", json=body) as resp:
                drained = asyncio.create_task(side.drain())
                await asyncio.sleep(0.05)
                assert not side.ready and seen and seen[0] is False
                data = await resp.read()  # its head went out before the drain: it just ends
            await asyncio.wait_for(drained, 10)
        assert data.endswith(b"data: [DONE]\n\n")
        assert proxy.cut_at_drain == 0 and proxy.client_connections == 0
