"""The proxy's shared counters, in one small object: the exchanges and connections add to it,
the collector reads it (uvicorn's `ServerState`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from exporter.proxy.framing import FRAMING_REASONS
from exporter.proxy.trace import ORIGINS

UPSTREAM_ERRORS = ("connection", "closed", "timeout", "broken", "malformed")
# a limit a request was shed at (503), and how a connection was made to give its slot to a
# new one at max_connections: a keep-alive one between requests (closed), a new one that sent
# nothing (503, closed), or a head arriving (408)
LIMITS = (
    "connections",
    "in_flight",
    "buffered_bytes",
    "descriptors",
    "connections_idle_closed",
    "connections_silent_closed",
    "connections_slow_head",
)
UNREADABLE = ("not_utf8", "invalid_json", "too_deep", "not_an_object")  # completion bodies
TIMEOUTS = ("head", "body", "write", "stalled_body")
EPISODE_QUIET = 10.0  # seconds without an occurrence that end an episode


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
    traces: dict[str, int] = field(default_factory=lambda: _zeros(ORIGINS))  # by origin
    refused: int = 0
    crossed_close: int = 0  # requests that came on an idle connection as the proxy closed it
    cut_at_drain: int = 0  # requests still running when the drain's grace ran out
    in_flight: int = 0
    # when each kind of episode was last logged (one line per episode, not per connection)
    logged: dict[str, float] = field(default_factory=dict)

    def episode(self, kind: str, now: float, quiet: float = EPISODE_QUIET) -> bool:
        """Whether an occurrence of `kind` at `now` starts a new episode (none in the last
        `quiet` seconds): the one to log."""
        last = self.logged.get(kind)
        self.logged[kind] = now
        return last is None or now - last > quiet

    def every(self, kind: str, now: float, period: float) -> bool:
        """Whether an occurrence of `kind` at `now` is the one to log: none logged in the last
        `period` seconds (a steady flood logs one line a period, not one per request)."""
        last = self.logged.get(kind)
        if last is not None and now - last < period:
            return False
        self.logged[kind] = now
        return True
