"""One request between its client and the upstream, once it is on its way: the response
held whole or relayed as it comes, upstream failures answered in vLLM's error shape, and
the request accounted once when it ends, fails or its client goes."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from exporter.core.faults import Faults
from exporter.engines.base import ProxyHooks
from exporter.proxy.budget import Budget, Hold
from exporter.proxy.framing import Head
from exporter.proxy.responses import end_to_end, error_response, release, request_json
from exporter.proxy.sse import StreamTap
from exporter.proxy.stats import ProxyStats
from exporter.proxy.trace import TRACERESPONSE, Trace, response_field
from exporter.proxy.upstream import (
    Broken,
    Closed,
    Exchange,
    Malformed,
    OutOfDescriptors,
    Receiver,
    Unreachable,
)
from exporter.proxy.writer import ResponseWriter


@dataclass(frozen=True, slots=True)
class Watch:
    """What is watched of a completion: accounted to `route` when it ends (`started`: TTFT's
    origin; `single`: one choice), and for a stream what the tap removes and reads."""

    route: str
    started: float
    engine: ProxyHooks  # the request's upstream kind: what it sends, how it is read
    single: bool | None  # None: not accounted
    strip: tuple[bool, bool] | None = None  # a streamed completion: usage members to remove
    content_key: bytes = b""
    strip_spec: bool = False  # the proxy asked for figures in the body the client did not
    bands: tuple[str, str] = ("unset", "text")  # its temperature and output bands (core.slices)
    trace: Trace | None = None  # its trace context, as forwarded (`trace.py`)


@dataclass(frozen=True, slots=True)
class Ending:
    """How a request ended, reported once: its status, and for an accounted one the tap and the
    decoded response or usage event (None: relayed unread)."""

    status: str
    watch: Watch | None  # None: nothing to account
    tap: StreamTap | None
    doc: dict[str, Any] | None


class Relay:
    """One request between its client and the upstream: the upstream's `Receiver` and the
    client's `Call`. A response the proxy must read (a non-streamed completion, decoded for its
    usage; SGLang's, cut) is held whole, within the budget; any other is relayed as it comes, a
    stream SSE event by event. Built whole, the request sent from its constructor; it reports
    its end through `ended`, once."""

    def __init__(
        self,
        writer: ResponseWriter,
        method: str,
        hold: Hold | None,
        watch: Watch | None,
        *,
        max_body_bytes: int,
        budget: Budget,
        stats: ProxyStats,
        faults: Faults,
        log: Any,
        send: Callable[[Receiver], Exchange],
        ended: Callable[[Ending], None],
    ) -> None:
        self.writer = writer
        self.method = method
        self._watch = watch if watch is not None and watch.single is not None else None
        # the response without what the proxy asked for (the client did not)
        self.without_asked = watch.engine.without_asked if watch and watch.strip_spec else None
        self._max_body_bytes = max_body_bytes
        self._budget = budget
        self._stats = stats
        self._faults = faults
        self._log = log
        self._ended = ended
        trace = watch.trace if watch is not None else None
        # the trace id back to the client, on the engine's answer and on the proxy's own
        self._extra = () if trace is None else (response_field(trace),)
        self._hold = hold  # the request body's bytes, then the response's while it is held
        self._whole: list[bytes] | None = None  # a body held whole
        self._unread = False  # a body that had to be read, relayed unread (too large)
        self._over = False  # ended, failed or gone: reported once
        self._head: Head | None = None
        self._headers: list[tuple[str, str]] = []  # the head's end-to-end fields
        self.tap: StreamTap | None = None  # on streamed completions
        if watch is not None and watch.strip is not None:
            self.tap = StreamTap(
                *watch.strip,
                strip_spec_details=watch.strip_spec,
                engine=watch.engine,
                content_key=watch.content_key,
                on_fault=self.tap_fault,
                budget=budget,
            )
        self.exchange: Exchange = send(self)

    # the upstream's side
    def head(self, head: Head) -> None:
        self._head = head
        self._headers = end_to_end(head.headers)
        if self._extra and head.get(TRACERESPONSE) is None:  # an engine's own one wins
            self._headers.extend(self._extra)
        release(self._hold)  # the upstream has read the request: its bytes are freed
        self._hold = None
        length = head.get("Content-Length")
        if self.method == "HEAD" or head.status in (204, 304):
            self._whole = []
        elif length is not None and (self._watch is not None or self.without_asked is not None):
            size = int(length)
            if size <= self._max_body_bytes:
                self._hold = self._budget.hold(size)
            if self._hold is not None:
                self._whole = []
            else:  # relayed as it comes: the client's bytes go first, the figure is lost
                self._unread = True
                self.writer.start_stream(head.status, head.reason, self._headers, length)
        else:
            self.writer.start_stream(head.status, head.reason, self._headers, length)

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
            self._whole = None
            headers = self._headers
            length = head.get("Content-Length")
            if self.method == "HEAD" and length is not None:  # what a GET would have sent
                headers.append(("Content-Length", length))
            out = self.without_asked(body) if self.without_asked is not None else body
            self.writer.respond(
                head.status, head.reason, headers, out, head_only=self.method == "HEAD"
            )
            self.writer.keep(self._hold)  # held on while the client has not taken it
            self._hold = None
        else:
            rest = self.tap.flush() if self.tap is not None else b""
            self.writer.end_stream(rest)
        self._done(str(head.status), body)

    def fail(self, error: BaseException) -> None:
        writer = self.writer
        if isinstance(error, OutOfDescriptors):  # ours, not the engine's: shed, not an error
            self._stats.shed["descriptors"] += 1
            if self._stats.episode("descriptors", time.monotonic()):
                self._log.warning("out of file descriptors for upstream connections: 503")
            writer.close_after = True  # its descriptor back too
            error_response(
                writer, 503, "the proxy is out of file descriptors", "ServiceUnavailableError",
                retry_after=1, extra=self._extra,
            )  # fmt: skip
            self._done("503", None)
            return
        if isinstance(error, TimeoutError):
            reason, status = "timeout", "504"
            error_response(writer, 504, "upstream timed out", "GatewayTimeout", extra=self._extra)
        elif isinstance(error, Broken):  # cut or malformed: after the head, or before it
            reason, status = "malformed" if isinstance(error, Malformed) else "broken", "502"
            if isinstance(error, Malformed):
                self._stats.framing_errors[error.reason] += 1
            self._log.warning("upstream response broken", error=str(error)[:200])
            if self._head is None or self._whole is not None:  # nothing went to the client
                error_response(
                    writer, 502, "upstream response broken", "BadGateway", extra=self._extra
                )
            else:
                writer.abort()  # the client must see the break, not a clean end
        else:
            reason = "closed" if isinstance(error, Closed) else "connection"
            status = "502"
            self._log.warning(
                "upstream unreachable" if isinstance(error, Unreachable) else "upstream hung up",
                error=str(error)[:200] or type(error).__name__,
            )
            error_response(writer, 502, "upstream unreachable", "BadGateway", extra=self._extra)
        self._stats.upstream_errors[reason] += 1
        self._done(status, None)

    # the client's side
    def resume(self) -> None:
        self.exchange.resume()

    def gone(self) -> None:
        self.exchange.abort()  # the upstream connection is dropped: vLLM aborts
        self._done("499", None)

    def tap_fault(self, error: BaseException) -> None:
        """The tap's observing raised: the stream goes on, unaccounted."""
        self._faults.record("tap", error)
        self._watch = None

    def _done(self, status: str, body: bytes | None) -> None:
        """Once per call: its held bytes are freed and its end reported (beside the bytes,
        which are all out by now), with what accounting needs when it is watched."""
        if self._over:
            return
        self._over = True
        release(self._hold)
        self._hold = None
        self._whole = None
        doc: dict[str, Any] | None = {}
        watch = self._watch
        if watch is not None:
            try:
                if self._unread:
                    doc = None
                elif body is not None:
                    doc = (request_json(body)[0] if status == "200" else None) or {}
                elif self.tap is not None:
                    doc = None if self.tap.overflowed else self.tap.usage or {}
            except Exception as exc:
                self._faults.record("accounting", exc)
                watch = None
        self._watch = None
        self._ended(Ending(status, watch, self.tap, doc))
