"""The drain's order, seen from inside: readiness goes false before the proxy's listener
closes, idle keep-alive connections close at once, a busy one after its response."""

from __future__ import annotations

import asyncio
import socket

import aiohttp

from exporter.proxy.forward import Proxy
from harness.rig import sidecar
from harness.scripted import scripted, streaming


async def test_readiness_goes_false_before_the_listener_closes() -> None:
    async with scripted(streaming(10, 0.05)) as (up, _), sidecar(up) as (side, proxy_url, _):
        proxy = side.proxy
        assert isinstance(proxy, Proxy) and side.ready
        seen: list[bool] = []
        close = proxy._listener.close

        def recorded() -> None:
            seen.append(side.ready)
            close()

        proxy._listener.close = recorded  # type: ignore[method-assign]
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
        assert proxy.stats.cut_at_drain == 0 and proxy.client_connections == 0


async def test_a_connection_accepted_while_draining_is_answered_once_then_closed() -> None:
    """A connect the kernel had queued before the listener closed reaches the proxy after the
    drain began: it gets its answer (Connection: close) and the drain does not wait for it."""
    async with scripted(streaming(20, 0.05)) as (up, _), sidecar(up) as (side, proxy_url, _):
        proxy = side.proxy
        assert isinstance(proxy, Proxy)
        body = {"model": "sim-27b", "stream": True, "user": "d", "messages": []}
        async with aiohttp.ClientSession() as session:
            async with session.post(proxy_url + "/v1/chat/completions", json=body) as busy:
                drained = asyncio.create_task(side.drain())
                await asyncio.sleep(0)
                ours, theirs = socket.socketpair()
                loop = asyncio.get_running_loop()
                await loop.connect_accepted_socket(lambda: proxy.accept(""), theirs)
                reader, writer = await asyncio.open_connection(sock=ours)
                writer.write(b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n")
                late = await asyncio.wait_for(reader.read(), 10)  # to EOF: it was closed
                writer.close()
                await busy.read()
            started = asyncio.get_running_loop().time()
            await asyncio.wait_for(drained, 10)
            waited = asyncio.get_running_loop().time() - started
        assert late.startswith(b"HTTP/1.1 200") and b"\r\nconnection: close\r\n" in late.lower()
        assert waited < 2, f"the drain waited {waited:.1f} s for the late connection"
        assert proxy.stats.cut_at_drain == 0 and proxy.client_connections == 0
