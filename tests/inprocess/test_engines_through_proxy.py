"""Per-route payoff on engines beyond vLLM: the simulator speaking each engine's kind, 200 mixed
concurrent requests of two routes through the proxy, and the routes' counts summed against
the engine's own counters (where it has them) and the simulator's truth.

- SGLang: every request's `sglext.spec_tokens_details` (asked for by the proxy when the client
  did not) -> exact route counts, n > 1 included; their verify steps sum to
  `sglang:spec_verify_calls_total`.
- llama.cpp: each request's `timings.draft_n` / `draft_n_accepted` -> the routes' draft and
  accepted tokens are their own; steps and positions are apportioned, summing to the server's.
- TensorRT-LLM: no per-request data: estimates that sum to its counters (steps from position 0).
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from exporter.core.counts import Counts, total
from exporter.core.windows import parse_window
from exporter.scrape.families import families, read_page
from harness.helpers import eventually
from harness.pages import apportioned, close, promtool_clean, read, route_counts, samples
from harness.rig import CODE as CODE_MESSAGES
from harness.rig import mixed_traffic, sidecar, simulator, truth
from harness.scripted import Respond, ok, scripted

SOURCES = ("exact", "estimated")


async def page(upstream: str, path: str = "/metrics") -> dict[Any, float]:
    async with aiohttp.ClientSession() as session, session.get(upstream + path) as resp:
        return samples(await resp.text())


def value(found: dict[Any, float], name: str) -> float:
    return sum(v for (n, _), v in found.items() if n == name)


async def test_sglang_routes_are_exact_and_sum_to_its_verify_calls() -> None:
    async with (
        simulator(kind="sglang") as (_, upstream),
        sidecar(upstream, kind="sglang", windows=(parse_window("20s"),)) as (side, proxy, metrics),
    ):
        # placing, not waiting: the traffic begins 5 s into the sidecar's first 20 s, so the
        # window's first full reading (at 20 s) holds all of it for the 5 s that follow
        await asyncio.sleep(5)
        await mixed_traffic(
            proxy, seed=5, return_spec_tokens_details=[None, True, False], n=[None, None, 2]
        )
        routes = route_counts(await read(metrics), "exact")
        real = await truth(upstream)
        engine = await page(upstream)
        verify = value(engine, "sglang:spec_verify_calls_total")
        generated = value(engine, "sglang:generation_tokens_total")

        async def scraped() -> dict[Any, float] | None:
            """The sidecar's read of SGLang's page, once it saw all the traffic, and the routes'
            share of its verify calls over 20s (the sidecar 20 s old) once the next tick took
            the routes in."""
            found = await page(metrics.removesuffix("/metrics"))
            coverage = found.get(
                ("specdec_attribution_coverage_ratio", (("target", "sim"), ("window", "20s")))
            )
            whole = value(found, "specdec_drafts_total") == verify and coverage == 1.0
            return found if whole else None

        sidecar_page = await eventually(scraped, timeout=45)
        await promtool_clean(metrics)
    assert routes["voice_chat"] == real["ja_chat"] and routes["coding_agent"] == real["code_agent"]
    both = routes["voice_chat"] + routes["coding_agent"]
    assert both.drafts == verify > 1000
    # the proxied engine is the target's kind
    assert side.proxy is not None and side.proxy.settings.engine.kind == "sglang"
    assert sum(side.proxy.accounting.requests.values()) == 200
    # the sidecar's view of SGLang's own counters: steps and tokens, no token counts it lacks
    assert value(sidecar_page, "specdec_engine_generation_tokens_total") == generated
    assert not [k for k in sidecar_page if k[0] == "specdec_draft_tokens_total"]
    assert [k for k in sidecar_page if k[0] == "specdec_engine_reported_acceptance_ratio"]


async def test_llamacpp_routes_draft_and_accepted_are_their_own_and_sum_to_the_server() -> None:
    async with (
        simulator(kind="llamacpp") as (_, upstream),
        sidecar(upstream, kind="llamacpp") as (_, proxy, metrics),
    ):
        await mixed_traffic(proxy, seed=5)
        real = await truth(upstream)
        server = read_page(await _text(upstream), families("llamacpp"))
        engine = total([s.counts for s in server.series.values()])

        async def whole() -> tuple[dict[str, Counts], dict[str, Counts]] | None:
            """Exact tokens and apportioned steps, once both add up to the server's."""
            exact, estimated = [route_counts(await read(metrics), source) for source in SOURCES]
            if len(exact) != 2 or len(estimated) != 2:
                return None
            both = total([*exact.values(), *estimated.values()])
            return (exact, estimated) if close(both, engine) else None

        exact, estimated = await eventually(
            whole, timeout=30
        )  # apportioned on the sidecar's ticks; slow on a loaded machine
        final = await page(metrics.removesuffix("/metrics"))
    # each route's draft and accepted tokens are its requests' own, labelled exact...
    for route, profile in (("voice_chat", "ja_chat"), ("coding_agent", "code_agent")):
        assert exact[route].draft_tokens == real[profile].draft_tokens
        assert exact[route].accepted == real[profile].accepted
        assert exact[route].drafts == 0  # ...its verify steps are not: estimated
        assert estimated[route].drafts and estimated[route].drafts > 0
    assert engine.draft_tokens > 1000
    assert reasons(final) == {"tokens_only": 200.0}  # partly exact, and labelled so
    # the request-level view has them: moments, hence a standard error and the drop alert
    spec = {dict(labels)["route"]: v for (name, labels), v in final.items()
            if name == "specdec_route_spec_requests_total"}  # fmt: skip
    assert spec == {"voice_chat": 100.0, "coding_agent": 100.0}


