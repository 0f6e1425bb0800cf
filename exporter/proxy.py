"""The route-tagging proxy: forwards every request to the one upstream, unchanged, and
accounts completions to their route from vLLM's per-request speculative-decoding object.

Transparent: the client gets the status, end-to-end headers and body bytes vLLM sent (SSE
event by event, as soon as each is complete). For streams that did not ask for usage the
proxy asks for it upstream and removes the extra usage event on the way back. Never an open
proxy: absolute-URI and CONNECT requests are refused; only the configured upstream is reached.
A client that hangs up cancels the upstream request, so vLLM aborts it.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.typedefs import Handler

from exporter import logs
from exporter.accounting import Accounting, Request
from exporter.config import ProxyConfig
from exporter.counts import from_spec_object
from exporter.routes import Router
from exporter.sse import StreamTap

HOP_BY_HOP = frozenset(
    (
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    )
)
COMPLETIONS = ("/v1/chat/completions", "/v1/completions")


class Proxy:
    def __init__(self, config: ProxyConfig, accounting: Accounting) -> None:
        self.config = config
        self.accounting = accounting
        self.router = Router(config)
        self.log = logs.get("proxy")
        self.objects_missing = False  # learnt: upstream sends no per-request object
        self.upstream_errors: dict[str, int] = {"connection": 0, "timeout": 0, "broken": 0}
        self.refused = 0
        self._session: aiohttp.ClientSession | None = None

    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.config.max_body_bytes, middlewares=[self._guard])
        app.router.add_route("*", "/{tail:.*}", self.handle)
        app.on_startup.append(self._start)
        app.on_cleanup.append(self._stop)
        return app

    async def _start(self, _: web.Application) -> None:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=60),
            auto_decompress=False,
            timeout=aiohttp.ClientTimeout(
                total=None, connect=self.config.connect_timeout, sock_read=self.config.read_timeout
            ),
            skip_auto_headers=("User-Agent", "Accept-Encoding", "Accept"),
        )

    async def _stop(self, _: web.Application) -> None:
        if self._session is not None:
            await self._session.close()

    @web.middleware
    async def _guard(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Never an open proxy: CONNECT and absolute-URI requests never reach routing."""
        if request.method == "CONNECT" or not request.raw_path.startswith("/"):
            self.refused += 1
            message = "this proxy forwards only to its configured upstream"
            return _error(400, message, "BadRequestError")
        return await handler(request)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            self.refused += 1
            return _error(
                413,
                f"request body larger than {self.config.max_body_bytes} bytes",
                "RequestEntityTooLarge",
            )
        parsed = _json_object(body) if request.method == "POST" else None
        match = self.router.match(request.path, request.headers, parsed)
        raw = (
            request.raw_path[len(request.path) - len(match.path) :]
            if match.path != request.path
            else request.raw_path
        )
        raw = raw if raw.startswith("/") else "/" + raw
        completion = request.method == "POST" and match.path in COMPLETIONS and parsed is not None
        tap: StreamTap | None = None
        if completion and parsed is not None and parsed.get("stream") is True:
            tap, body = self._inject(parsed, body)
        started = time.perf_counter()
        status = "000"
        result: dict[str, Any] = {}
        try:
            response, status = await self._forward(request, raw, body, tap, result)
            return response
        except asyncio.CancelledError:
            status = "499"  # the client hung up; leaving this block closed the upstream request
            raise
        finally:
            if completion:
                single = parsed is not None and (parsed.get("n") or 1) == 1
                self._account(match.route, status, started, tap, result, single)

    def _inject(self, parsed: dict[str, Any], body: bytes) -> tuple[StreamTap, bytes]:
        """Ask upstream for what accounting needs; the tap removes it on the way back."""
        options = parsed.get("stream_options")
        options = dict(options) if isinstance(options, dict) else {}
        usage, continuous = (
            bool(options.get("include_usage")),
            bool(options.get("continuous_usage_stats")),
        )
        # token increments for estimates when vLLM sends no per-request object (n == 1 only)
        want_continuous = continuous or (self.objects_missing and (parsed.get("n") or 1) == 1)
        tap = StreamTap(
            strip_usage_event=not usage,
            # vLLM sends per-chunk usage only with both options: what the client did not get
            # directly, it must not get through the proxy
            strip_usage_fields=want_continuous and not (usage and continuous),
        )
        if not usage or want_continuous != continuous:
            options |= {"include_usage": True, "continuous_usage_stats": want_continuous}
            body = json.dumps({**parsed, "stream_options": options}).encode()
        return tap, body

    async def _forward(
        self,
        request: web.Request,
        raw: str,
        body: bytes,
        tap: StreamTap | None,
        result: dict[str, Any],
    ) -> tuple[web.StreamResponse, str]:
        assert self._session is not None
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        try:
            upstream = await self._session.request(
                request.method,
                self.config.upstream + raw,
                data=body or None,
                headers=headers,
                allow_redirects=False,
            )
        except TimeoutError:
            self.upstream_errors["timeout"] += 1
            return _error(504, "upstream timed out", "GatewayTimeout"), "504"
        except aiohttp.ClientError as exc:
            self.upstream_errors["connection"] += 1
            self.log.warning("upstream unreachable", error=type(exc).__name__)
            return _error(502, "upstream unreachable", "BadGateway"), "502"
        try:
            return await self._relay(request, upstream, tap, result), str(upstream.status)
        except (TimeoutError, aiohttp.ClientError) as exc:
            if request.transport is None or request.transport.is_closing():
                return web.Response(status=499), "499"  # the client hung up while we wrote
            self.upstream_errors["broken"] += 1  # upstream broke mid-response
            self.log.warning("upstream response broken", error=type(exc).__name__)
            if request.transport is not None:
                request.transport.close()  # the client must see the break, not a clean end
            return web.Response(status=502), "502"
        finally:
            if upstream.content.at_eof():
                upstream.release()  # keep-alive: the connection goes back to the pool
            else:
                upstream.close()  # unfinished (client gone): drop it so vLLM aborts the request

    async def _relay(
        self,
        request: web.Request,
        upstream: aiohttp.ClientResponse,
        tap: StreamTap | None,
        result: dict[str, Any],
    ) -> web.StreamResponse:
        headers = [(k, v) for k, v in upstream.headers.items() if k.lower() not in HOP_BY_HOP]
        if upstream.headers.get("Content-Length") is None:  # streamed (SSE): chunk by chunk
            resp = web.StreamResponse(status=upstream.status, reason=upstream.reason)
            for k, v in headers:
                resp.headers.add(k, v)
            await resp.prepare(request)
            async for chunk in upstream.content.iter_any():
                data = tap.feed(chunk) if tap is not None else chunk
                if data:
                    await resp.write(data)
            if tap is not None and (rest := tap.flush()):
                await resp.write(rest)
            await resp.write_eof()
            if tap is not None:
                result["usage"] = tap.usage
            return resp
        data = await upstream.read()
        whole = web.Response(body=data, status=upstream.status, reason=upstream.reason)
        for k, v in headers:
            whole.headers.add(k, v)
        if upstream.status == 200 and tap is None:
            result["usage"] = _json_object(data)
        return whole

    def _account(
        self,
        route: str,
        status: str,
        started: float,
        tap: StreamTap | None,
        result: dict[str, Any],
        single: bool,
    ) -> None:
        doc: dict[str, Any] = result.get("usage") or {}
        usage = doc.get("usage")
        usage = usage if isinstance(usage, dict) else {}
        metrics = doc.get("metrics")
        spec = metrics.get("speculative_decoding") if isinstance(metrics, dict) else None
        if status == "200" and doc and spec is None and single:  # vLLM never sends one for n > 1
            self.objects_missing = True
        elif spec is not None:
            self.objects_missing = False
        ttft = decode = None
        if tap is not None and tap.first_content_at is not None:
            ttft = tap.first_content_at - started
            decode = (tap.last_content_at or tap.first_content_at) - tap.first_content_at
        self.accounting.record(
            Request(
                route=route,
                model_name=self.accounting.label_model(
                    doc.get("model") if status == "200" else None
                ),
                status=status,
                completion_tokens=int(usage.get("completion_tokens") or 0),
                ttft=ttft,
                decode_seconds=decode,
                exact=from_spec_object(spec) if isinstance(spec, dict) else None,
                increments=tuple(tap.increments) if tap is not None else (),
            )
        )


def _json_object(body: bytes) -> dict[str, Any] | None:
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None
    return data if isinstance(data, dict) else None


def _error(status: int, message: str, kind: str) -> web.Response:
    """OpenAI-shaped error, like vLLM's own."""
    body = {"error": {"message": message, "type": kind, "param": None, "code": status}}
    return web.json_response(body, status=status)
