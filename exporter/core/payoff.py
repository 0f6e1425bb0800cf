"""The payoff analysis as pure functions of measured numbers plus model config.

A decode step of a batch costs what its engine does in it: read every weight once, read each
running request's KV (its context), compute over the step's tokens (b for a plain step,
b x (k + 1) for a verify step of k drafts), run the drafter, and take in the chunks of new
requests' prefills. What speculation pays a route is its tokens per step x the plain step's
seconds / the speculative step's seconds, at the load it runs. The speculative step is
observed; the plain step *now* is the counterfactual. It is taken as the observed step / the
cost ratio (a step at the drafts it ran / a plain step) that `specdec measure` found at the
same batch and context: whatever the live traffic and measure's do not share (the GPU's clock,
the engine's history, other tenants, a slower card) scales both steps alike and cancels in the
ratio, while the context, which moves the two steps by different amounts (vLLM reads a KV
once for all k + 1 queries; llama.cpp's verify reads it more), is modelled: each curve point
carries how many seconds a step gains per token of mean context, plain and speculative, from
measure's phases at two context lengths. So the estimated speedup is tokens per step / cost
ratio at (batch, context, drafts per step), and a window whose steps drafted nothing reads
x1.0 exactly. docs/metrics.md argues the design against the engines' cost structure.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field

from exporter.core.counts import Counts, ratios
from exporter.core.fieldwise import Fieldwise
from exporter.core.schedule import Schedule, draft_length_at
from exporter.core.stats import Interval

# the shortest a step read at another context may be, as a share of the step measured: a
# context far shorter than measure's cannot take off more than its KV read
SHORTEST_SHARE = 0.2


@dataclass(frozen=True, slots=True)
class Decode(Fieldwise):
    """Streamed requests' tokens after their first and the seconds those took (first to last
    token); where the engine counted them per request, the decode steps that made them and the
    draft tokens proposed in those steps; and, where their prompt's length is known, their
    decode seconds (`context_weight`) and those seconds x the tokens a request held in its KV
    on average while it decoded (its prompt + half its decode: `context_seconds`)."""

    tokens: float = 0.0
    seconds: float = 0.0
    steps: float = 0.0
    draft_tokens: float = 0.0
    context_seconds: float = 0.0
    context_weight: float = 0.0

    @property
    def rate(self) -> float | None:
        return self.tokens / self.seconds if self.seconds > 0 else None

    @property
    def seconds_per_step(self) -> float | None:
        return self.seconds / self.steps if self.steps > 0 and self.seconds > 0 else None

    @property
    def drafts_per_step(self) -> float | None:
        """Draft tokens per decode step of the requests whose steps were counted (0: the steps
        drafted nothing, as under a schedule's k = 0)."""
        return self.draft_tokens / self.steps if self.steps > 0 else None

    @property
    def context(self) -> float | None:
        """The tokens a decoding request held in its KV, time-weighted."""
        return self.context_seconds / self.context_weight if self.context_weight > 0 else None


def decode_steps(tokens: float, accepted: float, verify_steps: float | None = None) -> float:
    """A request's decode steps from its decode tokens (after the first, prefill's) and its
    accepted draft tokens: a verify step makes one token plus those it accepted, a step
    without drafts one token, so steps = tokens - accepted. Where the engine counted its
    verify steps, at least those (a stop string can cut a last step's tokens)."""
    return max(verify_steps or 0.0, tokens - accepted)


@dataclass(frozen=True, slots=True)
class Batch(Fieldwise):
    """Running requests integrated over time: b dt and b^2 dt. Their ratio is the batch a
    running request sees on average (idle time weighs nothing): the batch the route's decode
    steps ran at, which is what a step-time curve is read at. Where the model has a curve,
    also b x plain(b) dt and b x verify(b) dt: over b dt, the plain (verify) step a running
    request saw, the curve read at every batch it ran at, at measure's own contexts (what
    PromQL reads: no line through the curve's points)."""

    request_seconds: float = 0.0
    batch_request_seconds: float = 0.0
    plain_step_seconds: float = 0.0
    verify_step_seconds: float = 0.0

    @classmethod
    def held(cls, running: float, seconds: float, curve: StepCurve | None) -> Batch:
        """`running` requests held for `seconds`, read on `curve` where there is one."""
        plain = verify = 0.0
        if curve is not None and running > 0:
            plain = running * curve.plain(running) * seconds
            verify = running * (curve.verify(running) or 0.0) * seconds
        return cls(running * seconds, running * running * seconds, plain, verify)

    @property
    def seen(self) -> float | None:
        if self.request_seconds <= 0:
            return None
        return self.batch_request_seconds / self.request_seconds


@dataclass(frozen=True, slots=True)
class StepPoint:
    """One point of a model's step-time curve (`specdec measure --concurrency`): seconds per
    decode step with `running` requests in the engine's batch, plain and speculative, at the
    context (tokens a running request held in its KV) measure's traffic had there."""

    running: float
    plain_seconds: float
    verify_seconds: float | None = None
    # verify steps measured at draft lengths below k, (length, seconds): engines that take a
    # draft length per request (`specdec measure` on llama.cpp)
    draft_seconds: tuple[tuple[int, float], ...] = ()
    # draft tokens per decode step of the phase `verify_seconds` timed (None: the model's k;
    # below it where a schedule's range or an n-gram drafter's misses drafted fewer)
    verify_drafts: float | None = None
    context: float | None = None  # tokens a running request held, time-weighted
    # seconds a step gains per token of context: plain, and at `verify_drafts` drafts
    plain_per_context_token: float = 0.0
    verify_per_context_token: float = 0.0
    # measure's error over its whole run, a share of each step (None: not stated)
    plain_spread: float | None = None
    verify_spread: float | None = None

    def seconds(
        self, drafts: float, draft_length: int, context: float | None = None
    ) -> float | None:
        """A step drafting `drafts` tokens per request (a mean: a fraction mixes steps), at
        `context` (None: the point's own). Through the steps known: plain (0), the measured
        draft lengths and the verify step; linear between two of them; past the longest,
        on by the last increment per draft, never cheaper (measured slopes under 0 are noise).
        None for drafts > 0 where the point has no speculative step. `draft_length`: the
        model's, what its verify step drafts where the point does not say."""
        top = draft_length if self.verify_drafts is None else self.verify_drafts
        known = {0.0: self.plain_seconds, **{float(j): s for j, s in self.draft_seconds}}
        if self.verify_seconds is not None and top > 0:
            known[float(top)] = self.verify_seconds
        xs = sorted(known)
        if drafts > 0 and len(xs) < 2:
            return None
        if drafts >= xs[-1]:
            slope = 0.0
            if len(xs) > 1:
                slope = max(0.0, (known[xs[-1]] - known[xs[-2]]) / (xs[-1] - xs[-2]))
            base = known[xs[-1]] + slope * (drafts - xs[-1])
        else:
            base = _interpolate(list(known.items()), drafts)
        if context is None or self.context is None:
            return base
        per_token = self.plain_per_context_token
        if top > 0:  # the KV term at `drafts`, linear from the plain step's to the verify's
            per_token += (self.verify_per_context_token - per_token) * drafts / top
        return max(base + max(per_token, 0.0) * (context - self.context), SHORTEST_SHARE * base)


@dataclass(frozen=True, slots=True)
class StepCurve:
    """Step seconds against the batch (linear between measured points, flat beyond them: a
    curve is trusted only where it was measured; one point is a load-blind constant), by the
    draft tokens per step and at a context, for a model whose verify step drafts
    `draft_length` (k)."""

    points: tuple[StepPoint, ...]
    draft_length: int
    schedule: Schedule | None = None  # the k the engine runs by batch, where it runs one

    def scheduled_draft_length(self, running: float) -> int:
        """The k the engine runs at a batch of `running`: the schedule's (at most k), else k."""
        return draft_length_at(self.schedule, self.draft_length, running)

    def seconds(self, drafts: float, running: float, context: float | None = None) -> float | None:
        """A step of `drafts` draft tokens per request at the batch and context: the plain step
        there x the cost ratio there (None: no point has a speculative step)."""
        cost = self.cost(drafts, running, context)
        return None if cost is None else cost * self.plain(running, context)

    def plain(self, running: float, context: float | None = None) -> float:
        return _interpolate(
            [(p.running, p.seconds(0.0, self.draft_length, context) or 0.0) for p in self.points],
            running,
        )

    def verify(self, running: float, context: float | None = None) -> float | None:
        """The step the engine runs at the batch: at k, or the schedule's k there (a plain
        step where it gives 0)."""
        return self.seconds(self.scheduled_draft_length(running), running, context)

    def cost(self, drafts: float, running: float, context: float | None = None) -> float | None:
        """A step of `drafts` draft tokens per request / a plain step, at the batch and context:
        the ratio the counterfactual plain step is read through (1.0 at no drafts). Each point
        with a speculative step gives its own ratio, linear between them in the batch and flat
        beyond (a point without one, as a schedule's k = 0 range, takes its neighbours': a ratio
        read at one batch is not divided by a plain step read at another)."""
        if drafts <= 0:
            return 1.0
        known = []
        for p in self.points:
            step = p.seconds(drafts, self.draft_length, context)
            plain = p.seconds(0.0, self.draft_length, context)
            if step is not None and plain:
                known.append((p.running, step / plain))
        return _interpolate(known, running) if known else None

    def spread(self, drafts: float, running: float) -> float | None:
        """measure's error over its run for the step the engine runs at the batch (its verify
        step's where `drafts` > 0, else its plain step's), linear between the points that state
        it, flat beyond (None: none states it)."""
        known = []
        for p in self.points:
            error = p.verify_spread if drafts > 0 else p.plain_spread
            if error is not None:
                known.append((p.running, error))
        return _interpolate(known, running) if known else None

    @property
    def load_aware(self) -> bool:
        return len(self.points) > 1

    def fit(self, verify: bool = False) -> tuple[float, float] | None:
        """Least-squares line seconds = base + per_request x running through the plain (or
        verify) points: what PromQL can evaluate at a batch (one point: flat)."""
        pts: list[tuple[float, float]] = []
        for p in self.points:
            y = p.verify_seconds if verify else p.plain_seconds
            if y is not None:
                pts.append((p.running, y))
        if not pts:
            return None
        mx = sum(x for x, _ in pts) / len(pts)
        my = sum(y for _, y in pts) / len(pts)
        sxx = sum((x - mx) ** 2 for x, _ in pts)
        slope = sum((x - mx) * (y - my) for x, y in pts) / sxx if sxx else 0.0
        return my - slope * mx, slope


def _interpolate(points: list[tuple[float, float]], x: float) -> float:
    points = sorted(points)
    if x <= points[0][0]:
        return points[0][1]
    for (x0, y0), (x1, y1) in itertools.pairwise(points):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return points[-1][1]


def single_point_curve(
    step_cost_ratio: float, plain_tokens_per_second: float, draft_length: int
) -> StepCurve:
    """Today's calibration as a curve: one plain rate and one step cost, at any batch."""
    plain = 1.0 / plain_tokens_per_second
    return StepCurve((StepPoint(1.0, plain, plain * step_cost_ratio),), draft_length)


@dataclass(frozen=True, slots=True)
class Load:
    """What the engine ran over a window, as the proxy saw it across every route: the batch a
    running request saw, the context it held, and the draft tokens per decode step of the
    requests whose steps were counted (the steps every route in the batch shares)."""

    running: float | None
    context: float | None = None
    drafts_per_step: float | None = None


@dataclass(frozen=True, slots=True)
class Speedups:
    """A route's payoff over a window, two ways at the same load (None: not known)."""

    estimated: float | None  # tokens per decode step / the cost ratio at the load
    measured: float | None  # decode rate x the plain step now
    plain_seconds: float | None = None  # the plain step now: the observed step / the cost ratio
    # a step drafting j tokens / a plain step at the load, j = 0..k + MODELLED_BEYOND where the
    # curve says (past what measure timed, extrapolated by its own increments)
    costs: Mapping[int, float] = field(default_factory=dict)
    drafts_per_step: float | None = None  # of the steps the cost ratio was read at
    tokens_per_step: float | None = None  # per decode step of the route's counted requests

    @classmethod
    def at_load(
        cls,
        curve: StepCurve | None,
        load: Load,
        tokens_per_step: float | None,
        decoded: Decode,
        exact: Decode,
    ) -> Speedups:
        """`decoded`: the route's streamed requests; `exact`: those whose steps the engine
        counted; `load`: the engine's over the same window. Observed, the estimate is their
        tokens per decode step / the cost ratio at the drafts per step every route's counted
        steps had (steps without drafts included, so an n-gram drafter's misses and a
        schedule's plain steps are not lost); without such requests, `tokens_per_step` (per
        verify step) / the cost at the k the engine runs at the batch
        (`StepCurve.scheduled_draft_length`: a schedule's range). No drafts in the window: x1.0
        for a route that ran, speculation was off. No batch and a load-aware curve: nothing."""
        if curve is None or (curve.load_aware and load.running is None):
            return cls(None, None)
        batch = 1.0 if load.running is None else load.running
        scheduled = curve.scheduled_draft_length(batch)
        drafts = load.drafts_per_step
        observed = exact.seconds_per_step is not None and drafts is not None
        if not observed:
            drafts = float(scheduled)
        assert drafts is not None
        cost = curve.cost(drafts, batch, load.context)
        if drafts <= 0:  # the engine ran plain steps: nothing gained, nothing lost
            plain = exact.seconds_per_step or curve.plain(batch, load.context)
            ran = observed or tokens_per_step is not None or decoded.rate is not None
            return cls(1.0 if ran else None, 1.0 if decoded.rate else None, plain, {}, 0.0)
        if cost is None:
            return cls(None, None)
        estimated = None
        if observed:
            estimated = (exact.tokens / exact.steps) / cost
            plain = (exact.seconds_per_step or 0.0) / cost
        else:
            plain = curve.plain(batch, load.context)
            if tokens_per_step is not None:
                estimated = tokens_per_step / cost
        measured = None if decoded.rate is None else decoded.rate * plain
        costs = {0: 1.0}
        for length in range(1, max(scheduled, round(drafts)) + MODELLED_BEYOND + 1):
            if (c := curve.cost(length, batch, load.context)) is not None:
                costs[length] = c
        tokens = exact.tokens / exact.steps if observed else None
        return cls(estimated, measured, plain, costs, drafts, tokens)


# the least the live step may drift from measure's before it counts as a drift: a window's own
# noise around the step measure read at the same batch and context (the GPU bench's live
# speculative step within 4 % of measure's in one start; the simulators' within ~1 %)
DRIFT_FLOOR = 0.03


@dataclass(frozen=True, slots=True)
class Drift:
    """The engine's drift from its curve: the step it runs now over the step measure read at
    the same batch, context and draft tokens per step (a schedule's k = 0: its plain step, then
    observed outright), and how far measure's own error reaches there."""

    ratio: float
    tolerance: float  # measure's error over its run there, at least DRIFT_FLOOR

    @property
    def outside(self) -> bool:
        return abs(self.ratio - 1.0) > self.tolerance

    def widening(self, speedup: float) -> float:
        """What the drift adds to a speedup's half-width: the step moved by `ratio`, and the
        plain step now either with it (a whole start slower or faster: the cost ratio holds, the
        speedup too) or not (the speculative step alone: the speedup / ratio). The truth lies
        between the two, so the half-width reaches the other end."""
        return speedup * abs(1.0 - 1.0 / self.ratio)


def curve_drift(curve: StepCurve | None, load: Load, exact: Decode) -> Drift | None:
    """The drift over a window from every route's counted requests of a model (`exact`: their
    decode seconds and steps) at the engine's `load` (its batch, context and the draft tokens
    per decode step its counted steps ran); None without a load-aware curve, counted steps or
    a batch."""
    if curve is None or not curve.load_aware or load.running is None:
        return None
    observed = exact.seconds_per_step
    # the drafts per step the cost ratio is read at (every route's counted steps)
    drafts = load.drafts_per_step if load.drafts_per_step is not None else exact.drafts_per_step
    if observed is None or drafts is None:
        return None
    expected = curve.seconds(drafts, load.running, load.context)
    if not expected:
        return None
    spread = curve.spread(drafts, load.running) or 0.0
    return Drift(observed / expected, max(spread, DRIFT_FLOOR))


def breakeven_acceptance(step_cost_ratio: float, draft_length: int) -> float:
    """The acceptance at which speculation neither gains nor loses: (cost - 1) / k."""
    return (step_cost_ratio - 1.0) / draft_length


def decode_ceiling(bandwidth_bytes_per_second: float, bytes_per_token: float) -> float:
    """Roofline: plain decode cannot beat bandwidth / bytes read per token."""
    return bandwidth_bytes_per_second / bytes_per_token


@dataclass(frozen=True, slots=True)
class DraftLength:
    """What a route would get with k' drafts per step, at the batch it runs."""

    draft_length: int
    speedup: float
    halfwidth: float | None  # 95 %, from the acceptance's; None: not known


def linear_costs(plain: float, verify: float, draft_length: int, upto: int) -> dict[int, float]:
    """Cost ratios 0..`upto` for a step linear in its drafts from the plain step (0) to the
    verify step (k): the simulator's model, and what a line through plain and verify steps
    alone can say (`specdec advise`'s schedule)."""
    return {j: (plain + (verify - plain) * j / draft_length) / plain for j in range(upto + 1)}


def speedups_by_draft_length(
    per_position: tuple[float, ...],
    drafts: float,
    costs: Mapping[int, float],
    relative_halfwidth: float | None,
) -> list[DraftLength]:
    """k' = 0..len(per_position): tokens per step E(k') = 1 + sum_{i<k'} P(more than i drafts
    accepted) (position i is only drafted when k' > i, so the truncated sum is what k' would
    have produced) over `costs[k']`, a step of k' drafts against a plain one at the load.
    `relative_halfwidth`: of the accepted tokens per step, taken to scale the accepted part of
    every E(k') alike (an approximation: the positions move together)."""
    if drafts <= 0 or not per_position or not costs.get(1):
        return []
    out = [DraftLength(0, 1.0, 0.0)]
    accepted = 0.0
    for length in range(1, len(per_position) + 1):
        accepted += per_position[length - 1] / drafts
        cost = costs.get(length)
        if cost is None or cost <= 0:
            break
        half = None if relative_halfwidth is None else accepted * relative_halfwidth / cost
        out.append(DraftLength(length, (1 + accepted) / cost, half))
    return out


# draft lengths past k offered where a route's profile is modelled (geometric_positions): a
# draft length the engine must be restarted with
MODELLED_BEYOND = 2


def observed_draft_length(c: Counts, payoff: Speedups, scheduled: int | None) -> int | None:
    """The draft length the window's steps ran: its route's draft tokens per verify step
    rounded, else `scheduled` (the k the engine runs at the batch); 0 where most of the
    engine's decode steps drafted nothing (a schedule's k = 0 range, its edge crossed only as
    the batch filled): plain steps carry no acceptance to build options on."""
    if not c.drafts or c.draft_tokens is None:
        return scheduled
    per_verify_step = c.draft_tokens / c.drafts
    drafted = payoff.drafts_per_step
    if drafted is not None and drafted < 0.5 * per_verify_step:
        return 0
    return round(per_verify_step)


def options_by_draft_length(
    c: Counts,
    payoff: Speedups,
    interval: Interval | None,
    own_positions: bool,
    draft_length: int | None,
) -> list[DraftLength]:
    """The route's speedup at each draft length from 0 at the load: tokens per step from its
    per-position acceptance over `payoff.costs`. Its own positions where its requests state
    them (`own_positions`; 0..k: nothing is known past k), else (llama.cpp: the engine's
    positions mix every route) the geometric profile of its own acceptance, 0..k +
    MODELLED_BEYOND (the profile goes on past k). `draft_length`: k, the steps' observed
    (`observed_draft_length`; 0 or None: nothing to say)."""
    k = draft_length  # the formulas' k
    if not payoff.costs or not c.drafts or not k:
        return []
    relative = None
    if interval is not None and interval.estimate > 0:
        relative = interval.halfwidth / interval.estimate
    positions, steps = c.per_position[:k], c.drafts
    if not own_positions:
        # per position over k, from the steps the exact requests were timed on, so a route's
        # requests ended early (their counts apportioned from the engine's, not their own)
        # stay out and the option at k is the estimated speedup (docs/metrics.md)
        observed = payoff.tokens_per_step
        acceptance = (observed - 1) / k if observed is not None else ratios(c).acceptance
        if acceptance is None:
            return []
        positions, steps = geometric_positions(acceptance, k, k + MODELLED_BEYOND), 1.0
    return speedups_by_draft_length(positions, steps, payoff.costs, relative)


def geometric_positions(
    acceptance: float, draft_length: int, positions: int | None = None
) -> tuple[float, ...]:
    """P(more than i drafts accepted), i < `positions` (default k), for a route whose engine
    states only its draft and accepted tokens (llama.cpp's timings; its per-position counters
    mix every route): each
    draft accepted with one probability a, given the ones before it (Leviathan et al.), so
    P(more than i) = a^(i+1), with a chosen so that the mean over k positions is the route's
    measured `acceptance` (accepted / draft tokens). Exact for i.i.d. acceptance; for the
    usual falling conditional acceptance it understates the first position and overstates the
    last (measured: within 2 % of E(k') for the bench's two routes, docs/metrics.md). Past k
    the profile goes on (a^(i+1)): what k' > k would get, if the route's drafts keep being
    accepted as they were (an extrapolation; vLLM's own positions are not extended)."""
    k = draft_length  # the formulas' k
    target = min(max(acceptance, 0.0), 1.0)
    low, high = 0.0, 1.0
    for _ in range(60):  # bisection: the mean rises with a
        a = (low + high) / 2
        if sum(a ** (i + 1) for i in range(k)) / k < target:
            low = a
        else:
            high = a
    a = (low + high) / 2
    return tuple(a ** (i + 1) for i in range(k if positions is None else positions))


def best_draft_length(options: list[DraftLength]) -> DraftLength | None:
    """The draft length with the highest speedup, when it beats the runner-up by more than
    the larger of their half-widths (else None: the data cannot tell them apart)."""
    if len(options) < 2 or any(o.halfwidth is None for o in options):
        return None
    ranked = sorted(options, key=lambda o: o.speedup, reverse=True)
    best, runner_up = ranked[0], ranked[1]
    margin = max(best.halfwidth or 0.0, runner_up.halfwidth or 0.0)
    return best if best.speedup - runner_up.speedup > margin else None
