"""One reading of the routes' accounting, as a scrape shows it: every counter, histogram and
window copied at one instant into values nobody can change. A collector asks for one and
formats it (prometheus/client_python's collectors build their families from one read of their
source); it never reaches into the ledger, nor holds it across reads."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from exporter.core.counts import Counts
from exporter.core.payoff import Decode
from exporter.core.reading import RouteWindow
from exporter.core.slices import SliceCounts
from exporter.core.stats import RequestMoments
from exporter.core.windows import Window

RouteKey = tuple[str, str]  # (route, model_name)
DecodeKey = tuple[str, str, str]  # (route, model_name, source): whose steps are exact
SliceKey = tuple[str, str, str, str]  # (route, model_name, dimension, band)


@dataclass(frozen=True, slots=True)
class Example:
    """One request standing for a histogram bucket (an OpenMetrics exemplar): its trace id
    (32 lowercase hex), the engine's request id (a safe charset, cut to fit), its value, when
    it ended (wall clock) and how long it took."""

    trace_id: str
    request_id: str
    value: float
    at: float
    seconds: float


@dataclass(frozen=True, slots=True)
class Histogram:
    """A histogram's counts per bucket (the last past every bound) and the sum of what it saw;
    `examples`: a request per bucket where it keeps them (None: none yet)."""

    bounds: tuple[float, ...]
    counts: tuple[int, ...]
    sum: float
    examples: tuple[Example | None, ...] = ()

    def cumulative(self) -> list[tuple[str, float]]:
        """The counts by upper bound, cumulative, "+Inf" last: as exposed."""
        running, out = 0, []
        counts = self.counts or (0,) * (len(self.bounds) + 1)
        for bound, count in zip([*map(str, map(float, self.bounds)), "+Inf"], counts, strict=True):
            running += count
            out.append((bound, float(running)))
        return out


@dataclass(frozen=True, slots=True)
class WindowReading:
    """One window ending at the reading's instant: each route's counts, decode, moments and
    load (`core.reading.read_route` makes its figures of them), the engine's work as the ticks
    apportioned it, and the exact requests' moments per route."""

    window: Window
    covered: float  # seconds of it the history covers (the window's length once full)
    routes: Mapping[RouteKey, RouteWindow]  # empty where the reader asked for no batch
    engine: Counts
    moments: Mapping[RouteKey, RequestMoments]


@dataclass(frozen=True, slots=True)
class SliceChange:
    """The exact requests' counts by band over the breakdown's window and over its baseline,
    the one that ends where the window begins (what the history holds of it): what the
    acceptance change is split from."""

    window: Window
    baseline: Window
    in_window: Mapping[SliceKey, SliceCounts]
    in_baseline: Mapping[SliceKey, SliceCounts]


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The accounting at one instant."""

    requests: Mapping[tuple[str, str, str, str], int]  # + status, finish_reason
    without_exact: Mapping[tuple[str, str, str], int]  # + reason
    steps_by_length: Mapping[tuple[str, str, str], int]  # + draft_length
    exact: Mapping[RouteKey, Counts]
    estimated: Mapping[RouteKey, Counts]
    generation_tokens: Mapping[RouteKey, int]
    decode: Mapping[DecodeKey, Decode]
    ttft: Mapping[RouteKey, Histogram]
    decode_rate: Mapping[RouteKey, Histogram]
    moments: Mapping[RouteKey, RequestMoments]
    acceptance: Mapping[RouteKey, Histogram]  # per request
    below_breakeven: Mapping[RouteKey, int]
    runaway: Mapping[RouteKey, int]
    slices: Mapping[SliceKey, SliceCounts]
    windows: tuple[WindowReading, ...]
    change: SliceChange
