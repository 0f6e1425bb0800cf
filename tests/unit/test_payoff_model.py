"""The payoff model's properties, on engines built here (no recorded run: a figure one GPU session
gave is checked in bench/, never pinned here):

- the plain step now is the observed step over measure's cost ratio at the load, so whatever
  scales both steps alike (a slower card, the clock, the engine's history) cancels;
- a common change of context (the KV every step reads) cancels through the curve's
  per-context slopes, in both directions, where a ratio read at measure's context does not;
- monotone in acceptance; x1.0 exactly when the window's steps drafted nothing, with no
  options; a schedule's straddled bands by the drafts per step;
- the steps by draft length: measured lengths as measured, past the longest by the last
  increment, never cheaper;
- the engine's drift from its curve (`curve_drift`): the live step over the curve's at the same
  batch, context and drafts per step reads any shift of the step, 1.0 without one; under a
  schedule's k = 0 the plain step's own; the tolerance measure's error over its run at the
  batch (`*_spread`), at least DRIFT_FLOOR; the drift widens the options' half-widths so the
  band reaches the truth whichever step moved.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest

from exporter.core.counts import Counts
from exporter.core.payoff import (
    DRIFT_FLOOR,
    Decode,
    Drift,
    Load,
    Speedups,
    StepCurve,
    StepPoint,
    curve_drift,
    options_by_draft_length,
    speedups_by_draft_length,
)
from exporter.core.reading import RouteWindow, read_route
from exporter.core.schedule import Schedule
from exporter.core.stats import RequestMoments

K = 3


@dataclass(frozen=True)
class Engine:
    """A step-time law of the shape real engines have: a weight pass, compute per token
    processed, a drafter per draft, and a KV read per token of context in the batch, shared by
    the k + 1 queries of a verify step (`kv_queries` = 0) or growing with them."""

    weights: float = 0.010
    per_token: float = 0.0002
    draft: float = 0.0015
    kv: float = 2e-7
    kv_queries: float = 0.0
    scale: float = 1.0  # what measure's and the live traffic do not share: the card, the clock

    def step(self, drafts: float, batch: float, context: float) -> float:
        kv = self.kv * batch * context * (1 + self.kv_queries * drafts)
        compute = self.per_token * batch * (drafts + 1)
        return self.scale * (self.weights + compute + self.draft * drafts + kv)

    def point(self, batch: float, context: float, long: float) -> StepPoint:
        """What `specdec measure` finds at one level, at two contexts."""
        plain, verify = self.step(0, batch, context), self.step(K, batch, context)
        return StepPoint(
            batch,
            plain,
            verify,
            context=context,
            plain_per_context_token=(self.step(0, batch, long) - plain) / (long - context),
            verify_per_context_token=(self.step(K, batch, long) - verify) / (long - context),
        )

    def curve(self, context: float, long: float | None = None) -> StepCurve:
        """measure's curve at 1, 8, 32; at one context only where `long` is None."""
        points = []
        for b in (1.0, 8.0, 32.0):
            p = self.point(b, context, long or 2 * context)
            if long is None:
                p = StepPoint(b, p.plain_seconds, p.verify_seconds)
            points.append(p)
        return StepCurve(tuple(points), K)


def window(engine: Engine, tokens_per_step: float, batch: float, context: float) -> Decode:
    """A route's counted requests over a window: 1000 decode steps of K drafts each."""
    steps = 1000.0
    seconds = steps * engine.step(K, batch, context)
    return Decode(steps * tokens_per_step, seconds, steps, K * steps, seconds * context, seconds)


def truth(engine: Engine, tokens_per_step: float, batch: float, context: float) -> float:
    return tokens_per_step * engine.step(0, batch, context) / engine.step(K, batch, context)


