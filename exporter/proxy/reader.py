"""Bytes from one client connection -> its complete requests, in order.

The shape OpenAI clients send is taken by `request.quick`; anything else (pipelined requests
after the first, chunked bodies, `Expect: 100-continue`, upgrades, malformed heads) by llhttp
through httptools, the maintained binding uvicorn uses, with aiohttp's server limits on top
(line and field sizes, header count, RFC 9110 singletons, Host on HTTP/1.1; llhttp
itself refuses control bytes in fields), so what is
accepted is what an aiohttp server accepts. Bodies are passed on as sent (no decompression);
chunked bodies are de-chunked here and re-framed with a Content-Length upstream; their
trailer fields are dropped, never merged into the head (RFC 9110 §6.5.1), and no transfer
coding but `chunked` is taken (501). Body bytes are held in the proxy's `Budget`: a body
declared larger than it can cover is refused with 503 before it is read.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import httptools

from exporter.proxy.budget import Budget, Hold
from exporter.proxy.request import MAX_HEADERS, MORE, SINGLETONS, ClientRequest, quick

MAX_LINE = 8190  # bytes of the request target (aiohttp's max_line_size)
MAX_FIELD = 8190  # bytes of a header field, name and value (aiohttp's max_field_size)
MAX_HEAD = MAX_LINE + MAX_HEADERS * (MAX_FIELD + 4)  # bytes before a head must be complete


@dataclass(frozen=True, slots=True)
class Refusal:
    """A request that cannot be served: answered with `status`, then the connection closes."""

    status: int
    message: str
    kind: str  # the error `type` in vLLM's error shape
    retry_after: bool = False  # a 503: the budget was spent; the same request may come again


BUSY = Refusal(503, "the proxy is at its limit of buffered bytes", "ServiceUnavailableError", True)


class _Invalid(Exception):
    """Raised from a parser callback: llhttp stops and `feed_data` raises it on."""


class RequestReader:
    """Feeds on a connection's reads; `ready` holds complete requests (and, after them, at
    most one Refusal), oldest first. Once llhttp has seen bytes of a connection it keeps it."""

    def __init__(self, max_body: int, budget: Budget | None = None) -> None:
        self.max_body = max_body
        self.budget = budget or Budget(1 << 62)
        self.ready: deque[tuple[ClientRequest, bytes] | Refusal] = deque()
        self.upgraded = False  # the rest of the bytes belong to another protocol: ignored
        self.wants_continue = False  # the request being read asked for 100 Continue
        self._raw = bytearray()  # a request `quick` has not got whole yet
        self._need = 0  # bytes of it needed: its head and Content-Length, once known
        self._hold: Hold | None = None  # the budget's bytes for the body being read
        self._llhttp: Llhttp | None = None
        self._refused = False

    def feed(self, data: bytes) -> None:
        if self._refused or self.upgraded:
            return
        if self._llhttp is None:
            data = self._quick(data)
            if not data:
                return
            self._llhttp = Llhttp(self)
        self._llhttp.feed(data)

    @property
    def head_pending(self) -> bool:
        """Bytes of a request head have come, the head is not whole yet."""
        if self._llhttp is not None:
            return self._llhttp.head_pending
        return bool(self._raw) and not self._need

    @property
    def body_pending(self) -> bool:
        """A request's head is whole, its body is not."""
        if self._llhttp is not None:
            return self._llhttp.body_pending
        return self._need > 0

    def refuse(self, refusal: Refusal) -> None:
        """Nothing after a refusal is read: its answer closes the connection."""
        self._refused = True
        self.release()
        self.ready.append(refusal)

    def hold(self, size: int) -> Hold | None:
        """Budget for the body being read (one hold per request, grown as chunks come)."""
        if self._hold is None:
            self._hold = self.budget.hold(size)
            return self._hold
        return self._hold if self._hold.grow(size) else None

    def taken(self) -> Hold | None:
        """The complete request's hold, handed on with it."""
        hold, self._hold = self._hold, None
        return hold

    def release(self) -> None:
        """The connection is gone or refused: its buffers are freed now (not when the
        collector gets to the connection's cycles) and their bytes go back to the budget."""
        self._raw = bytearray()
        if self._llhttp is not None:
            self._llhttp.drop()
        if self._hold is not None:
            self._hold.release()
            self._hold = None
        for item in self.ready:
            if not isinstance(item, Refusal) and item[0].hold is not None:
                item[0].hold.release()

    def _quick(self, data: bytes) -> bytes:
        """Take what `quick` can; return the bytes left for llhttp."""
        raw = self._raw
        raw += data  # a bytearray: a long body in many reads is not copied over and over
        if len(raw) < self._need:
            return b""  # the body is on its way: the head was parsed already
        got = quick(raw)
        if got == MORE:
            return b""
        if not isinstance(got, tuple):
            rest = bytes(raw)
            raw.clear()
            return rest
        request, start, length = got
        if not self._need and length:  # the head just came: hold its body's bytes
            if length > self.max_body:
                self.refuse(too_large(self.max_body))
                return b""
            if self.hold(length) is None:
                self.refuse(BUSY)
                return b""
        if len(raw) < start + length:
            self._need = start + length
            return b""
        view = memoryview(raw)
        body, rest = bytes(view[start : start + length]), bytes(view[start + length :])
        view.release()
        raw.clear()
        self._need = 0
        request.hold = self.taken()
        self.ready.append((request, body))
        return rest  # pipelined requests: llhttp's from here


