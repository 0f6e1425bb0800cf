"""The route-tagging proxy: forwards every request to the one upstream, unchanged, and
accounts completions to their route from vLLM's per-request speculative-decoding object.

Transparent: the client gets the status, end-to-end headers and body bytes vLLM sent (SSE
event by event, as soon as each is complete). What the proxy asks upstream for beyond the
client's request (`ask.py`: vLLM's usage, SGLang's details) is removed on the way back. Never
an open proxy: absolute-URI and CONNECT requests are refused; only the configured upstream is
reached. A client that hangs up cancels the upstream request, so vLLM aborts it.

Never the product's outage: routing, the stream tap's observations and accounting run beside
the byte path, and an exception in them is counted (`Faults`) while the bytes go on as vLLM
sent them. Past `max_connections` client connections (when none gives its slot: `slots.py`),
`max_in_flight` upstream requests or `max_buffered_bytes` held a request is shed with vLLM's
503 shape and a Retry-After; every connection the proxy ends is closed by lingering
(`linger.py`), so no client that sent a request sees a reset; on a stop signal `drain` lets the
requests in flight complete. Every byte from either side may be
hostile: a body the proxy cannot read as a UTF-8 JSON object is relayed untouched and counted
(a client's doing, never an internal error); a response too large for the budget is relayed
unread.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass

from exporter import logs
from exporter.accounting.ledger import Accounting
from exporter.core import reasons
from exporter.core.faults import Faults
from exporter.core.slices import request_bands
from exporter.proxy import slots
from exporter.proxy.ask import ask
from exporter.proxy.budget import Budget, Hold
from exporter.proxy.connection import ClientConnection, Limits
from exporter.proxy.labels import ModelLabels
from exporter.proxy.linger import Lingering
from exporter.proxy.listener import Listener
from exporter.proxy.outcome import request_outcome
from exporter.proxy.reader import Refusal
from exporter.proxy.relay import Ending, Relay, Watch
from exporter.proxy.request import ClientRequest
from exporter.proxy.requestlog import RequestLog
from exporter.proxy.responses import (
    closing,
    end_to_end,
    error_response,
    release,
    request_json,
)
from exporter.proxy.routes import normalized
from exporter.proxy.settings import Settings
from exporter.proxy.stats import ProxyStats
from exporter.proxy.trace import Trace, carry
from exporter.proxy.upstream import Body
from exporter.proxy.writer import ResponseWriter

REFUSED = closing(503, "the proxy is at its limit of client connections")  # a newcomer past it
TRACE_LOG_PERIOD = 60.0  # seconds: one line per kind of bad traceparent at most, with a count
COMPLETIONS = {  # the endpoints accounted -> the key of a token's text in their stream events
    "/v1/chat/completions": b'"content":"',
    "/v1/completions": b'"text":"',
}


@dataclass(frozen=True, slots=True)
class _Plan:
    """Where a request goes and what is watched: routing's result (or, when routing raised,
    the request forwarded as it came, to the default route, unwatched)."""

    uri: str
    body: Body
    watch: Watch


class Proxy:
    """The `Server` behind every client connection: route, forward, account."""

    def __init__(self, settings: Settings, accounting: Accounting, faults: Faults) -> None:
        self.settings = settings  # swapped whole by a reload (`swap`); read once per request
        self.accounting = accounting
        self.model_labels = ModelLabels()  # kept across reloads, as the accounting is
        self.faults = faults
        self.log = logs.get("proxy")
        self.objects_missing = False  # learnt: upstream sends no per-request object
        self.stats = ProxyStats()
        self.request_log = RequestLog()  # its thread starts with its first line
        # the one account of bytes held, across reloads: its limits are the settings'
        self.budget = Budget(settings.config.max_buffered_bytes, settings.reserve)
        self.draining = False
        self._listener = Listener(self.accept, self._out_of_descriptors, self.log)
        self._clients: set[ClientConnection] = set()  # each holds one of max_connections
        self._lingering: set[Lingering] = set()  # at most max_connections: accept() waits
        self._drained = asyncio.Event()

    def bind(self) -> None:
        """Take the listen address, accepting nothing until `start` (OSError if taken)."""
        self._listener.bind(*self.settings.config.listen)

    async def start(self) -> None:
        self._listener.start(backlog=1024)

    async def drain(self, grace: float) -> None:
        """Stop accepting; let the requests in flight complete for up to `grace` seconds
        (their connections close after them, idle ones at once); then cut the rest."""
        self.draining = True
        self._listener.close()
        for client in list(self._clients):
            client.drain()
        try:
            if self._clients:
                self._drained.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._drained.wait(), grace)
        except asyncio.CancelledError:  # a second stop signal: stop now
            self._cut("a second stop signal: requests cut")
            await self.stop()
            raise
        self._cut("drain grace over: requests cut", grace=grace)
        await self.stop()

    def _cut(self, event: str, **fields: float) -> None:
        """Count and log the requests still in flight, about to be cut."""
        cut = sum(1 for client in self._clients if client.busy)
        self.stats.cut_at_drain += cut
        if cut:
            self.log.warning(event, requests=cut, **fields)

    async def stop(self) -> None:
        self._listener.close()
        for client in list(self._clients):
            client.close()
        for lingering in list(self._lingering):
            lingering.abort()
        self.settings.pool.close()
        self.request_log.close()

    @property
    def client_connections(self) -> int:
        return len(self._clients)

    def swap(self, settings: Settings) -> None:
        """A reload: new connections and requests take `settings`; those under way keep
        theirs. A pool left behind is retired (its connections close as their requests end)."""
        old, self.settings = self.settings, settings
        if settings.pool is not old.pool:
            old.pool.retire()
        self.budget.limit, self.budget.reserve = (
            settings.config.max_buffered_bytes,
            settings.reserve,
        )

    def limits(self) -> Limits:
        """What a connection holds its next request to (the settings' now)."""
        settings = self.settings
        return Limits(settings.config.max_body_bytes, settings.deadlines)

    def accept(self, peer: str) -> asyncio.Protocol:
        """The protocol of a connection from `peer` (one accepted while draining is answered
        once, then closed). At max_connections another gives it its slot if one may
        (`slots.choose`); else it is refused: a whole 503, then a lingering close."""
        settings = self.settings
        if len(self._clients) >= settings.config.max_connections and not self._make_room(peer):
            self.stats.shed["connections"] += 1
            self._episode("at max_connections: new connections refused (503)")
            return self._linger_protocol(REFUSED, None, settings.deadlines.write)
        client = ClientConnection(self, self._closed, budget=self.budget, peer=peer)
        self._clients.add(client)
        if self.draining:
            client.drain()
        return client

    def _make_room(self, peer: str) -> bool:
        """A slot for a new connection from `peer`, if a connection gives one (`slots.py`)."""
        chosen = slots.choose(self._clients, peer, asyncio.get_running_loop().time())
        if chosen is None:
            return False
        victim, kind = chosen
        self._clients.discard(victim)  # its slot is the newcomer's now
        if kind in ("kept", "fresh"):
            victim.make_way()
            reason = "connections_idle_closed" if kind == "kept" else "connections_silent_closed"
            self.stats.shed[reason] += 1
        else:
            victim.cut_slow_head()
            self.stats.shed["connections_slow_head"] += 1
        self._episode("at max_connections: idle and slow connections make room for new ones")
        return True

    def _episode(self, event: str) -> None:
        """One log line per episode of connections at the limit, not one per connection."""
        if self.stats.episode(event, time.monotonic()):
            self.log.warning(event, limit=self.settings.config.max_connections)

    def linger(
        self,
        transport: asyncio.Transport,
        answer: bytes,
        unread: Hold | None,
        write: float,
        idle: bool,
    ) -> None:
        """A connection's socket, done with, closed by lingering (`linger.py`)."""
        lingering = self._linger_protocol(answer, unread, write, idle)
        transport.set_protocol(lingering)
        lingering.take(transport)

    def _linger_protocol(
        self, answer: bytes, unread: Hold | None, write: float, idle: bool = False
    ) -> Lingering:
        lingering = Lingering(
            self._lingered, answer, unread, write, self._crossed_close if idle else None
        )
        self._lingering.add(lingering)
        if len(self._lingering) >= self.settings.config.max_connections:
            self._listener.hold(True)  # new clients wait in the backlog meanwhile
        return lingering

    def _lingered(self, lingering: Lingering) -> None:
        self._lingering.discard(lingering)
        if len(self._lingering) < self.settings.config.max_connections:
            self._listener.hold(False)

    def _crossed_close(self) -> None:
        """A request came on an idle connection the proxy had closed: it read the 408."""
        self.stats.crossed_close += 1

    def _out_of_descriptors(self, reason: str) -> None:
        """A connection answered 503 for want of file descriptors (the listener's)."""
        self.stats.shed["descriptors"] += 1

    def _closed(self, client: ClientConnection) -> None:
        self._clients.discard(client)
        if not self._clients:
            self._drained.set()

    def refuse(self, writer: ResponseWriter, refusal: Refusal) -> None:
        if refusal.retry_after:  # the budget was spent: shed, not refused
            self._shed(writer, "buffered_bytes")
            return
        self.stats.refused += 1
        error_response(writer, refusal.status, refusal.message, refusal.kind)

    def timed_out(self, phase: str) -> None:
        self.stats.timeouts[phase] += 1

    def begin(self, writer: ResponseWriter, request: ClientRequest, body: bytes) -> Relay | None:
        """Everything up to the upstream write runs here, in the client's data_received."""
        started = time.perf_counter()  # TTFT counts from here: request in -> first token out
        settings = self.settings  # this request's, to its end whatever a reload swaps in
        method, uri, hold = request.method, request.uri, request.hold
        if method == "CONNECT" or not uri.startswith("/"):
            # never an open proxy: these never reach routing
            self.refuse(
                writer,
                Refusal(
                    400, "this proxy forwards only to its configured upstream", "BadRequestError"
                ),
            )
            release(hold)
            return None
        if self.stats.in_flight >= settings.config.max_in_flight:
            self._shed(writer, "in_flight")
            release(hold)
            return None
        fields, trace = carry(request.headers, end_to_end(request.fields))
        self._traced(trace.origin)
        try:
            plan = self._plan(settings, request, body, started, trace)
        except Exception as exc:  # forwarded as it came: a routing bug costs a figure
            self.faults.record("routing", exc)
            route = settings.config.default_route
            watch = Watch(route, started, settings.engine, None, trace=trace)
            plan = _Plan(uri, body, watch)
        pool, engine = settings.pool, settings.engine
        self.stats.in_flight += 1
        return Relay(
            writer,
            method,
            hold,
            plan.watch,
            max_body_bytes=settings.config.max_body_bytes,
            budget=self.budget,
            stats=self.stats,
            faults=self.faults,
            log=self.log,
            send=lambda receiver: pool.send(
                method,
                plan.uri,
                fields,
                plan.body,
                receiver,
                keeps_chunked=engine.keeps_chunked_connections,
            ),
            ended=self._ended,
        )

    def _traced(self, origin: str) -> None:
        """A request's trace context counted by origin; a client's bad one logged at most once
        a period per kind, with the count so far, never its value (a client's bytes)."""
        traces = self.stats.traces
        traces[origin] += 1
        if origin in ("client", "started"):
            return
        if self.stats.every(origin, time.monotonic(), TRACE_LOG_PERIOD):
            self.log.warning(
                "traceparent replaced: not forwarded", reason=origin, replaced=traces[origin]
            )

    def _plan(
        self, settings: Settings, request: ClientRequest, body: bytes, started: float, trace: Trace
    ) -> _Plan:
        method, uri, path = request.method, request.uri, request.path
        parsed, unreadable = request_json(body) if method == "POST" else (None, None)
        # routed and accounted as the upstream reads the path (escapes, dot segments, `//`):
        # a spelling of an accounted endpoint is never relayed unaccounted
        seen = normalized(path)
        match = settings.router.match(seen, request.headers, parsed)
        if match.path != seen:  # a path_prefix removed: the rest of the URI (a query) stays
            uri = match.path + uri[len(path) :]
        unwatched = Watch(match.route, started, settings.engine, None, trace=trace)
        if method != "POST" or match.path not in COMPLETIONS:
            return _Plan(uri, body, unwatched)
        if parsed is None:  # relayed untouched, unaccounted: the client's doing
            self.stats.unreadable[unreadable or "not_an_object"] += 1
            return _Plan(uri, body, unwatched)
        asked = ask(parsed, body, settings.engine, self.objects_missing)
        single = (parsed.get("n") or 1) == 1
        watch = Watch(
            match.route,
            started,
            settings.engine,
            single,
            asked.strip,
            COMPLETIONS[match.path],
            asked.strip_spec,
            request_bands(parsed),
            trace,
        )
        return _Plan(uri, asked.body, watch)

    def _shed(self, writer: ResponseWriter, limit: str) -> None:
        """Past a limit: vLLM's 503 shape, a Retry-After, the connection closed after it."""
        self.stats.shed[limit] += 1
        writer.close_after = True
        what = {
            "in_flight": "requests in flight",
            "buffered_bytes": "buffered bytes",
        }[limit]
        error_response(
            writer,
            503,
            f"the proxy is at its limit of {what}",
            "ServiceUnavailableError",
            retry_after=1,
        )

    def _ended(self, ending: Ending) -> None:
        """A relay's one report: out of flight, and accounted (read as the engine its request
        began with) when it was watched."""
        self.stats.in_flight -= 1
        watch = ending.watch
        if watch is None or watch.single is None:
            return
        try:
            outcome = request_outcome(
                self.model_labels,
                self.accounting.draft_length,
                watch.route,
                watch.started,
                watch.single,
                ending.status,
                ending.tap,
                ending.doc,
                watch.engine,
                watch.bands,
                watch.trace.trace_id if watch.trace is not None else "",
                time.time(),
                time.perf_counter() - watch.started,
            )
            if ending.status == "200" and ending.doc and watch.single:  # never for n > 1
                self.objects_missing = outcome.without_exact in reasons.NO_OBJECT
            self.accounting.record(outcome)
            logged = self.settings.config.request_log
            if logged.enabled:
                self.request_log.offer(outcome, logged)
        except Exception as exc:
            self.faults.record("accounting", exc)