@pytest.mark.parametrize("kv_queries", [0.0, 0.5])  # vLLM's shared KV read; llama.cpp's more
@pytest.mark.parametrize("batch", [1.0, 8.0, 32.0])
@pytest.mark.parametrize("live_context", [125.0, 2000.0])  # 1/4 and 4x measure's
def test_a_common_context_change_cancels(
    kv_queries: float, batch: float, live_context: float
) -> None:
    engine = Engine(kv_queries=kv_queries)
    curve = engine.curve(500.0, 1500.0)
    seen = window(engine, 2.1, batch, live_context)
    load = Load(batch, seen.context, seen.drafts_per_step)
    payoff = Speedups.at_load(curve, load, None, seen, seen)
    assert payoff.estimated == pytest.approx(truth(engine, 2.1, batch, live_context), rel=1e-6)
    assert payoff.measured == pytest.approx(payoff.estimated, rel=1e-6)
    assert payoff.plain_seconds == pytest.approx(engine.step(0, batch, live_context), rel=1e-6)
    # measure at one context only: the ratio there, wrong by the KV's share once it moves
    blind = Speedups.at_load(engine.curve(500.0), load, None, seen, seen)
    assert blind.estimated is not None
    if batch == 32.0 and kv_queries == 0.0:
        assert abs(blind.estimated / truth(engine, 2.1, batch, live_context) - 1) > 0.05


@pytest.mark.parametrize("scale", [0.8, 1.25])
def test_what_scales_both_steps_cancels(scale: float) -> None:
    """The live engine runs 25 % slower (or 20 % faster) than when measure ran: the plain step
    now scales with it, the speedup does not move."""
    measured_on, live = Engine(), Engine(scale=scale)
    seen = window(live, 3.1, 8.0, 500.0)
    payoff = Speedups.at_load(
        measured_on.curve(500.0, 1500.0), Load(8.0, 500.0, K), None, seen, seen
    )
    assert payoff.estimated == pytest.approx(truth(live, 3.1, 8.0, 500.0), rel=1e-6)
    assert payoff.plain_seconds == pytest.approx(live.step(0, 8.0, 500.0), rel=1e-6)


def test_monotone_in_acceptance() -> None:
    engine = Engine()
    curve = engine.curve(500.0, 1500.0)
    figures = []
    for tokens_per_step in (1.2, 1.8, 2.4, 3.0, 3.6):
        seen = window(engine, tokens_per_step, 16.0, 800.0)
        load = Load(16.0, seen.context, seen.drafts_per_step)
        figures.append(Speedups.at_load(curve, load, None, seen, seen).estimated)
    assert figures == sorted(figures) and len(set(figures)) == len(figures)
    # the options too: a profile that accepts more at every position pays more at every k' > 0
    payoff = Speedups.at_load(curve, Load(16.0, 800.0, K), None, seen, seen)
    low = speedups_by_draft_length((0.5, 0.3, 0.2), 1.0, payoff.costs, None)
    high = speedups_by_draft_length((0.6, 0.4, 0.3), 1.0, payoff.costs, None)
    assert all(h.speedup > lo.speedup for h, lo in zip(high[1:], low[1:], strict=True))


def test_no_drafts_in_the_window_reads_one_and_offers_nothing() -> None:
    """A schedule's k = 0 band: the steps are plain, the route gains nothing and loses nothing,
    and with no drafts there is no acceptance to build options on."""
    engine = Engine()
    curve = engine.curve(500.0, 1500.0)
    steps = 500.0
    seconds = steps * engine.step(0, 32.0, 500.0)
    plain = Decode(steps, seconds, steps, 0.0, seconds * 500.0, seconds)
    payoff = Speedups.at_load(curve, Load(32.0, 500.0, 0.0), None, plain, plain)
    assert (payoff.estimated, payoff.measured) == (1.0, 1.0)
    assert payoff.costs == {}
    counts = Counts(0.0, 0.0, 0.0)
    assert options_by_draft_length(counts, payoff, None, True, 0) == []
    # no counted requests either: the schedule's k at the batch says it
    scheduled = replace(curve, schedule=Schedule.parse([[1, 15, 3], [16, 256, 0]]))
    blind = Speedups.at_load(scheduled, Load(32.0), None, Decode(100, 1.0), Decode())
    assert (blind.estimated, blind.measured) == (1.0, 1.0)
    assert scheduled.verify(32.0) == scheduled.plain(32.0)  # what PromQL reads there too


