"""The route-tagging proxy: forwards every request to the one upstream, unchanged, and
accounts completions to their route from vLLM's per-request speculative-decoding object.

Transparent: the client gets the status, end-to-end headers and body bytes vLLM sent (SSE
event by event, as soon as each is complete). What the proxy asks upstream for beyond the
client's request (`ask.py`: vLLM's usage, SGLang's details) is removed on the way back. Never
an open proxy: absolute-URI and CONNECT requests are refused; only the configured upstream is
reached. A client that hangs up cancels the upstream request, so vLLM aborts it.

Never the product's outage: routing, the stream tap's observations and accounting run beside
the byte path, and an exception in them is counted (`Faults`) while the bytes go on as vLLM
sent them. Past `max_connections` client connections or `max_in_flight` upstream requests a
request is shed with vLLM's 503 shape and a Retry-After; on a stop signal `drain` lets the
requests in flight complete.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from exporter import logs
from exporter.config import ProxyConfig
from exporter.core.faults import Faults
from exporter.proxy import sglext
from exporter.proxy.accounting import Accounting
from exporter.proxy.ask import ask
from exporter.proxy.connection import ClientConnection
from exporter.proxy.framing import Head
from exporter.proxy.outcome import request_outcome, spec_object
from exporter.proxy.request import ClientRequest
from exporter.proxy.routes import Router
from exporter.proxy.sse import StreamTap
from exporter.proxy.upstream import Broken, Exchange, Upstream
from exporter.proxy.writer import ResponseWriter, date_header

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
COMPLETIONS = {  # the endpoints accounted -> the key of a token's text in their stream events
    "/v1/chat/completions": b'"content":"',
    "/v1/completions": b'"text":"',
}


@dataclass(frozen=True, slots=True)
class _Plan:
    """Where a request goes and what is watched: routing's result (or, when routing raised,
    the request forwarded as it came, to the default route, unwatched)."""

    route: str
    target: str
    body: bytes
    strip: tuple[bool, bool] | None = None  # a streamed completion: what the tap removes
    content_key: bytes = b""
    single: bool | None = None  # a completion, accounted: one choice (n == 1)?
    strip_spec: bool = False  # SGLang: the proxy asked for spec_tokens_details, the client did not


class Proxy:
    """The `Server` behind every client connection: route, forward, account."""

    def __init__(self, config: ProxyConfig, accounting: Accounting, faults: Faults) -> None:
        self.config = config
        self.accounting = accounting
        self.faults = faults
        self.router = Router(config)
        self.log = logs.get("proxy")
        self.objects_missing = False  # learnt: upstream sends no per-request object
        self.engine = "vllm"  # the upstream's kind: what to ask it for (see sidecar)
        self.upstream_errors: dict[str, int] = {"connection": 0, "timeout": 0, "broken": 0}
        self.refused = 0
        self.shed: dict[str, int] = {"connections": 0, "in_flight": 0}  # 503s past a limit
        self.cut_at_drain = 0  # requests still running when the drain's grace ran out
        self.in_flight = 0  # requests sent upstream and not yet over
        self.draining = False
        self.upstream = Upstream(config.upstream, config.connect_timeout, config.read_timeout)
        self._server: asyncio.Server | None = None
        self._clients: set[ClientConnection] = set()
        self._drained = asyncio.Event()

    async def start(self) -> None:
        host, port = self.config.listen
        self._server = await asyncio.get_running_loop().create_server(
            self.accept, host, port, backlog=1024
        )

    async def drain(self, grace: float) -> None:
        """Stop accepting; let the requests in flight complete for up to `grace` seconds
        (their connections close after them, idle ones at once); then cut the rest."""
        self.draining = True
        if self._server is not None:
            self._server.close()
        for client in list(self._clients):
            client.drain()
        if self._clients:
            self._drained.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._drained.wait(), grace)
        cut = [client for client in self._clients if client.busy]
        self.cut_at_drain += len(cut)
        if cut:
            self.log.warning("drain grace over: requests cut", requests=len(cut), grace=grace)
        await self.stop()

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
        for client in list(self._clients):
            client.close()
        self.upstream.close()

    @property
    def client_connections(self) -> int:
        return len(self._clients)

    def reconfigure(self, config: ProxyConfig) -> None:
        """A reloaded config: new requests take the new routes, limits and timeouts; requests
        in flight finish as they began. A new upstream or its timeouts: a new pool, the old
        one retired (its connections close as their requests end)."""
        upstream = (config.upstream, config.connect_timeout, config.read_timeout)
        if upstream != (
            self.config.upstream,
            self.config.connect_timeout,
            self.config.read_timeout,
        ):
            self.upstream.retire()
            self.upstream = Upstream(*upstream)
        self.config = config
        self.router = Router(config)

    def accept(self) -> ClientConnection:
        """The protocol of one accepted connection (one accepted while draining is answered
        once, then closed)."""
        config = self.config
        client = ClientConnection(
            self,
            config.max_body_bytes,
            self._closed,
            header_timeout=config.header_timeout,
            idle_timeout=config.idle_timeout,
            over_limit=len(self._clients) >= config.max_connections,
        )
        self._clients.add(client)
        if self.draining:
            client.drain()
        return client

    def _closed(self, client: ClientConnection) -> None:
        self._clients.discard(client)
        if not self._clients:
            self._drained.set()

    def refuse(self, writer: ResponseWriter, status: int, message: str, kind: str) -> None:
        self.refused += 1
        _error(writer, status, message, kind)

    def begin(
        self, writer: ResponseWriter, request: ClientRequest, body: bytes, over_limit: bool
    ) -> _Call | None:
        """Everything up to the upstream write runs here, in the client's data_received."""
        started = time.perf_counter()  # TTFT counts from here: request in -> first token out
        method, target = request.method, request.target
        if method == "CONNECT" or not target.startswith("/"):
            # never an open proxy: these never reach routing
            self.refuse(
                writer,
                400,
                "this proxy forwards only to its configured upstream",
                "BadRequestError",
            )
            return None
        if over_limit or self.in_flight >= self.config.max_in_flight:
            self._shed(writer, "connections" if over_limit else "in_flight")
            return None
        try:
            plan = self._plan(request, body)
        except Exception as exc:  # forwarded as it came: a routing bug costs a figure
            self.faults.record("routing", exc)
            plan = _Plan(self.config.default_route, target, body)
        headers = [(k, v) for k, v in request.fields if k.lower() not in HOP_BY_HOP]
        call = _Call(self, writer, method)
        self.in_flight += 1
        call.exchange = self.upstream.send(method, plan.target, headers, plan.body, call)
        # the rest can wait until the request is on its way: no response byte comes before
        if plan.strip is not None:
            call.tap = StreamTap(
                *plan.strip,
                strip_spec_details=plan.strip_spec,
                content_key=plan.content_key,
                on_fault=call.tap_fault,
            )
        call.strip_spec = plan.strip_spec
        if plan.single is not None:  # accounted when it ends
            call.account = (plan.route, started, plan.single)
        return call

    def _plan(self, request: ClientRequest, body: bytes) -> _Plan:
        method, target, path = request.method, request.target, request.path
        parsed = _json_object(body) if method == "POST" else None
        match = self.router.match(path, request.headers, parsed)
        if match.path != path:
            target = target[len(path) - len(match.path) :]
            target = target if target.startswith("/") else "/" + target
        if method != "POST" or match.path not in COMPLETIONS or parsed is None:
            return _Plan(match.route, target, body)
        asked = ask(parsed, body, self.engine, self.objects_missing)
        single = (parsed.get("n") or 1) == 1
        return _Plan(
            match.route,
            target,
            asked.body,
            asked.strip,
            COMPLETIONS[match.path],
            single,
            asked.strip_spec,
        )

    def _shed(self, writer: ResponseWriter, limit: str) -> None:
        """Past a limit: vLLM's 503 shape, a Retry-After, the connection closed after it."""
        self.shed[limit] += 1
        writer.close_after = True
        what = "client connections" if limit == "connections" else "requests in flight"
        _error(
            writer,
            503,
            f"the proxy is at its limit of {what}",
            "ServiceUnavailableError",
            retry_after=1,
        )

    def _account(
        self,
        account: tuple[str, float, bool],
        status: str,
        tap: StreamTap | None,
        doc: dict[str, Any],
    ) -> None:
        route, started, single = account
        spec = spec_object(doc)
        if status == "200" and doc and spec is None and single:  # vLLM never sends one for n > 1
            self.objects_missing = True
        elif spec is not None:
            self.objects_missing = False
        self.accounting.record(
            request_outcome(self.accounting, route, started, single, status, tap, doc, self.engine)
        )


