"""Watching an OpenAI-style SSE stream on its way through the proxy.

The tap frames the byte stream into events and forwards each one as soon as it is complete (an
event ends at a blank line, its lines ending in LF, CRLF or CR: the SSE grammar, so an upstream
that frames with CRLF is relayed event by event too), parsing only what it must: a cheap byte
test finds the first content token, and only the final usage event (`"choices":[]`) is decoded,
and SGLang's event of details. When the proxy injected `include_usage` (or
`continuous_usage_stats`, or SGLang's `return_spec_tokens_details`) the client did not ask for,
the tap removes what the injection added, so the client gets the bytes the engine would have
sent it.

What is relayed (framing, stripping) and what is only observed (content times, the finish
reason, the usage event, token increments) are kept apart: an exception while observing stops
the observing for that stream, is reported to `on_fault`, and the bytes go on as before.

Bounded: each read is scanned once (the work is proportional to the bytes read, whatever the
size of an event), a partial event beyond `FREE_PENDING` bytes is held in the proxy's budget,
and one larger than `MAX_EVENT` (or than the budget can cover) turns the tap into a plain relay
for the rest of the stream: every byte passes, unobserved (`overflowed`).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from exporter.engines import DEFAULT
from exporter.engines.base import ProxyHooks
from exporter.proxy.budget import Budget, Hold

FREE_PENDING = 4096  # bytes of a partial event held without the budget (per stream)
MAX_EVENT = 1 << 20  # bytes of one event: vLLM's largest, a detailed usage event, is ~50 KB
# a line end, then a blank line's (a CRLF is one line end, never a CR and an LF)
_BOUNDARY = re.compile(rb"(?:\r\n|\n|\r(?!\n))(?:\r\n|\n|\r)")
_USAGE_FIELD = re.compile(rb',"usage":\{[^{}]*\}')
_COMPLETION_TOKENS = re.compile(rb'"completion_tokens":(\d+)')
_FINISH = b'"finish_reason":"'


@dataclass(slots=True)
class StreamTap:
    strip_usage_event: bool = False  # the proxy added include_usage
    strip_usage_fields: bool = False  # the proxy added continuous_usage_stats
    strip_spec_details: bool = False  # the proxy asked for figures that ride in the body
    engine: ProxyHooks = DEFAULT  # the upstream's kind: which events carry its figures
    content_key: bytes = b'"content":"'  # b'"text":"' for /v1/completions
    first_content_at: float | None = None
    last_content_at: float | None = None
    usage: dict[str, Any] | None = None  # the final usage event, decoded
    timings: dict[str, Any] | None = None  # the finish event's own figures (llama.cpp's)
    model: object = None  # the finish event's `model`, when it was decoded for its timings
    spec_details: object = None  # the figures of the engine's own event (SGLang's details)
    finish_reason: str | None = None  # the first one the stream carried
    increments: list[int] = field(default_factory=list)  # tokens per content event
    on_fault: Callable[[BaseException], None] | None = None  # an observation raised
    observing: bool = True  # False once an observation raised: relaying goes on
    budget: Budget | None = None  # holds a partial event beyond FREE_PENDING
    overflowed: bool = False  # an event too large to hold: relayed as it came, unobserved
    _pending: bytearray = field(default_factory=bytearray)  # a partial event
    _hold: Hold | None = None
    _held: list[bytes] = field(default_factory=list)
    _tokens_seen: int = 0

    def feed(self, data: bytes) -> bytes:
        """Bytes in from upstream -> bytes out to the client (whole events only)."""
        if self.overflowed:
            return data
        pending = self._pending
        if pending:  # only the new bytes are scanned (and the 3 before them: a split CRLF)
            scan = max(0, len(pending) - 3)
            pending += data
            buffer: bytes | bytearray = pending
        else:
            scan, buffer = 0, data
        if buffer.find(b"\r", scan) == -1:  # LF framing, vLLM's: one memchr-like search
            end = buffer.rfind(b"\n\n", scan)
            end = -1 if end == -1 else end + 2
            lf = True
        else:
            end, lf = _last_boundary(buffer, scan), False
        if end == -1:
            if not pending:
                pending += data
            return self._keep()
        complete = bytes(buffer[:end]) if pending else data[:end]
        if end < len(buffer):
            self._pending = bytearray(buffer[end:])
            self._keep()
        elif pending:
            self._pending = bytearray()
            self._release()
        if lf and complete.find(b"\n", 0, end - 2) == -1:  # one single-line event
            return self._event(complete)
        if self._plain(complete):
            return complete
        if lf:
            return b"".join(self._event(e + b"\n\n") for e in complete[:-2].split(b"\n\n"))
        return b"".join(self._event(e) for e in _events(complete))

    def flush(self) -> bytes:
        """Whatever is left when upstream ends (a truncated event passes through as it is)."""
        held, self._held = self._held, []
        rest, self._pending = bytes(self._pending), bytearray()
        self._release()
        return b"".join(held) + rest

    def _keep(self) -> bytes:
        """The partial event stays, held in the budget beyond FREE_PENDING; one too large for
        that goes out now with everything after it (the tap is a plain relay from here)."""
        size = len(self._pending)
        if size <= FREE_PENDING:
            self._release()
            return b""
        if size <= MAX_EVENT and self.budget is not None:
            if self._hold is None:
                self._hold = self.budget.hold(0)
            if self._hold is not None and self._hold.grow(size - self._hold.size):
                return b""
        elif size <= MAX_EVENT:
            return b""
        self.overflowed, self.observing = True, False
        return self.flush()

    def _release(self) -> None:
        if self._hold is not None:
            self._hold.release()
            self._hold = None

    def _plain(self, events: bytes) -> bool:
        """Several events that pass unchanged (no finish, no usage, nothing to strip): only
        their content times are taken. Several events arrive in one read under load."""
        if (
            self.strip_usage_fields
            or self._held
            or events.find(_FINISH) != -1
            or events.find(b'"choices":[]') != -1
        ):
            return False
        key = self.content_key
        at = events.find(key)
        while at != -1:
            if events[at + len(key)] != 0x22:  # '"': not an empty string
                self._observe(self._content)
                break
            at = events.find(key, at + len(key))
        return True

    def _event(self, event: bytes) -> bytes:
        # One scan for the common event, a token: vLLM writes the content before the
        # finish reason, and a JSON string cannot hold the key pattern unescaped.
        at = event.find(self.content_key)
        if at != -1 and event[at + len(self.content_key)] != 0x22:  # '"': not an empty string
            self._observe(self._content)
        elif self.engine.details_event(event):
            doc = _decode(event)  # the engine's figures, in their own event before the usage
            self._observe(lambda: self._spec_details(doc))
            out = self.engine.without_asked(event) if self.strip_spec_details else event
            held, self._held = self._held, []
            return b"".join(held) + out
        elif b'"choices":[]' in event and b'"usage"' in event:
            usage = _decode(event)
            self._observe(lambda: self._usage(usage))
            if not self.strip_usage_event:
                return event
            # vLLM stamps the fingerprint on the terminal chunk when no usage chunk follows
            fingerprint = (usage or {}).get("system_fingerprint")
            held, self._held = self._held, []
            return b"".join(_stamp(e, fingerprint) for e in held)
        start = max(at, 0)  # where the finish reason may begin
        if self.strip_usage_fields:
            match = _COMPLETION_TOKENS.search(event)
            if match is not None:
                self._observe(lambda: self._increment(int(match.group(1))))
            event, start = _USAGE_FIELD.sub(b"", event, count=1), 0
        finish = event.find(_FINISH, start)
        if finish != -1:
            if self.finish_reason is None:
                self._observe(lambda: self._finish(event, finish + len(_FINISH)))
            if self.strip_usage_event:
                self._held.append(event)  # until the next event: the usage event, stamping it?
                return b""
        if self._held:  # the finish was not followed by a usage event: on, unstamped, in order
            held, self._held = self._held, []
            return b"".join(held) + event
        return event

    # ------------------------------------------------------------ observations

    def _observe(self, observation: Callable[[], None]) -> None:
        if not self.observing:
            return
        try:
            observation()
        except Exception as exc:  # a bug here must not cost the client a byte
            self.observing = False
            if self.on_fault is not None:
                self.on_fault(exc)

    def _usage(self, usage: dict[str, Any] | None) -> None:
        self.usage = usage

    def _spec_details(self, doc: dict[str, Any] | None) -> None:
        found = self.engine.event_details(doc)
        if found is not None:  # a frame after it may carry other things only (SGLang's ids)
            self.spec_details = found

    def _finish(self, event: bytes, begin: int) -> None:
        self.finish_reason = event[begin : event.find(b'"', begin)].decode("latin-1")
        if self.engine.reads_finish_event(event):  # the request's own figures ride on it
            doc = _decode(event) or {}
            self.timings = self.engine.finish_timings(doc)
            self.model = doc.get("model")  # no usage event follows: the model is here

    def _content(self) -> None:
        now = time.perf_counter()
        if self.first_content_at is None:
            self.first_content_at = now
        self.last_content_at = now

    def _increment(self, tokens: int) -> None:
        """The injected per-event usage's running token count -> this event's increment."""
        if tokens > self._tokens_seen:
            self.increments.append(tokens - self._tokens_seen)
            self._tokens_seen = tokens


def _stamp(event: bytes, fingerprint: Any) -> bytes:
    """Add `"system_fingerprint"` as the last key of a chunk, where vLLM's model puts it."""
    data = event.rstrip(b"\r\n")
    if not isinstance(fingerprint, str) or not data.endswith(b"}"):
        return event
    stamp = b',"system_fingerprint":' + json.dumps(fingerprint).encode()
    return data[:-1] + stamp + b"}" + event[len(data) :]