def too_large(max_body: int) -> Refusal:
    return Refusal(413, f"request body larger than {max_body} bytes", "RequestEntityTooLarge")


class Llhttp:
    """httptools' callbacks collecting one request at a time for the reader."""

    def __init__(self, reader: RequestReader) -> None:
        self.reader = reader
        self.parser = httptools.HttpRequestParser(self)
        self._url = bytearray()
        self._fields: list[tuple[str, str]] = []
        self._body = bytearray()
        self._request: ClientRequest | None = None
        self._head_bytes = 0  # fed since the current head began: httptools buffers a field whole
        self._trailers = 0  # trailer fields of the body being read: dropped, but counted
        self.head_pending = False  # between a message's first byte and its complete head

    @property
    def body_pending(self) -> bool:
        return self._request is not None

    def drop(self) -> None:
        """A refusal: the request being read is given up, its body's bytes freed."""
        self._body = bytearray()
        self._request = None

    def feed(self, data: bytes) -> None:
        if self._request is None:
            self._head_bytes += len(data)
            if self._head_bytes > MAX_HEAD:
                self.reader.refuse(_bad(f"request head longer than {MAX_HEAD} bytes"))
                return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self.reader.upgraded = True  # answered as a plain request; then we close
        except httptools.HttpParserError as exc:
            cause = exc.__context__ if isinstance(exc.__context__, _Invalid) else None
            if cause is not None:
                self.reader.refuse(cause.args[0])
            else:
                self.reader.refuse(Refusal(400, _reason(exc), "BadRequestError"))

    # --- httptools' protocol -----------------------------------------------------------

    def on_message_begin(self) -> None:
        self.head_pending = True
        self._head_bytes = 0
        self._url.clear()
        self._fields = []
        self._body = bytearray()
        self._request = None
        self._trailers = 0

    def on_url(self, url: bytes) -> None:
        self._url += url
        if len(self._url) > MAX_LINE:
            raise _Invalid(_bad(f"request target longer than {MAX_LINE} bytes"))

    def on_header(self, name: bytes, value: bytes) -> None:
        # httptools hands over a field whole (it joins pieces across reads)
        if len(name) + len(value) > MAX_FIELD:
            raise _Invalid(_bad(f"header field longer than {MAX_FIELD} bytes"))
        if self._request is not None:  # a trailer of a chunked body: never a header
            self._trailers += 1
            if len(self._fields) + self._trailers > MAX_HEADERS:
                raise _Invalid(_bad("too many headers received"))
            return
        self._fields.append(
            (
                name.decode("utf-8", "surrogateescape"),
                value.rstrip(b" \t").decode("utf-8", "surrogateescape"),
            )
        )
        if len(self._fields) > MAX_HEADERS:
            raise _Invalid(_bad("too many headers received"))

    def on_headers_complete(self) -> None:
        self.head_pending = False
        parser = self.parser
        version = (1, 1) if parser.get_http_version() == "1.1" else (1, 0)
        headers: dict[str, str] = {}
        for name, value in self._fields:
            lower = name.lower()
            if lower not in headers:
                headers[lower] = value
            elif lower in SINGLETONS:
                raise _Invalid(_bad(f"Duplicate '{name}' header found."))
        if version == (1, 1) and "host" not in headers:
            raise _Invalid(_bad("Missing 'Host' header in request."))
        coding = headers.get("transfer-encoding")
        if coding is not None and coding.strip().lower() != "chunked":
            raise _Invalid(
                Refusal(501, f"transfer coding {coding[:40]!r} not implemented", "NotImplemented")
            )
        uri = self._url.decode("utf-8", "surrogateescape")
        path = uri.split("?", 1)[0] if uri.startswith("/") else uri
        self._request = ClientRequest(
            parser.get_method().decode("ascii", "replace"),
            uri,
            path,
            version,
            headers,
            self._fields,
            not parser.should_keep_alive(),
            parser.should_upgrade(),
        )
        declared = headers.get("content-length", "0")
        if declared.isdigit() and int(declared) > self.reader.max_body:
            raise _Invalid(too_large(self.reader.max_body))
        if declared.isdigit() and int(declared) and self.reader.hold(int(declared)) is None:
            raise _Invalid(BUSY)
        self.reader.wants_continue = (
            version == (1, 1) and headers.get("expect", "").lower() == "100-continue"
        )

    def on_body(self, body: bytes) -> None:
        reader, request = self.reader, self._request
        assert request is not None
        if len(self._body) + len(body) > reader.max_body:
            raise _Invalid(too_large(reader.max_body))
        if "content-length" not in request.headers and reader.hold(len(body)) is None:
            raise _Invalid(BUSY)  # a chunked body grows its hold piece by piece
        self._body += body

    def on_message_complete(self) -> None:
        request, self._request = self._request, None
        assert request is not None
        self.reader.wants_continue = False
        request.hold = self.reader.taken()
        body, self._body = bytes(self._body), bytearray()
        self.reader.ready.append((request, body))


def _bad(message: str) -> Refusal:
    return Refusal(400, message, "BadRequestError")


def _reason(exc: httptools.HttpParserError) -> str:
    """llhttp's own words ("Invalid method encountered"), without its error code."""
    text = str(exc) or "bad request"
    return text.split(": ", 1)[-1] if text.startswith("HPE_") else text