class _Call:
    """One request between its client and the upstream: the upstream's `Receiver` and the
    client's `Call`. A response with a Content-Length is relayed whole (a non-streamed
    completion is decoded for its usage); any other is streamed, SSE event by event."""

    def __init__(self, proxy: Proxy, writer: ResponseWriter, method: str) -> None:
        self.proxy = proxy
        self.writer = writer
        self.method = method
        self.tap: StreamTap | None = None  # on streamed completions
        self.exchange: Exchange | None = None
        self.account: tuple[str, float, bool] | None = None  # route, start, single choice
        self.strip_spec = False  # SGLang: cut the details the proxy asked for out of the body
        self._whole: list[bytes] | None = None  # a Content-Length body, collected
        self._over = False  # ended, failed or gone: counted out of flight, accounted
        self._head: Head | None = None
        self._headers: list[tuple[str, str]] = []  # the head's end-to-end fields

    # the upstream's side
    def head(self, head: Head) -> None:
        self._head = head
        self._headers = [(k, v) for k, v in head.headers if k.lower() not in HOP_BY_HOP]
        whole = head.get("Content-Length") is not None or head.status in (204, 304)
        if whole or self.method == "HEAD":
            self._whole = []
        else:
            self.writer.start_stream(head.status, head.reason, self._headers)

    def data(self, data: bytes) -> bool:
        if self._whole is not None:
            self._whole.append(data)
            return True
        if self.tap is not None:
            data = self.tap.feed(data)
        if data:
            self.writer.send(data)
        return not self.writer.paused

    def end(self) -> None:
        head = self._head
        assert head is not None
        body: bytes | None = None
        if self._whole is not None:
            body = b"".join(self._whole)
            headers = self._headers
            length = head.get("Content-Length")
            if self.method == "HEAD" and length is not None:  # what a GET would have sent
                headers.append(("Content-Length", length))
            out = sglext.without_details(body) if self.strip_spec else body
            self.writer.respond(
                head.status, head.reason, headers, out, head_only=self.method == "HEAD"
            )
        else:
            rest = self.tap.flush() if self.tap is not None else b""
            self.writer.end_stream(rest)
        self._done(str(head.status), body)

    def fail(self, error: BaseException) -> None:
        proxy = self.proxy
        if isinstance(error, TimeoutError):
            proxy.upstream_errors["timeout"] += 1
            _error(self.writer, 504, "upstream timed out", "GatewayTimeout")
            self._done("504", None)
        elif isinstance(error, Broken):
            proxy.upstream_errors["broken"] += 1  # upstream broke mid-response
            proxy.log.warning("upstream response broken", error=str(error))
            if self._whole is not None:  # nothing went to the client yet
                _error(self.writer, 502, "upstream response broken", "BadGateway")
            else:
                self.writer.abort()  # the client must see the break, not a clean end
            self._done("502", None)
        else:
            proxy.upstream_errors["connection"] += 1
            proxy.log.warning("upstream unreachable", error=type(error).__name__)
            _error(self.writer, 502, "upstream unreachable", "BadGateway")
            self._done("502", None)

    # the client's side
    def resume(self) -> None:
        if self.exchange is not None:
            self.exchange.resume()

    def gone(self) -> None:
        if self.exchange is not None:
            self.exchange.abort()  # the upstream connection is dropped: vLLM aborts
        self._done("499", None)

    def tap_fault(self, error: BaseException) -> None:
        """The tap's observing raised: the stream goes on, unaccounted."""
        self.proxy.faults.record("tap", error)
        self.account = None

    def _done(self, status: str, body: bytes | None) -> None:
        """Once per call: it is no longer in flight, and it is accounted (beside the bytes,
        which are all out by now)."""
        if self._over:
            return
        self._over = True
        proxy = self.proxy
        proxy.in_flight -= 1
        if self.account is None:
            return
        try:
            doc: dict[str, Any] | None = None
            if body is not None:
                doc = _json_object(body) if status == "200" else None
            elif self.tap is not None:
                doc = self.tap.usage
            proxy._account(self.account, status, self.tap, doc or {})
        except Exception as exc:
            proxy.faults.record("accounting", exc)
        self.account = None


def _json_object(body: bytes) -> dict[str, Any] | None:
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None
    return data if isinstance(data, dict) else None


def _error(
    writer: ResponseWriter, status: int, message: str, kind: str, retry_after: int | None = None
) -> None:
    """OpenAI-shaped error, like vLLM's own."""
    body = {"error": {"message": message, "type": kind, "param": None, "code": status}}
    reason = HTTPStatus(status).phrase
    headers = [("Content-Type", "application/json"), date_header()]
    if retry_after is not None:
        headers.append(("Retry-After", str(retry_after)))
    writer.respond(status, reason, headers, json.dumps(body).encode())