def _last_boundary(buffer: bytes | bytearray, start: int) -> int:
    """The end of the last complete event in `buffer` (searched from `start`), or -1. A blank
    line of one CR right after an LF at the very end waits for its LF (CRLF framing cut
    between the two); after a CR it is CR framing, complete."""
    end, size = -1, len(buffer)
    for match in _BOUNDARY.finditer(buffer, start):
        if match.end() < size or buffer[size - 1] != 0x0D or buffer[size - 2] != 0x0A:
            end = match.end()
    return end


def _events(complete: bytes) -> list[bytes]:
    """Events of `complete` (whole events), each with its own line ends."""
    out, start = [], 0
    for match in _BOUNDARY.finditer(complete):
        out.append(complete[start : match.end()])
        start = match.end()
    return out


_LINE = re.compile(rb"\r\n|\n|\r")


def event_data(event: bytes) -> bytes:
    """An event's data as the SSE standard reads it (WHATWG HTML, 9.2.6): lines end in CRLF,
    LF or CR; a line starting with ':' is a comment; a field's value follows its first ':',
    one leading space dropped; `data` lines joined with LF, every other field (`id`, `retry`,
    `event`) ignored here; a BOM before the first field is no part of it. What an
    intermediary that re-frames a stream may send: a usage event in any of these forms is
    still read."""
    if event.startswith(b"data: ") and event.find(b"\n", 0, len(event) - 2) == -1:
        return event[6:].rstrip(b"\r\n")  # the common form: one `data: ` line
    data = []
    for line in _LINE.split(event.removeprefix(b"\xef\xbb\xbf")):
        if not line or line.startswith(b":"):
            continue
        name, sep, value = line.partition(b":")
        if name == b"data":
            data.append(value[1:] if sep and value.startswith(b" ") else value)
    return b"\n".join(data)


def _decode(event: bytes) -> dict[str, Any] | None:
    try:
        data = json.loads(event_data(event))
    except ValueError:
        return None
    return data if isinstance(data, dict) else None