def test_straddled_bands_read_by_the_drafts_per_step() -> None:
    """Half the steps at k = 3, half plain (the batch crossed a schedule's edge): the cost is a
    step of 1.5 drafts, between the plain step and the verify step."""
    engine = Engine()
    curve = engine.curve(500.0, 1500.0)
    half = 1.5
    cost = curve.cost(half, 8.0, 500.0)
    assert cost is not None
    assert 1.0 < cost < (curve.cost(K, 8.0, 500.0) or 0.0)
    mixed = engine.step(0, 8.0, 500.0) + engine.step(K, 8.0, 500.0)
    assert cost == pytest.approx(mixed / 2 / engine.step(0, 8.0, 500.0), rel=1e-6)


def test_steps_by_draft_length_through_the_measured_ones() -> None:
    """A drafter with a fixed cost (llama.cpp's draft model): the step at 1 draft as measured,
    linear between measured lengths, past k on by the last increment; a falling last
    increment (noise) never makes a longer draft cheaper."""
    point = StepPoint(1.0, 0.0046, 0.0090, ((1, 0.0080), (2, 0.0086)))
    assert point.seconds(1, K) == 0.0080
    assert point.seconds(1.5, K) == pytest.approx(0.0083)
    assert point.seconds(5, K) == pytest.approx(0.0090 + 2 * 0.0004)
    falling = StepPoint(1.0, 0.0046, 0.0090, ((1, 0.0087), (2, 0.0092)))
    assert falling.seconds(5, K) == pytest.approx(0.0090)
    linear = StepPoint(1.0, 0.0046, 0.0090)
    assert linear.seconds(1, K) == pytest.approx(0.0046 + 0.0044 / 3)
    assert StepPoint(1.0, 0.0046).seconds(1, K) is None  # a plain point says nothing of drafts
    curve = StepCurve((point,), K)
    payoff = Speedups.at_load(curve, Load(1.0), 2.5, Decode(), Decode())
    options = speedups_by_draft_length((0.85, 0.70, 0.58, 0.48, 0.40), 1.0, payoff.costs, 0.0)
    assert [o.draft_length for o in options] == [0, 1, 2, 3, 4, 5]
    assert options[1].speedup == pytest.approx(1.85 * 0.0046 / 0.0080)


def spread_curve(engine: Engine, context: float, spreads: tuple[float, ...]) -> StepCurve:
    curve = engine.curve(context, 2 * context)
    points = tuple(
        replace(p, verify_spread=s, plain_spread=s / 2)
        for p, s in zip(curve.points, spreads, strict=True)
    )
    return replace(curve, points=points)


@pytest.mark.parametrize("shift", [0.9, 1.0, 1.1])
@pytest.mark.parametrize("batch", [1.0, 5.0, 8.0, 32.0])
@pytest.mark.parametrize("live_context", [250.0, 900.0])
def test_the_drift_reads_the_shift_of_the_step(
    shift: float, batch: float, live_context: float
) -> None:
    """Exact at measure's batches; between them within the curve's own interpolation (the
    plain step and the cost ratio each linear in the batch: 0.8 % here at 5)."""
    measured = Engine()
    live = replace(measured, scale=shift)
    curve = measured.curve(500.0, 1000.0)
    exact = window(live, 2.5, batch, live_context)
    drift = curve_drift(curve, Load(batch, live_context, K), exact)
    assert drift is not None
    assert drift.ratio == pytest.approx(shift, rel=1e-6 if batch != 5.0 else 0.01)
    assert drift.outside == (shift != 1.0)


def test_under_k0_the_plain_step_is_observed() -> None:
    measured = Engine()
    live = replace(measured, scale=1.07)
    curve = measured.curve(500.0, 1000.0)
    steps = 1000.0
    seconds = steps * live.step(0, 32.0, 500.0)
    plain = Decode(steps, seconds, steps, 0.0, seconds * 500.0, seconds)  # no drafts
    drift = curve_drift(curve, Load(32.0, 500.0, 0.0), plain)
    assert drift is not None and drift.ratio == pytest.approx(1.07, rel=1e-6)


