"""The proxy's shared counters, in one small object: the exchanges and connections add to it,
the collector reads it (uvicorn's `ServerState`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from exporter.proxy.framing import FRAMING_REASONS

UPSTREAM_ERRORS = ("connection", "closed", "timeout", "broken", "malformed")
LIMITS = ("connections", "in_flight", "buffered_bytes", "descriptors")  # a shed request met
UNREADABLE = ("not_utf8", "invalid_json", "too_deep", "not_an_object")  # completion bodies
TIMEOUTS = ("head", "body", "write", "stalled_body")


def _zeros(keys: tuple[str, ...]) -> dict[str, int]:
    return dict.fromkeys(keys, 0)


@dataclass
class ProxyStats:
    """Counts since start; `in_flight` is a gauge (requests sent upstream, not yet over)."""

    upstream_errors: dict[str, int] = field(default_factory=lambda: _zeros(UPSTREAM_ERRORS))
    framing_errors: dict[str, int] = field(default_factory=lambda: _zeros(FRAMING_REASONS))
    shed: dict[str, int] = field(default_factory=lambda: _zeros(LIMITS))  # 503s past a limit
    timeouts: dict[str, int] = field(default_factory=lambda: _zeros(TIMEOUTS))
    unreadable: dict[str, int] = field(default_factory=lambda: _zeros(UNREADABLE))
    refused: int = 0
    cut_at_drain: int = 0  # requests still running when the drain's grace ran out
    in_flight: int = 0
