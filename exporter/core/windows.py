"""Rolling windows over running sums: the increase of each series over the last 1m, 5m, 15m.

A ring of timestamped snapshots per target. The increase over a window is the newest snapshot
minus the newest one at least a window old. A window means its length: while the history is
younger than the window there is no figure for it (a 15m gauge of a sidecar started 2 minutes
ago would be a 2-minute figure under a 15-minute name), unless the caller asks for the part
it covers and says so (`partial`, `covered`: the demo's "over 23s"). A window with no snapshot
inside it has no data: a target that stopped answering loses its derived gauges once the window
has passed, instead of showing stale numbers as live.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from exporter.core.durations import parse_duration


class Subtractable(Protocol):
    def __sub__(self: V, other: V, /) -> V: ...


V = TypeVar("V", bound=Subtractable)
# label values: (model_name, rank), (route, model_name)
Key = TypeVar("Key", bound=tuple[str, ...])


@dataclass(frozen=True, slots=True)
class Window:
    """A rolling window: its label as exported ("5m") and its length in seconds."""

    label: str
    seconds: float


def parse_window(text: str) -> Window:
    """'90s', '5m', '1h30m', '500ms' (Prometheus' grammar) -> Window; ValueError otherwise."""
    length = parse_duration(text)
    if length <= 0:
        raise ValueError(f"a window must be longer than zero: {text!r}")
    return Window(text, length)


DEFAULT_WINDOWS = tuple(parse_window(w) for w in ("1m", "5m", "15m"))


class History(Generic[Key, V]):
    """Snapshots of running sums per key, kept as long as the longest window needs.

    `born_at_zero`: a key missing from the window's baseline began at zero after it (the
    proxy's own route sums), so all of it falls in the window. Otherwise (an engine's lifetime
    counters, first seen mid-life) it counts from its first snapshot."""

    def __init__(
        self, windows: Sequence[Window], born_at_zero: bool = False, resolution: float = 0.0
    ) -> None:
        self.windows = tuple(windows)
        self.born_at_zero = born_at_zero
        # seconds between two kept snapshots (the newest is always kept): a day's window at a
        # second's ticks would hold 86 400 of them
        self.resolution = resolution
        self._keep = max((w.seconds for w in self.windows), default=0.0)
        self._ring: deque[tuple[float, Mapping[Key, V]]] = deque()

    def with_windows(self, windows: Sequence[Window], resolution: float = 0.0) -> History[Key, V]:
        """The same snapshots under new windows (a reload): a window kept keeps its figures,
        a longer new one appears once the snapshots cover it."""
        new: History[Key, V] = History(windows, self.born_at_zero, resolution)
        new._ring = deque(self._ring)
        return new

    def record(self, t: float, snapshot: Mapping[Key, V]) -> None:
        if len(self._ring) >= 2 and t - self._ring[-2][0] < self.resolution:
            self._ring.pop()  # the newest replaces one within the resolution of the one before
        self._ring.append((t, snapshot))
        # drop what no window needs: keep one snapshot at or before the longest window's start
        while len(self._ring) >= 2 and self._ring[1][0] <= t - self._keep:
            self._ring.popleft()

    def increase(self, window: Window, now: float, partial: bool = False) -> dict[Key, V]:
        """Per series, the increase over `window` ending at `now`; empty when it holds no data
        or the history does not cover the window yet (`partial`: then over what it covers,
        `covered(window, now)` seconds)."""
        if not self._ring or self._ring[-1][0] < now - window.seconds:
            return {}
        if not partial and self._ring[0][0] > now - window.seconds:
            return {}
        end_t, end = self._ring[-1]
        start = self._baseline(now - window.seconds)
        result = {}
        for key, counts in end.items():
            base = start.get(key)
            if base is None and self.born_at_zero:
                result[key] = counts
                continue
            if base is None:  # a series first seen inside the window: from its first snapshot
                base = next(
                    (snap[key] for t, snap in self._ring if key in snap and t < end_t), None
                )
            if base is not None:
                result[key] = counts - base
        return result

    def covered(self, window: Window, now: float) -> float:
        """Seconds of `window` the history covers at `now` (the window's length once full)."""
        return min(window.seconds, now - self._ring[0][0]) if self._ring else 0.0

    def _baseline(self, since: float) -> Mapping[Key, V]:
        chosen = self._ring[0][1]
        for t, snap in self._ring:
            if t > since:
                break
            chosen = snap
        return chosen