def test_the_tolerance_is_measures_spread_at_the_batch_at_least_the_floor() -> None:
    engine = Engine()
    curve = spread_curve(engine, 500.0, (0.01, 0.08, 0.02))  # at 1, 8, 32
    load = Load(8.0, 500.0, K)
    drift = curve_drift(curve, load, window(engine, 2.5, 8.0, 500.0))
    assert drift is not None and drift.tolerance == pytest.approx(0.08)
    at_20 = curve_drift(curve, replace(load, running=20.0), window(engine, 2.5, 20.0, 500.0))
    assert at_20 is not None and at_20.tolerance == pytest.approx(0.05)  # between 8 and 32
    at_1 = curve_drift(curve, replace(load, running=1.0), window(engine, 2.5, 1.0, 500.0))
    assert at_1 is not None and at_1.tolerance == DRIFT_FLOOR
    none = curve_drift(engine.curve(500.0, 1000.0), load, window(engine, 2.5, 8.0, 500.0))
    assert none is not None and none.tolerance == DRIFT_FLOOR  # an old curve: the floor


def test_no_drift_without_a_curve_steps_or_batch() -> None:
    engine = Engine()
    curve = engine.curve(500.0)
    exact = window(engine, 2.5, 8.0, 500.0)
    assert curve_drift(None, Load(8.0), exact) is None
    assert curve_drift(curve, Load(None), exact) is None
    assert curve_drift(curve, Load(8.0), Decode()) is None
    one_point = StepCurve(curve.points[:1], K)  # the single-stream point: load-blind
    assert curve_drift(one_point, Load(8.0), exact) is None


@pytest.mark.parametrize("shift", [0.9, 1.1])
@pytest.mark.parametrize("moved", ["spec", "both"])
def test_the_widened_band_reaches_the_truth_whichever_step_moved(shift: float, moved: str) -> None:
    """The speculative step alone moved (the speedup reads off by the drift) or the whole
    engine (the cost ratio holds, the speedup is right): the sidecar cannot tell the two apart,
    and its band at the observed k covers both."""
    measured = Engine()
    live = replace(measured, scale=shift)
    batch, context, tokens = 8.0, 500.0, 2.5
    curve = measured.curve(context, 2 * context)
    exact = window(live, tokens, batch, context)
    plain_now = (live if moved == "both" else measured).step(0, batch, context)
    truth = tokens * plain_now / live.step(K, batch, context)
    counts = Counts(1000.0, 3000.0, 1500.0, (700.0, 500.0, 300.0))
    moments = RequestMoments(40, 40 * 75.0**2, 40 * 37.5**2, 40 * 75.0 * 37.5, 40 * 75.0**3)
    seen = RouteWindow(counts, exact, exact, moments, Load(batch, context, K))
    drift = curve_drift(curve, seen.load, exact)
    assert drift is not None
    plain = read_route(seen, curve, own_positions=True)
    widened = read_route(seen, curve, own_positions=True, drift=drift)
    at_k = {o.draft_length: o for o in widened.options}[K]
    before = {o.draft_length: o for o in plain.options}[K]
    assert at_k.speedup == pytest.approx(before.speedup)
    assert at_k.halfwidth is not None and before.halfwidth is not None
    assert at_k.halfwidth == pytest.approx(before.halfwidth + at_k.speedup * abs(1 - 1 / shift))
    assert abs(at_k.speedup - truth) <= at_k.halfwidth, (at_k, truth)
    assert {o.draft_length: o for o in widened.options}[0].halfwidth == 0.0  # plain: exact


def test_a_drift_within_tolerance_is_not_outside() -> None:
    assert not Drift(1.02, DRIFT_FLOOR).outside
    assert Drift(1.04, DRIFT_FLOOR).outside
    assert not Drift(1.07, 0.08).outside
