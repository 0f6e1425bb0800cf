"""`specdec sim`: an aiohttp server that behaves like vLLM's OpenAI-compatible server."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass

from aiohttp import web

from exporter.sim import admin
from exporter.sim.decoder import Output, RequestStats, Sampling, SimEngine
from exporter.sim.dialects import LlamacppShapes, SglangShapes
from exporter.sim.pages import render
from exporter.sim.profiles import classify
from exporter.sim.state import SIM, SimState, json_body, json_error, state_of
from exporter.sim.wire import Json, Shapes, sse, usage

Outputs = AsyncIterator[tuple[int, Output]]


def build_app(
    engine: SimEngine,
    per_request: str = "summary",
    clock: Callable[[], float] = time.time,
    kind: str = "vllm",
) -> web.Application:
    """`per_request` is vLLM's per-request object level (SGLang and llama.cpp send their own
    details, TensorRT-LLM none)."""
    state = SimState(engine, per_request, clock=clock, kind=kind)
    app = web.Application(client_max_size=8 * 1024 * 1024)
    app[SIM] = state
    app.router.add_post("/v1/chat/completions", _completions)
    app.router.add_post("/v1/completions", _completions)
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/health", _health)
    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/prometheus/metrics", _metrics)  # TensorRT-LLM's path
    app.router.add_post("/admin/restart", admin.restart)
    app.router.add_post("/admin/profile", admin.profile)
    app.router.add_post("/admin/fault", admin.fault)
    app.router.add_get("/admin/truth", admin.truth)
    app.router.add_get("/admin/received", admin.received)
    return app


async def _health(_: web.Request) -> web.Response:
    return web.Response(status=200)


async def _models(request: web.Request) -> web.Response:
    state = state_of(request)
    engine = state.engine
    card_created = int(state.clock())  # vLLM's ModelCard and ModelPermission: stamped as made
    card = {
        "id": engine.model,
        "object": "model",
        "created": card_created,
        "owned_by": "vllm",
        "root": engine.model,
        "parent": None,
        "max_model_len": 32768,
        "permission": [
            {
                "id": f"modelperm-{next(state.ids):016x}",  # vLLM: a fresh random_uuid() each
                "object": "model_permission",
                "created": card_created,
                "allow_create_engine": False,
                "allow_sampling": True,
                "allow_logprobs": True,
                "allow_search_indices": False,
                "allow_view": True,
                "allow_fine_tuning": False,
                "organization": "*",
                "group": None,
                "is_blocking": False,
            }
        ],
    }
    return json_body({"object": "list", "data": [card]})


async def _metrics(request: web.Request) -> web.Response:
    state = state_of(request)
    if "http_500" in state.faults:
        return web.Response(status=500, text="Internal Server Error")
    if "slow_metrics" in state.faults:
        await asyncio.sleep(state.faults["slow_metrics"])
    body = render(state.kind, state.engine.metrics)
    if "malformed_metrics" in state.faults:
        body += b'vllm:spec_decode_num_drafts_total{engine="0",model_name="x" 1\n\x00garbage{{{\n'
    return web.Response(body=body, content_type="text/plain", charset="utf-8")


async def _completions(request: web.Request) -> web.StreamResponse:
    state = state_of(request)
    chat = request.path.endswith("/chat/completions")
    if "http_500" in state.faults:
        return json_error(500, "simulated failure", "InternalServerError")
    try:
        body = await request.json()
        assert isinstance(body, dict)
    except (ValueError, AssertionError):
        return json_error(400, "request body must be a JSON object", "BadRequestError")
    engine = state.engine
    if body.get("model", engine.model) != engine.model:
        message = f"The model `{body.get('model')}` does not exist."
        return json_error(404, message, "NotFoundError", "model")
    prompt = _prompt_text(body, chat)
    if prompt is None:
        message = "messages (chat) or prompt (completions) is required"
        return json_error(400, message, "BadRequestError")
    n = body.get("n") or 1
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if not _positive_int(n) or not (max_tokens is None or _positive_int(max_tokens)):
        return json_error(400, "n and max_tokens must be positive integers", "BadRequestError")
    min_tokens, ignore_eos = body.get("min_tokens", 0), body.get("ignore_eos", False)
    if not (min_tokens == 0 or _positive_int(min_tokens)) or not isinstance(ignore_eos, bool):
        message = "min_tokens must be a non-negative integer and ignore_eos a boolean"
        return json_error(400, message, "BadRequestError")
    if state.kind == "llamacpp" and n != 1:  # llama-server's own refusal
        body = {"code": 400, "message": "Only one completion choice is allowed"}
        return json_body({"error": body | {"type": "invalid_request_error"}}, 400)
    cap = body.get("speculative.n_max") if state.kind == "llamacpp" else None
    temperature = body.get("temperature")
    if temperature is not None and not (
        isinstance(temperature, int | float)
        and not isinstance(temperature, bool)
        and temperature >= 0
    ):  # fmt: skip  (NaN is not >= 0)
        return json_error(400, "temperature must be a number >= 0", "BadRequestError")
    sampling = Sampling(
        max_tokens, min_tokens, ignore_eos, cap if _positive_int(cap) else None, temperature
    )
    request_id = f"{'chatcmpl' if chat else 'cmpl'}-{next(state.ids):08x}"
    state.received.append((request_id, request.headers.get("traceparent")))
    run = Run(
        state,
        Shapes(chat, request_id, int(state.clock()), engine.model, engine.fingerprint),
        prompt_tokens=max(1, len(prompt.encode()) // 3),
        stats=[RequestStats(engine.draft_length) for _ in range(n)],
        started=state.clock(),
    )
    profile = classify(prompt, bool(body.get("tools")))
    gens = [engine.generate(profile, run.prompt_tokens, sampling, s) for s in run.stats]
    outputs = _merged(gens)
    try:
        if state.kind in ("sglang", "llamacpp"):
            return await run.other(request, outputs, body, chat)
        if body.get("stream"):
            return await run.stream(request, outputs, body.get("stream_options") or {})
        return await run.whole(outputs)
    except ConnectionResetError:  # the client hung up: vLLM aborts the request, so do we
        return web.Response(status=499)
    finally:
        await outputs.aclose()


@dataclass
class Run:
    """One completion request being served."""

    state: SimState
    shapes: Shapes
    prompt_tokens: int
    stats: list[RequestStats]
    started: float  # the state's clock when the request came: llama.cpp's timings count from it

    def spec_metrics(self, whole: bool = False) -> Json | None:
        """The per-request object as vLLM fills it: only with the flag on, speculation
        configured and n == 1."""
        level = self.state.per_request
        if level == "none" or self.state.kind != "vllm":
            return None
        if len(self.stats) != 1 or self.state.engine.draft_length == 0:
            return None
        return self.stats[0].to_dict(level == "detailed", whole)

    def completion_tokens(self) -> int:
        return sum(s.completion_tokens for s in self.stats)

    async def whole(self, outputs: AsyncIterator[tuple[int, Output]]) -> web.Response:
        texts, finishes = [""] * len(self.stats), ["stop"] * len(self.stats)
        async for index, out in outputs:
            texts[index] += "".join(out.tokens)
            finishes[index] = out.finish_reason or finishes[index]
        body = self.shapes.response(
            self.prompt_tokens, self.completion_tokens(), texts, finishes, self.spec_metrics(True)
        )
        return json_body(body)

    async def stream(
        self, request: web.Request, outputs: AsyncIterator[tuple[int, Output]], options: Json
    ) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
        await resp.prepare(request)
        final_usage = bool(options.get("include_usage"))
        # vLLM honours continuous_usage_stats only together with include_usage
        continuous = final_usage and bool(options.get("continuous_usage_stats"))
        drop_after = self.state.faults.get("drop_connection_mid_stream")

        def send(chunk: Json, completion: int) -> bytes:
            if continuous:
                chunk["usage"] = usage(self.prompt_tokens, completion, details=self.shapes.chat)
            if not final_usage and chunk["choices"][0]["finish_reason"] is not None:
                chunk["system_fingerprint"] = self.shapes.fingerprint  # no usage chunk to carry it
            return sse(chunk)

        if self.shapes.chat:
            for i in range(len(self.stats)):
                await resp.write(send(self.shapes.role_chunk(i), 0))
        chunks = 0
        async for index, out in outputs:
            text = "".join(out.tokens)
            chunk = self.shapes.content_chunk(index, text, out.finish_reason)
            await resp.write(send(chunk, self.stats[index].completion_tokens))
            chunks += 1
            if drop_after is not None and chunks >= drop_after and request.transport is not None:
                request.transport.close()  # a simulated network failure: no usage, no [DONE]
                return resp
        if final_usage:
            spec = self.spec_metrics()
            metrics = None if spec is None else {"speculative_decoding": spec}
            chunk = self.shapes.usage_chunk(self.prompt_tokens, self.completion_tokens(), metrics)
            await resp.write(sse(chunk))
        await resp.write(sse("[DONE]"))
        await resp.write_eof()
        return resp

    async def other(
        self, request: web.Request, outputs: Outputs, body: Json, chat: bool
    ) -> web.StreamResponse:
        """SGLang's or llama.cpp's shapes (dialects.py), streamed or whole."""
        options = body.get("stream_options")
        final_usage = isinstance(options, dict) and bool(options.get("include_usage"))
        resp: web.StreamResponse | None = None
        if body.get("stream"):
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
            await resp.prepare(request)
        head = self.shapes.head
        if self.state.kind == "sglang":
            flag = (
                body.get("return_spec_tokens_details") is True
                and self.state.engine.draft_length > 0
            )
            sgl = SglangShapes(chat, head["id"], head["created"], head["model"])
            whole = await self._sglang(sgl, resp, outputs, flag, final_usage)
        else:
            build = f"b1-{self.state.engine.fingerprint[-7:]}"
            llama = LlamacppShapes(chat, head["id"], head["created"], head["model"], build)
            whole = await self._llamacpp(llama, resp, outputs, final_usage)
        if resp is None:
            return json_body(whole)
        await resp.write(sse("[DONE]"))
        await resp.write_eof()
        return resp

    async def _sglang(
        self,
        sgl: SglangShapes,
        resp: web.StreamResponse | None,
        outputs: Outputs,
        flag: bool,
        final_usage: bool,
    ) -> Json:
        texts, finishes = [""] * len(self.stats), ["stop"] * len(self.stats)
        if resp is not None:
            for chunk in sgl.opening(len(self.stats)):
                await resp.write(chunk)
        async for index, out in outputs:
            texts[index] += "".join(out.tokens)
            finishes[index] = out.finish_reason or finishes[index]
            for chunk in sgl.content(index, "".join(out.tokens), out.finish_reason):
                if resp is not None:
                    await resp.write(chunk)
        prompt, completion = self.prompt_tokens, self.completion_tokens()
        if resp is None:
            return sgl.response(prompt, completion, texts, finishes, self.stats, flag)
        for chunk in sgl.closing(prompt, completion, self.stats, flag, final_usage):
            await resp.write(chunk)
        return {}

    async def _llamacpp(
        self,
        llama: LlamacppShapes,
        resp: web.StreamResponse | None,
        outputs: Outputs,
        final_usage: bool,
    ) -> Json:
        text, finish, first = "", "stop", None
        async for _, out in outputs:
            first = self.state.clock() if first is None else first
            text += "".join(out.tokens)
            finish = out.finish_reason or finish
            if resp is not None:
                await resp.write(llama.content("".join(out.tokens)))
        now = self.state.clock()
        spent = ((first or now) - self.started, now - (first or now))
        if resp is None:
            return llama.response(self.prompt_tokens, text, finish, self.stats[0], spent)
        for chunk in llama.closing(self.prompt_tokens, self.stats[0], finish, final_usage, spent):
            await resp.write(chunk)
        return {}


def _positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


async def _merged(gens: list[AsyncGenerator[Output]]) -> AsyncGenerator[tuple[int, Output]]:
    """The outputs of n choices in lockstep, as vLLM's engine steps them together: each round
    advances every unfinished choice once (concurrently), then yields them in index order, so
    the interleaving on the wire does not depend on timer jitter."""
    live = list(enumerate(gens))
    try:
        if len(gens) == 1:  # the common case, without a task per step
            async for out in gens[0]:
                yield 0, out
            return
        while live:
            steps = await asyncio.gather(
                *(anext(gen, None) for _, gen in live), return_exceptions=False
            )
            live = [(i, gen) for (i, gen), out in zip(live, steps, strict=True) if out is not None]
            for (i, _), out in zip(live, [s for s in steps if s is not None], strict=True):
                yield i, out
    finally:  # close now, so a hang-up is counted as an abort at once
        for gen in gens:
            await gen.aclose()


def _prompt_text(body: Json, chat: bool) -> str | None:
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return None
        parts = []
        for message in messages:
            content = message.get("content") if isinstance(message, dict) else None
            if isinstance(content, list):  # [{"type": "text", "text": ...}]
                content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
            parts.append(str(content or ""))
        return "\n".join(parts)
    prompt = body.get("prompt")
    if isinstance(prompt, list):
        prompt = " ".join(map(str, prompt))
    return prompt if isinstance(prompt, str) and prompt else None