async def test_trtllm_estimates_sum_to_its_counters() -> None:
    async with (
        simulator(kind="trtllm") as (_, upstream),
        sidecar(upstream, kind="trtllm", path="/prometheus/metrics") as (_, proxy, metrics),
    ):
        await mixed_traffic(proxy, seed=5)
        server = read_page(await _text(upstream, "/prometheus/metrics"), families("trtllm"))
        engine = total([s.counts for s in server.series.values()])
        routes = await apportioned(metrics, engine)
        final = await page(metrics.removesuffix("/metrics"))
    # estimates: only the sums are exact; the routes still differ as their workloads do
    assert engine.drafts is not None and engine.drafts > 300
    assert reasons(final) == {"engine_sends_none": 200.0}
    assert routes["voice_chat"].accepted / routes["voice_chat"].draft_tokens < (
        routes["coding_agent"].accepted / routes["coding_agent"].draft_tokens
    )


def reasons(found: dict[Any, float]) -> dict[str, float]:
    """specdec_route_requests_without_spec_metrics_total by reason, summed over routes."""
    out: dict[str, float] = {}
    for (name, labels), v in found.items():
        if name == "specdec_route_requests_without_spec_metrics_total":
            reason = dict(labels)["reason"]
            out[reason] = out.get(reason, 0.0) + v
    return out


async def _text(upstream: str, path: str = "/metrics") -> str:
    async with aiohttp.ClientSession() as session, session.get(upstream + path) as resp:
        return await resp.text()


def closing_after_streams() -> tuple[Respond, list[int]]:
    """An upstream that, like llama-server, says keep-alive but drops a connection after a
    streamed (chunked) response: here at the worst moment, once the next request is on it
    (on the real server the close races the proxy's next write). Counts the streams sent."""
    streamed: list[asyncio.StreamWriter] = []  # held: an id() of a collected one is reused
    sent: list[int] = []

    async def respond(request: bytes, writer: asyncio.StreamWriter) -> bool:
        if b"/metrics" in request:
            writer.write(ok(b""))
            return True
        if any(w is writer for w in streamed):
            return False  # closed, the request unanswered
        event = b'data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}\n\ndata: [DONE]\n\n'
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nKeep-Alive: timeout=5, max=100"
            b"\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%b\r\n0\r\n\r\n" % (len(event), event)
        )
        streamed.append(writer)
        sent.append(1)
        return True

    return respond, sent


async def test_a_llamacpp_connection_is_not_reused_after_a_stream() -> None:
    """Each stream after the first would meet a close and be a 502 (never sent twice) if the
    proxy reused the connection; for llama.cpp it opens a fresh one, for vLLM it reuses."""
    body = {"model": "tiny", "messages": CODE_MESSAGES, "stream": True}
    for kind, want in (("llamacpp", [200] * 5), ("vllm", [200, 502])):
        respond, sent = closing_after_streams()
        async with scripted(respond) as (url, _), sidecar(url, kind=kind) as (_, proxy, _):
            statuses = []
            async with aiohttp.ClientSession() as session:
                for _ in range(len(want)):
                    async with session.post(proxy + "/v1/chat/completions", json=body) as resp:
                        statuses.append(resp.status)
                        await resp.read()
        assert statuses == want, kind
        assert len(sent) == want.count(200), kind
