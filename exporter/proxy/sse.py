"""Watching an OpenAI-style SSE stream on its way through the proxy.

The tap frames the byte stream into events (`data: ...\\n\\n`) and forwards each one as soon as
it is complete, parsing only what it must: a cheap byte test finds the first content token,
and only the final usage event (`"choices":[]`) is decoded, and SGLang's event of details. When
the proxy injected `include_usage` (or `continuous_usage_stats`, or SGLang's
`return_spec_tokens_details`) the client did not ask for, the tap removes what the injection
added, so the client gets the bytes the engine would have sent it.

What is relayed (framing, stripping) and what is only observed (content times, the finish
reason, the usage event, token increments) are kept apart: an exception while observing stops
the observing for that stream, is reported to `on_fault`, and the bytes go on as before.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from exporter.proxy import sglext

_USAGE_FIELD = re.compile(rb',"usage":\{[^{}]*\}')
_COMPLETION_TOKENS = re.compile(rb'"completion_tokens":(\d+)')
_FINISH = b'"finish_reason":"'


@dataclass(slots=True)
class StreamTap:
    strip_usage_event: bool = False  # the proxy added include_usage
    strip_usage_fields: bool = False  # the proxy added continuous_usage_stats
    strip_spec_details: bool = False  # the proxy added SGLang's return_spec_tokens_details
    content_key: bytes = b'"content":"'  # b'"text":"' for /v1/completions
    first_content_at: float | None = None
    last_content_at: float | None = None
    usage: dict[str, Any] | None = None  # the final usage event, decoded
    timings: dict[str, Any] | None = None  # llama.cpp's, from the finish event
    model: object = None  # the finish event's `model`, when it was decoded for its timings
    spec_details: object = None  # SGLang's sglext.spec_tokens_details, from its own event
    finish_reason: str | None = None  # the first one the stream carried
    increments: list[int] = field(default_factory=list)  # tokens per content event
    on_fault: Callable[[BaseException], None] | None = None  # an observation raised
    observing: bool = True  # False once an observation raised: relaying goes on
    _pending: bytes = b""
    _held: list[bytes] = field(default_factory=list)
    _tokens_seen: int = 0

    def feed(self, data: bytes) -> bytes:
        """Bytes in from upstream -> bytes out to the client (whole events only)."""
        buffer = self._pending + data if self._pending else data
        end = buffer.rfind(b"\n\n")
        if end == -1:
            self._pending = buffer
            return b""
        self._pending = buffer[end + 2 :]
        complete = buffer[: end + 2]
        if complete.find(b"\n", 0, end) == -1:  # one single-line event (memchr, not a scan)
            return self._event(complete)
        if self._plain(complete):
            return complete
        return b"".join(self._event(e + b"\n\n") for e in complete[:-2].split(b"\n\n"))

    def flush(self) -> bytes:
        """Whatever is left when upstream ends (a truncated event passes through as it is)."""
        held, self._held = self._held, []
        rest, self._pending = self._pending, b""
        return b"".join(held) + rest

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
        elif b'"choices":[]' in event and b'"sglext":{' in event and b'"usage":null' in event:
            doc = _decode(event)  # SGLang's details, in their own event before the usage event
            self._observe(lambda: self._spec_details(doc))
            out = sglext.without_details(event) if self.strip_spec_details else event
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
        found = sglext.details(doc)
        if found is not None:  # an `event: sglext_ids` frame after it carries ids only
            self.spec_details = found

    def _finish(self, event: bytes, begin: int) -> None:
        self.finish_reason = event[begin : event.find(b'"', begin)].decode("latin-1")
        if b'"timings":{' in event:  # llama.cpp: the request's draft counts ride on it
            doc = _decode(event) or {}
            timings = doc.get("timings")
            self.timings = timings if isinstance(timings, dict) else None
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
    if not isinstance(fingerprint, str) or not event.endswith(b"}\n\n"):
        return event
    return event[:-3] + b',"system_fingerprint":' + json.dumps(fingerprint).encode() + b"}\n\n"


def _decode(event: bytes) -> dict[str, Any] | None:
    try:
        data = json.loads(event.removeprefix(b"data: "))
    except ValueError:
        return None
    return data if isinstance(data, dict) else None
