"""One request between its client and the upstream, once it is on its way: the response
held whole or relayed as it comes, upstream failures answered in vLLM's error shape, and
the request accounted once when it ends, fails or its client goes."""

from __future__ import annotations

import json
from http import HTTPStatus
from typing import TYPE_CHECKING, Any

from exporter.proxy import sglext
from exporter.proxy.budget import Hold
from exporter.proxy.framing import Head
from exporter.proxy.sse import StreamTap
from exporter.proxy.upstream import Broken, Closed, Exchange, Malformed, Unreachable
from exporter.proxy.writer import ResponseWriter, date_header

if TYPE_CHECKING:  # the proxy creates its relays; a relay reports back to it
    from exporter.proxy.forward import Proxy

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


class Relay:
    """One request between its client and the upstream: the upstream's `Receiver` and the
    client's `Call`. A response the proxy must read (a non-streamed completion, decoded for its
    usage; SGLang's, cut) is held whole, within the budget; any other is relayed as it comes, a
    stream SSE event by event."""

    def __init__(
        self, proxy: Proxy, writer: ResponseWriter, method: str, hold: Hold | None
    ) -> None:
        self.proxy = proxy
        self.writer = writer
        self.method = method
        self.tap: StreamTap | None = None  # on streamed completions
        self.exchange: Exchange | None = None
        self.account: tuple[str, float, bool] | None = None  # route, start, single choice
        self.strip_spec = False  # SGLang: cut the details the proxy asked for out of the body
        self._hold = hold  # the request body's bytes, then the response's while it is held
        self._whole: list[bytes] | None = None  # a body held whole
        self._unread = False  # a body that had to be read, relayed unread (too large)
        self._over = False  # ended, failed or gone: counted out of flight, accounted
        self._head: Head | None = None
        self._headers: list[tuple[str, str]] = []  # the head's end-to-end fields

    # the upstream's side
    def head(self, head: Head) -> None:
        self._head = head
        self._headers = end_to_end(head.headers)
        release(self._hold)  # the upstream has read the request: its bytes are freed
        self._hold = None
        length = head.get("Content-Length")
        if self.method == "HEAD" or head.status in (204, 304):
            self._whole = []
        elif length is not None and (self.account is not None or self.strip_spec):
            size = int(length)
            if size <= self.proxy.config.max_body_bytes:
                self._hold = self.proxy.budget.hold(size)
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
            out = sglext.without_details(body) if self.strip_spec else body
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
        proxy, writer = self.proxy, self.writer
        if isinstance(error, TimeoutError):
            reason, status = "timeout", "504"
            error_response(writer, 504, "upstream timed out", "GatewayTimeout")
        elif isinstance(error, Broken):  # cut or malformed: after the head, or before it
            reason, status = "malformed" if isinstance(error, Malformed) else "broken", "502"
            if isinstance(error, Malformed):
                proxy.framing_errors[error.reason] += 1
            proxy.log.warning("upstream response broken", error=str(error)[:200])
            if self._head is None or self._whole is not None:  # nothing went to the client
                error_response(writer, 502, "upstream response broken", "BadGateway")
            else:
                writer.abort()  # the client must see the break, not a clean end
        else:
            reason = "closed" if isinstance(error, Closed) else "connection"
            status = "502"
            proxy.log.warning(
                "upstream unreachable" if isinstance(error, Unreachable) else "upstream hung up",
                error=type(error).__name__,
            )
            error_response(writer, 502, "upstream unreachable", "BadGateway")
        proxy.upstream_errors[reason] += 1
        self._done(status, None)

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
        """Once per call: it is no longer in flight, its held bytes are freed, and it is
        accounted (beside the bytes, which are all out by now)."""
        if self._over:
            return
        self._over = True
        release(self._hold)
        self._hold = None
        self._whole = None
        proxy = self.proxy
        proxy.in_flight -= 1
        if self.account is None:
            return
        try:
            doc: dict[str, Any] | None = {}
            if self._unread:
                doc = None
            elif body is not None:
                doc = (request_json(body)[0] if status == "200" else None) or {}
            elif self.tap is not None:
                doc = None if self.tap.overflowed else self.tap.usage or {}
            proxy.account(self.account, status, self.tap, doc)
        except Exception as exc:
            proxy.faults.record("accounting", exc)
        self.account = None


def end_to_end(fields: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """`fields` without the hop-by-hop ones: the fixed set and those `Connection` names
    (RFC 9110 §7.6.1)."""
    drop = HOP_BY_HOP
    for name, value in fields:
        if name.lower() == "connection":
            drop = drop | {token.strip().lower() for token in value.split(",")}
    return [(k, v) for k, v in fields if k.lower() not in drop]


def request_json(body: bytes) -> tuple[dict[str, Any] | None, str | None]:
    """A body as a JSON object, or None and why not (an `UNREADABLE` reason). Only UTF-8 (what
    the splice writes): json.loads would also take UTF-16 and -32."""
    try:
        data = json.loads(body.decode("utf-8"))
    except UnicodeDecodeError:
        return None, "not_utf8"
    except ValueError:
        return None, "invalid_json"
    except RecursionError:
        return None, "too_deep"
    return (data, None) if isinstance(data, dict) else (None, "not_an_object")


def release(hold: Hold | None) -> None:
    if hold is not None:
        hold.release()


def error_response(
    writer: ResponseWriter, status: int, message: str, kind: str, retry_after: int | None = None
) -> None:
    """OpenAI-shaped error, like vLLM's own."""
    body = {"error": {"message": message, "type": kind, "param": None, "code": status}}
    reason = HTTPStatus(status).phrase
    headers = [("Content-Type", "application/json"), date_header()]
    if retry_after is not None:
        headers.append(("Retry-After", str(retry_after)))
    writer.respond(status, reason, headers, json.dumps(body).encode())
