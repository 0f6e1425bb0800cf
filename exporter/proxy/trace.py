"""W3C trace context through the proxy: a client's `traceparent` honoured when it is valid,
replaced when it is not, started when there is none; forwarded to the engine, so the engine's
own spans (vLLM's `--otlp-traces-endpoint`) join the client's trace; and handed back to the
client as `traceresponse` (Trace Context Level 2), so a client that sent none learns its id.

Every byte is hostile: only version 00 in its exact 55-byte form is honoured (32 lowercase hex
trace id and 16 of parent id, neither all zeros, 2 hex of flags); a longer, malformed or repeated
one is never forwarded, and with it goes its `tracestate` (the spec: a vendor that cannot parse
traceparent must not use tracestate). The proxy opens no span of its own, so a valid parent id
passes unchanged: the engine's span is the client's span's child, not an unknown one's.
Checked with a length test before any scan, so a value costs at most 55 bytes of work.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

TRACEPARENT: Final = "traceparent"
TRACESTATE: Final = "tracestate"
TRACERESPONSE: Final = "traceresponse"
SIZE: Final = 55  # version 00: 2 + 1 + 32 + 1 + 16 + 1 + 2
# how a trace context came: the client's, started (none sent), or a bad one replaced
ORIGINS: Final = ("client", "started", "malformed", "oversized", "duplicated")
_VALID = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}")
_ZERO_TRACE, _ZERO_PARENT = "0" * 32, "0" * 16


@dataclass(frozen=True, slots=True)
class Trace:
    """One request's trace context: the `traceparent` forwarded, and how it came."""

    traceparent: str
    origin: str  # one of ORIGINS

    @property
    def trace_id(self) -> str:
        return self.traceparent[3:35]


def started() -> Trace:
    """A fresh context, sampled (flags 01): the engine's parent-based sampler records what the
    exemplar will point at."""
    rand = os.urandom(24).hex()
    return Trace(f"00-{rand[:32]}-{rand[32:]}-01", "started")


def verdict(values: list[str]) -> str:
    """How the client's `traceparent` field values read: "client" (honoured) or why not."""
    if len(values) != 1:
        return "duplicated"
    value = values[0]
    if len(value) > SIZE:
        return "oversized"
    found = _VALID.fullmatch(value) if len(value) == SIZE else None
    if found is None or found[1] == _ZERO_TRACE or found[2] == _ZERO_PARENT:
        return "malformed"
    return "client"


def carry(
    headers: Mapping[str, str], fields: list[tuple[str, str]]
) -> tuple[list[tuple[str, str]], Trace]:
    """The fields to send upstream (the client's `fields` with the trace context honoured,
    replaced or started) and the context. `headers`: the request's fields by lower-case name,
    so a request without trace headers (most) costs two dict look-ups and an append."""
    if TRACEPARENT not in headers and TRACESTATE not in headers:
        trace = started()
        return [*fields, (TRACEPARENT, trace.traceparent)], trace
    values = [v for k, v in fields if len(k) == 11 and k.lower() == TRACEPARENT]
    origin = verdict(values) if values else "started"  # a lone tracestate is ignored
    sent = values[0] if origin == "client" else started().traceparent
    trace = Trace(sent, origin)
    keep_state = origin == "client"
    out = [
        (k, v)
        for k, v in fields
        if k.lower() not in (TRACEPARENT, TRACESTATE) or (keep_state and k.lower() == TRACESTATE)
    ]
    out.append((TRACEPARENT, trace.traceparent))
    return out, trace


def response_field(trace: Trace) -> tuple[str, str]:
    """`traceresponse` for the client: the context the engine got (its trace id first)."""
    return (TRACERESPONSE, trace.traceparent)
