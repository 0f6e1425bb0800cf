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

from aiohttp import web
from aiohttp.abc import AbstractStreamWriter
from aiohttp.http_parser import RawRequestMessage
from aiohttp.streams import StreamReader
from aiohttp.web_protocol import RequestHandler

from exporter import logs
from exporter.accounting import Accounting, Request
from exporter.config import ProxyConfig
from exporter.counts import from_spec_object
from exporter.routes import Router
from exporter.sse import StreamTap
from exporter.upstream import Broken, Exchange, Upstream

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
        "expect",  # the body is read whole before it is forwarded
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
        self.upstream = Upstream(config.upstream, config.connect_timeout, config.read_timeout)

    def runner(self) -> web.ServerRunner:
        """aiohttp's low-level server: every path is forwarded, so no router or middleware stands
        between a request and the handler (they were a tenth of the added latency). A client
        that hangs up cancels its handler, which closes the upstream request."""
        server = web.Server(
            self.handle,
            request_factory=self._request,
            handler_cancellation=True,
            access_log=None,
        )
        return web.ServerRunner(server)

    def close(self) -> None:
        self.upstream.close()

    def _request(
        self,
        message: RawRequestMessage,
        payload: StreamReader,
        protocol: RequestHandler,
        writer: AbstractStreamWriter,
        task: asyncio.Task[None],
    ) -> web.BaseRequest:
        return web.BaseRequest(
            message,
            payload,
            protocol,
            writer,
            task,
            asyncio.get_running_loop(),
            client_max_size=self.config.max_body_bytes,
        )

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        started = time.perf_counter()  # TTFT counts from here: request in -> first token out
        if request.method == "CONNECT" or not request.raw_path.startswith("/"):
            self.refused += 1  # never an open proxy: these never reach routing
            message = "this proxy forwards only to its configured upstream"
            return _error(400, message, "BadRequestError")
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
            body = _with_key(body, parsed, "stream_options", options)
        return tap, body

    async def _forward(
        self,
        request: web.BaseRequest,
        raw: str,
        body: bytes,
        tap: StreamTap | None,
        result: dict[str, Any],
    ) -> tuple[web.StreamResponse, str]:
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP]
        try:
            exchange = await self.upstream.request(request.method, raw, headers, body)
        except TimeoutError:
            self.upstream_errors["timeout"] += 1
            return _error(504, "upstream timed out", "GatewayTimeout"), "504"
        except OSError as exc:
            self.upstream_errors["connection"] += 1
            self.log.warning("upstream unreachable", error=type(exc).__name__)
            return _error(502, "upstream unreachable", "BadGateway"), "502"
        try:
            return await self._relay(request, exchange, tap, result), str(exchange.head.status)
        except _ClientGone:
            return web.Response(status=499), "499"
        except Broken as exc:
            self.upstream_errors["broken"] += 1  # upstream broke mid-response
            self.log.warning("upstream response broken", error=str(exc))
            if request.transport is not None:
                request.transport.close()  # the client must see the break, not a clean end
            return web.Response(status=502), "502"
        finally:
            exchange.close()  # a finished response keeps its connection; else vLLM aborts

    async def _relay(
        self,
        request: web.BaseRequest,
        exchange: Exchange,
        tap: StreamTap | None,
        result: dict[str, Any],
    ) -> web.StreamResponse:
        head = exchange.head
        headers = [(k, v) for k, v in head.headers if k.lower() not in HOP_BY_HOP]
        if (length := head.get("Content-Length")) is not None:  # whole
            data = await exchange.read()
            whole = web.Response(body=data, status=head.status, reason=head.reason)
            for k, v in headers:
                whole.headers.add(k, v)
            if request.method == "HEAD":
                whole.headers["Content-Length"] = length  # what a GET would have sent
            if head.status == 200 and tap is None:
                result["usage"] = _json_object(data)
            return whole
        resp = web.StreamResponse(status=head.status, reason=head.reason)  # streamed (SSE)
        for k, v in headers:
            resp.headers.add(k, v)
        writer = await resp.prepare(request)
        transport = request.transport
        if writer is None or transport is None:
            raise _ClientGone
        sink = _ClientSink(transport, exchange, tap, resp.headers.get("Transfer-Encoding"))
        exchange.start(sink)
        await resp.write(sink.take())  # what came with the head goes out with our head
        sink.stream()
        while not await exchange.relayed():  # False: the client reads slower than vLLM writes
            await writer.drain()
            exchange.resume()
        if transport.is_closing():
            raise _ClientGone
        if tap is not None:
            if rest := tap.flush():
                await resp.write(rest)
            result["usage"] = tap.usage
        await resp.write_eof()
        return resp

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


class _ClientGone(Exception):
    """The client hung up while the response was relayed."""


class _ClientSink:
    """Upstream body bytes -> the client's transport, from the upstream's data_received: the
    SSE tap frames and filters them, HTTP/1.1 chunking wraps what is left. No task switch."""

    HIGH_WATER = 64 * 1024  # bytes buffered for the client before upstream reads pause

    def __init__(
        self,
        transport: asyncio.Transport,
        exchange: Exchange,
        tap: StreamTap | None,
        transfer_encoding: str | None,
    ) -> None:
        self.transport = transport
        self.exchange = exchange
        self.tap = tap
        self.chunked = transfer_encoding == "chunked"
        self._collected: list[bytes] | None = []  # until our response head is out

    def take(self) -> bytes:
        """What was collected so far (it goes out with the response head, in one write)."""
        assert self._collected is not None
        data = b"".join(self._collected)
        self._collected.clear()
        return data

    def stream(self) -> None:
        """From now on write straight to the client (what came meanwhile first)."""
        data, self._collected = self.take(), None
        if data:
            self._write(data)

    def __call__(self, data: bytes) -> bool:
        if self.transport.is_closing():
            self.exchange.abort(_ClientGone())  # drop the upstream connection: vLLM aborts
            return True
        if self.tap is not None:
            data = self.tap.feed(data)
        if self._collected is not None:
            self._collected.append(data)
        elif data:
            self._write(data)
        return self.transport.get_write_buffer_size() < self.HIGH_WATER

    def _write(self, data: bytes) -> None:
        self.transport.write(b"%x\r\n%b\r\n" % (len(data), data) if self.chunked else data)


def _with_key(body: bytes, parsed: dict[str, Any], key: str, value: Any) -> bytes:
    """`body` (the JSON object `parsed`) with `key` set. A new key is spliced in before the
    closing brace: re-encoding a long agent prompt would cost more than the rest of the hop."""
    end = body.rstrip()
    if key in parsed or not end.endswith(b"}"):
        return json.dumps({**parsed, key: value}).encode()
    member = json.dumps({key: value}).encode()[1:]  # '"key": {...}}'
    return end[:-1] + (b"," if parsed else b"") + member


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
