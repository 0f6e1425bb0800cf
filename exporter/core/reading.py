"""What a route's window means, in one place: from the counts the proxy kept over a window, the
route's acceptance, its exact requests' interval, its speedup at the load it ran, what each
draft length would pay it there, and the best one. The collectors, the demo and the bench read
a route through `read_route`; none recomputes any part of it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from exporter.core.counts import Counts, ratios
from exporter.core.payoff import (
    Decode,
    DraftLength,
    Drift,
    Load,
    Speedups,
    StepCurve,
    best_draft_length,
    observed_draft_length,
    options_by_draft_length,
)
from exporter.core.stats import Interval, RequestMoments


@dataclass(frozen=True, slots=True)
class RouteWindow:
    """One route's counts over one window: what a reading is made of."""

    counts: Counts  # drafts, draft and accepted tokens, per position (exact + estimated)
    decoded: Decode = field(default_factory=Decode)  # its streamed requests
    exact: Decode = field(default_factory=Decode)  # those whose decode steps the engine counted
    moments: RequestMoments = field(default_factory=RequestMoments)  # its exact requests'
    load: Load = field(default_factory=lambda: Load(None))  # the engine's (every route's)


@dataclass(frozen=True, slots=True)
class RouteReading:
    acceptance: float | None
    tokens_per_step: float | None  # per verify step
    interval: Interval | None  # of its exact acceptance, from the spread between requests
    payoff: Speedups
    options: list[DraftLength]  # the speedup at each draft length from 0
    best: DraftLength | None  # the best draft length, where the data tell it apart


def read_route(
    window: RouteWindow, curve: StepCurve | None, own_positions: bool, drift: Drift | None = None
) -> RouteReading:
    """The route's reading. `own_positions`: its per-position counts are its requests' own
    (vLLM, SGLang), not the engine's apportioned (llama.cpp: its profile is then modelled).
    `drift`: the model's engine against its curve over the window (`core.payoff.curve_drift`),
    which widens every speculative option's half-width (`Drift.widening`), not the best
    draft length's judgement."""
    r = ratios(window.counts)
    payoff = Speedups.at_load(
        curve, window.load, r.mean_acceptance_length, window.decoded, window.exact
    )
    # the k the engine runs at the batch (a schedule's range), where no step says
    scheduled = None if curve is None else curve.scheduled_draft_length(window.load.running or 1.0)
    interval = window.moments.interval()
    drafted = observed_draft_length(window.counts, payoff, scheduled)
    options = options_by_draft_length(window.counts, payoff, interval, own_positions, drafted)
    # the best draft length is judged on the acceptance's half-widths: the drift moves every
    # speculative option alike where the speculative step moved alone, and none where the
    # whole engine did, which no live figure tells apart (docs/metrics.md)
    best = best_draft_length(options)
    if drift is not None:
        options = [
            replace(o, halfwidth=o.halfwidth + drift.widening(o.speedup))
            if o.draft_length > 0 and o.halfwidth is not None
            else o
            for o in options
        ]
    return RouteReading(r.acceptance, r.mean_acceptance_length, interval, payoff, options, best)
