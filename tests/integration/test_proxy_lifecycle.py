"""`specdec serve` as an operator drives it: SIGTERM drains (readiness 503, no new
connections, the streams in flight complete byte for byte, exit 0; past the grace they are
cut and counted), SIGHUP reloads (a new route for new requests while streams in flight finish,
counters go on; a broken file is kept out, the reload metric says 0, the error names
file:line:key). The upstream is a vLLM-like streaming server in this process; `serve` is a
child process receiving real signals."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest

from harness.helpers import free_port, specdec
from harness.pages import samples
from harness.scripted import scripted, sse_completion, streaming

EVENTS, DELAY = 20, 0.1  # each stream: ~2 s


@dataclass
class Served:
    proc: subprocess.Popen[bytes]
    proxy: str
    metrics: str
    config: Path
    log: Path

    def text(self) -> str:
        return self.log.read_text(errors="replace")


def config_text(upstream: str, proxy_port: int, metrics_port: int, routes: str, drain: str) -> str:
    return f"""\
listen: 127.0.0.1:{metrics_port}
targets:
  - name: sim
    url: {upstream}/metrics
    interval: 30s
proxy:
  listen: 127.0.0.1:{proxy_port}
  upstream: {upstream}
  drain_timeout: {drain}
  routes:
{routes}
"""


VOICE = "    - {name: voice_chat, when: {header: {X-Route: voice}}}\n"
AGENT = "    - {name: coding_agent, when: {header: {X-Route: agent}}}\n"


@contextmanager
def serve(tmp: Path, upstream: str, routes: str = VOICE, drain: str = "30s") -> Iterator[Served]:
    proxy_port, metrics_port = free_port(), free_port()
    config = tmp / "specdec.yaml"
    config.write_text(config_text(upstream, proxy_port, metrics_port, routes, drain))
    log = tmp / "serve.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            specdec("serve", "--config", str(config)), stdout=out, stderr=subprocess.STDOUT
        )
    try:
        yield Served(
            proc, f"http://127.0.0.1:{proxy_port}", f"http://127.0.0.1:{metrics_port}", config, log
        )
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


@asynccontextmanager
async def upstream(events: int = EVENTS, delay: float = DELAY) -> AsyncIterator[str]:
    async with scripted(streaming(events, delay)) as (url, _):
        yield url


async def poll(check, timeout: float, what: str):  # type: ignore[no-untyped-def]
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        try:
            got = await check()
        except (aiohttp.ClientError, OSError):
            got = None
        if got:
            return got
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.05)


async def status(session: aiohttp.ClientSession, url: str) -> int:
    async with session.get(url) as resp:
        await resp.read()
        return resp.status


async def metrics(session: aiohttp.ClientSession, served: Served) -> dict:  # type: ignore[type-arg]
    async with session.get(served.metrics + "/metrics") as resp:
        return samples(await resp.text())


def value(page: dict, name: str, **labels: str) -> float:  # type: ignore[type-arg]
    return sum(
        v
        for (n, ls), v in page.items()
        if n == name and all(dict(ls).get(k) == want for k, want in labels.items())
    )


async def stream(
    session: aiohttp.ClientSession, base: str, tag: str, route: str = "voice"
) -> tuple[int, bytes]:
    """One streamed completion through the proxy: its status and body bytes (all of them,
    or what came before the connection broke, with b"<cut>" after)."""
    body = {
        "model": "sim-27b",
        "stream": True,
        "user": tag,
        "messages": [{"role": "user", "content": tag}],
    }
    async with session.post(
        base + "/v1/chat/completions", json=body, headers={"X-Route": route}
    ) as resp:
        got = b""
        try:
            async for chunk in resp.content.iter_any():
                got += chunk
        except aiohttp.ClientPayloadError:
            got += b"<cut>"
        return resp.status, got


def direct(tag: str) -> bytes:
    """What vLLM sends a client that did not ask for usage (what the proxy must deliver)."""
    return b"".join(sse_completion(tag, EVENTS, usage=False))


async def wait_up(session: aiohttp.ClientSession, served: Served) -> None:
    await poll(lambda: _ready(session, served), 30, "serve ready")


async def _ready(session: aiohttp.ClientSession, served: Served) -> bool:
    return await status(session, served.metrics + "/-/ready") == 200


def connect_refused(base: str) -> bool:
    import socket

    host, port = base.removeprefix("http://").split(":")
    with socket.socket() as s:
        return s.connect_ex((host, int(port))) != 0


# ---- SIGTERM -------------------------------------------------------------------------------


async def test_sigterm_lets_50_streams_complete_byte_for_byte_then_exits_0(tmp_path: Path) -> None:
    async with upstream() as up, aiohttp.ClientSession() as session:
        with serve(tmp_path, up) as served:
            await wait_up(session, served)
            tags = [f"s{i}" for i in range(50)]
            streams = [asyncio.create_task(stream(session, served.proxy, t)) for t in tags]
            await poll(lambda: _in_flight(session, served, 50), 20, "50 streams in flight")
            served.proc.send_signal(signal.SIGTERM)
            # draining: not ready, no new connections, the metrics page still served
            assert await poll(lambda: _not_ready(session, served), 5, "/-/ready 503 while draining")
            assert await asyncio.to_thread(connect_refused, served.proxy)
            assert served.proc.poll() is None  # the streams are still running
            results = await asyncio.gather(*streams)
            code = await asyncio.to_thread(served.proc.wait, 30)
    assert code == 0, served.text()[-3000:]
    for tag, (st, body) in zip(tags, results, strict=True):
        assert st == 200 and body == direct(tag), (tag, body[-200:])
    log = served.text()
    assert "draining" in log and "requests cut" not in log and "Traceback" not in log
    assert '"event_loop": "uvloop ' in log and '"http_parser": "httptools ' in log  # the start


async def _in_flight(session: aiohttp.ClientSession, served: Served, n: int) -> bool:
    return value(await metrics(session, served), "specdec_proxy_in_flight_requests") >= n


async def _streams_in_flight(
    session: aiohttp.ClientSession, served: Served, prefix: str, n: int
) -> list[asyncio.Task[tuple[int, bytes]]]:
    """`n` streams through the proxy, returned once the proxy counts them all in flight."""
    streams = [asyncio.create_task(stream(session, served.proxy, f"{prefix}{i}")) for i in range(n)]
    await poll(lambda: _in_flight(session, served, n), 20, f"{n} streams in flight")
    return streams


async def _not_ready(session: aiohttp.ClientSession, served: Served) -> bool:
    return await status(session, served.metrics + "/-/ready") == 503


async def test_sigterm_past_the_grace_cuts_the_rest_and_counts_them(tmp_path: Path) -> None:
    async with upstream(events=200, delay=0.05) as up, aiohttp.ClientSession() as session:
        with serve(tmp_path, up, drain="1s") as served:
            await wait_up(session, served)
            streams = await _streams_in_flight(session, served, "l", 5)
            served.proc.send_signal(signal.SIGTERM)
            results = await asyncio.gather(*streams)
            code = await asyncio.to_thread(served.proc.wait, 30)
    assert code == 0, served.text()[-3000:]
    assert all(body.endswith(b"<cut>") for _, body in results), [b[-40:] for _, b in results]
    cut = [json.loads(line) for line in served.text().splitlines() if "requests cut" in line]
    assert cut and cut[0]["requests"] == 5, served.text()[-2000:]


async def test_a_second_sigterm_during_the_drain_cuts_now_says_so_and_exits_1(
    tmp_path: Path,
) -> None:
    """The operator's "stop now": the streams in flight are cut at once (not after the 30 s
    grace), counted in the log, and the exit status says the drain did not complete."""
    async with upstream(events=200, delay=0.05) as up, aiohttp.ClientSession() as session:
        with serve(tmp_path, up, drain="30s") as served:
            await wait_up(session, served)
            streams = await _streams_in_flight(session, served, "n", 4)
            served.proc.send_signal(signal.SIGTERM)
            assert await poll(lambda: _not_ready(session, served), 5, "/-/ready 503 while draining")
            served.proc.send_signal(signal.SIGTERM)
            code = await asyncio.to_thread(served.proc.wait, 10)  # well inside the 30 s grace
            results = await asyncio.gather(*streams)
    assert code == 1, served.text()[-3000:]
    assert all(body.endswith(b"<cut>") for _, body in results), [b[-40:] for _, b in results]
    lines = [json.loads(line) for line in served.text().splitlines() if line.startswith("{")]
    cut = [e for e in lines if e.get("event") == "a second stop signal: requests cut"]
    assert cut and cut[0]["requests"] == 4, served.text()[-2000:]
    assert lines[-1]["event"] == "stopped" and "Traceback" not in served.text()


# ---- SIGHUP --------------------------------------------------------------------------------


async def test_sighup_adds_a_route_for_new_requests_while_streams_in_flight_finish(
    tmp_path: Path,
) -> None:
    async with upstream() as up, aiohttp.ClientSession() as session:
        with serve(tmp_path, up) as served:
            await wait_up(session, served)
            assert (await stream(session, served.proxy, "before"))[0] == 200
            page = await metrics(session, served)
            voice_before = value(page, "specdec_route_requests_total", route="voice_chat")
            loaded_at = value(page, "specdec_config_last_reload_success_timestamp_seconds")
            assert voice_before == 1
            running = [
                asyncio.create_task(stream(session, served.proxy, f"r{i}")) for i in range(10)
            ]
            await poll(lambda: _in_flight(session, served, 10), 20, "10 streams in flight")
            served.config.write_text(served.config.read_text() + AGENT)
            served.proc.send_signal(signal.SIGHUP)
            await poll(lambda: _reloaded_after(session, served, loaded_at), 10, "the reload")
            new = await stream(session, served.proxy, "after", route="agent")
            results = await asyncio.gather(*running)
            page = await metrics(session, served)
            served.proc.send_signal(signal.SIGTERM)
            assert await asyncio.to_thread(served.proc.wait, 30) == 0
    assert new == (200, direct("after"))
    assert all(r == (200, direct(f"r{i}")) for i, r in enumerate(results))
    # the new route took the new request; the old one's counter went on (1 + 10), not reset
    assert value(page, "specdec_route_requests_total", route="coding_agent") == 1
    assert value(page, "specdec_route_requests_total", route="voice_chat") == 11
    assert value(page, "specdec_config_last_reload_successful") == 1


async def _reloaded_after(session: aiohttp.ClientSession, served: Served, at: float) -> bool:
    page = await metrics(session, served)
    return value(page, "specdec_config_last_reload_success_timestamp_seconds") > at


BROKEN = {  # how the good file is broken -> the line of the message (the file's name first)
    "unknown key": (
        ("  routes:\n", "  routes:\n    - {name: x, when: {headr: {a: b}}}\n"),
        ":11: proxy.routes[0].when.headr: unknown key",
    ),
    "bad value": (
        ("  drain_timeout: 30s\n", "  drain_timeout: 30s\n  max_in_flight: lots\n"),
        ":10: proxy.max_in_flight: expected a number, got 'lots'",
    ),
}


@pytest.mark.parametrize("case", list(BROKEN))
async def test_sighup_with_a_broken_file_keeps_the_running_config(
    tmp_path: Path, case: str
) -> None:
    (old, new), message = BROKEN[case]
    async with upstream() as up, aiohttp.ClientSession() as session:
        with serve(tmp_path, up) as served:
            await wait_up(session, served)
            good = served.config.read_text()
            assert old in good
            served.config.write_text(good.replace(old, new, 1))
            served.proc.send_signal(signal.SIGHUP)
            await poll(lambda: _reload_failed(session, served), 10, "reload metric 0")
            # the running config goes on: its route still counts
            assert (await stream(session, served.proxy, "still"))[0] == 200
            page = await metrics(session, served)
            served.config.write_text(good)  # fixed: the next SIGHUP succeeds
            served.proc.send_signal(signal.SIGHUP)
            await poll(lambda: _reload_ok(session, served), 10, "reload metric 1")
            served.proc.send_signal(signal.SIGTERM)
            assert await asyncio.to_thread(served.proc.wait, 30) == 0
    assert value(page, "specdec_route_requests_total", route="voice_chat") == 1
    errors = [json.loads(x) for x in served.text().splitlines() if "config reload failed" in x]
    assert errors and f"{served.config}{message}" in errors[0]["error"], served.text()[-2000:]


async def _reload_failed(session: aiohttp.ClientSession, served: Served) -> bool:
    return value(await metrics(session, served), "specdec_config_last_reload_successful") == 0


async def _reload_ok(session: aiohttp.ClientSession, served: Served) -> bool:
    return value(await metrics(session, served), "specdec_config_last_reload_successful") == 1


async def test_sighup_with_a_new_listen_address_needs_a_restart(tmp_path: Path) -> None:
    async with upstream() as up, aiohttp.ClientSession() as session:
        with serve(tmp_path, up) as served:
            await wait_up(session, served)
            text = served.config.read_text()
            served.config.write_text(text.replace("listen: 127.0.0.1:", "listen: 127.0.0.2:", 1))
            served.proc.send_signal(signal.SIGHUP)
            await poll(lambda: _reload_failed(session, served), 10, "reload metric 0")
            assert await status(session, served.metrics + "/-/ready") == 200  # still serving
            served.proc.send_signal(signal.SIGTERM)
            assert await asyncio.to_thread(served.proc.wait, 30) == 0
    lines = [json.loads(x) for x in served.text().splitlines() if "not applied" in x]
    assert lines and "listen:" in lines[0]["error"] and "needs a restart" in lines[0]["error"]
