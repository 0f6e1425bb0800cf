"""The payoff analysis as pure functions of measured numbers plus model config.

A verify step yields `tokens per step` tokens and takes as long as it takes at the engine's
batch; a plain step of the same model at the same batch takes `StepCurve.plain(batch)`. So
speculation pays tokens_per_step x plain step seconds / verify step seconds, at the load it
runs: a verify step processes b x (k + 1) tokens, so its cost grows with the batch faster than
a plain step's (SmartSpec, arXiv 2406.14066; Kong et al., arXiv 2605.15051). At batch 1 this
is today's `tokens_per_step / step_cost_ratio`, which breaks even when 1 + k * acceptance =
step_cost_ratio. Decoding reads every weight once per step, so memory bandwidth / bytes per
token bounds plain decode (the roofline).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Decode:
    """Streamed requests' tokens after their first, the seconds those took (first to last
    token), and, where the engine counted them per request, the verify steps that made them."""

    tokens: float = 0.0
    seconds: float = 0.0
    steps: float = 0.0

    def __add__(self, other: Decode) -> Decode:
        return Decode(
            self.tokens + other.tokens, self.seconds + other.seconds, self.steps + other.steps
        )

    def __sub__(self, other: Decode) -> Decode:
        return Decode(
            self.tokens - other.tokens, self.seconds - other.seconds, self.steps - other.steps
        )

    @property
    def rate(self) -> float | None:
        return self.tokens / self.seconds if self.seconds > 0 else None

    @property
    def seconds_per_step(self) -> float | None:
        return self.seconds / self.steps if self.steps > 0 and self.seconds > 0 else None


def decode_steps(tokens: float, accepted: float, verify_steps: float | None = None) -> float:
    """A request's decode steps from its decode tokens (after the first, prefill's) and its
    accepted draft tokens: a verify step makes one token plus those it accepted, a step
    without drafts one token, so steps = tokens - accepted. Where the engine counted its
    verify steps, at least those (a stop string can cut a last step's tokens)."""
    return max(verify_steps or 0.0, tokens - accepted)


@dataclass(frozen=True, slots=True)
class Batch:
    """Running requests integrated over time: b dt and b^2 dt. Their ratio is the batch a
    running request sees on average (idle time weighs nothing): the batch the route's decode
    steps ran at, which is what a step-time curve is read at. Where the model has a curve,
    also b x plain(b) dt and b x verify(b) dt: over b dt, the plain (verify) step a running
    request saw, the curve read at every batch it ran at (what PromQL reads: no line through
    the curve's points)."""

    request_seconds: float = 0.0
    batch_request_seconds: float = 0.0
    plain_step_seconds: float = 0.0
    verify_step_seconds: float = 0.0

    def __add__(self, other: Batch) -> Batch:
        return Batch(
            self.request_seconds + other.request_seconds,
            self.batch_request_seconds + other.batch_request_seconds,
            self.plain_step_seconds + other.plain_step_seconds,
            self.verify_step_seconds + other.verify_step_seconds,
        )

    def __sub__(self, other: Batch) -> Batch:
        return Batch(
            self.request_seconds - other.request_seconds,
            self.batch_request_seconds - other.batch_request_seconds,
            self.plain_step_seconds - other.plain_step_seconds,
            self.verify_step_seconds - other.verify_step_seconds,
        )

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
    """One point of a model's step-time curve: seconds per plain decode step and per verify
    step with `running` requests in the engine's batch (`specdec measure --concurrency`)."""

    running: float
    plain_seconds: float
    verify_seconds: float | None = None
    # verify steps measured at draft lengths below k, (length, seconds): engines that take a
    # draft length per request (`specdec measure` on llama.cpp)
    draft_seconds: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True, slots=True)
class StepCurve:
    """Step seconds against the batch, linear between measured points and flat beyond them
    (a curve is trusted only where it was measured; one point is a load-blind constant)."""

    points: tuple[StepPoint, ...]

    def plain(self, running: float) -> float:
        return _interpolate([(p.running, p.plain_seconds) for p in self.points], running)

    def verify(self, running: float) -> float | None:
        known = [(p.running, p.verify_seconds) for p in self.points if p.verify_seconds is not None]
        return _interpolate(known, running) if known else None

    def drafting(self, running: float) -> dict[int, float]:
        """The verify step's seconds at each draft length measured below k, at `running`, as
        measured: each point is its own phase of `measure`, so scaling them all to the live
        step at k would carry that one phase's error into every option (H200, c = 16: measure's
        step at 1 draft within 0.2 % of the truth's, at k 9 % over the live step; scaled, the
        options at 1 read 12-19 % high and named 1 where the truth ranked 0 and 4: §11, run 23).
        Scaling was needed while measure's window chose fast requests (run 19, a kink at k)."""
        found: dict[int, list[tuple[float, float]]] = {}
        for p in self.points:
            for length, seconds in p.draft_seconds:
                found.setdefault(length, []).append((p.running, seconds))
        return {length: _interpolate(known, running) for length, known in sorted(found.items())}

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


def single_point_curve(step_cost_ratio: float, plain_tokens_per_second: float) -> StepCurve:
    """Today's calibration as a curve: one plain rate and one step cost, at any batch."""
    plain = 1.0 / plain_tokens_per_second
    return StepCurve((StepPoint(1.0, plain, plain * step_cost_ratio),))


@dataclass(frozen=True, slots=True)
class Speedups:
    """A route's payoff over a window, two ways at the same batch (None: not known)."""

    estimated: float | None  # tokens per decode step x plain / decode step seconds
    measured: float | None  # decode rate x plain step seconds
    plain_seconds: float | None = None  # a plain step at the batch (the curve)
    step_seconds: float | None = None  # a speculative step: observed, else the curve's
    # verify steps at draft lengths below k at the batch, where measured (the curve's)
    draft_seconds: Mapping[int, float] = field(default_factory=dict)
    curve_step_seconds: float | None = None  # the curve's verify step at the batch
    # tokens per step of the steps `step_seconds` timed (observed, else the one given)
    tokens_per_step: float | None = None

    @classmethod
    def at_load(
        cls,
        curve: StepCurve | None,
        running: float | None,
        tokens_per_step: float | None,
        decoded: Decode,
        exact: Decode,
    ) -> Speedups:
        """`decoded`: the route's streamed requests; `exact`: those whose steps the engine
        counted. Observed, the estimate is their tokens per decode step x the plain step's
        seconds / their seconds per decode step (steps without drafts included, so an n-gram
        drafter's unmatched steps are not lost); without such requests, `tokens_per_step` (per
        verify step) x plain / the curve's verify step. No batch and a load-aware curve:
        nothing."""
        if curve is None or (curve.load_aware and running is None):
            return cls(None, None)
        batch = 1.0 if running is None else running
        plain = curve.plain(batch)
        estimated = None
        step = exact.seconds_per_step
        if step is not None:
            tokens_per_step = exact.tokens / exact.steps
            estimated = tokens_per_step * plain / step
        elif tokens_per_step is not None and (step := curve.verify(batch)):
            estimated = tokens_per_step * plain / step
        measured = None if decoded.rate is None else decoded.rate * plain
        return cls(
            estimated,
            measured,
            plain,
            step,
            curve.drafting(batch),
            curve.verify(batch),
            tokens_per_step,
        )


def breakeven_acceptance(step_cost_ratio: float, k: int) -> float:
    """The acceptance at which speculation neither gains nor loses: (cost - 1) / k."""
    return (step_cost_ratio - 1.0) / k


def decode_ceiling(bandwidth_bytes_per_second: float, bytes_per_token: float) -> float:
    """Roofline: plain decode cannot beat bandwidth / bytes read per token."""
    return bandwidth_bytes_per_second / bytes_per_token


@dataclass(frozen=True, slots=True)
class DraftLength:
    """What a route would get with k' drafts per step, at the batch it runs."""

    draft_length: int
    speedup: float
    halfwidth: float | None  # 95 %, from the acceptance's; None: not known


def step_seconds(
    length: int,
    plain: float,
    verify: float,
    k: int,
    measured: Mapping[int, float] | None = None,
    measured_verify: float | None = None,
) -> float:
    """Seconds of a step drafting `length` tokens, through the steps known: the plain step (no
    draft), the verify step at k and, where measured, the verify steps at shorter draft
    lengths; linear between two of them. Past k, a further draft costs what the measured
    steps say one costs at k: the increment from the longest measured below k to
    `measured_verify` (the curve's own step at k, so the slope is one phase's against
    another's of the same measure, not against the live step: run 23 at c = 16, the line from
    measure's k - 1 to the live k was a fifth of the truth's slope), else to `verify`; flat
    where that falls (at c = 1 the measured steps are within noise of one another: run 21).
    Without measured ones, linear from the plain step (the simulator's model; an
    interpolation for a real engine). Measured, llama.cpp's step is not linear from the plain
    one nor in k: its draft model costs ~0.7 of a plain step whatever k, and at c = 16 a
    second draft 0.7, each further one ~0.3 (docs/BENCHMARKS.md §11, run 18)."""
    below = {j: x for j, x in (measured or {}).items() if 0 < j < k}
    known = {0: plain, **below, k: verify}
    if length in known:
        return known[length]
    if length > k:  # a step drafting more is never cheaper: measured slopes under 0 are noise
        base = max(below, default=0)
        top = measured_verify if below and measured_verify is not None else verify
        return verify + max(0.0, top - known[base]) * (length - k) / (k - base)
    low = max(j for j in known if j < length)
    high = min(j for j in known if j > length)
    return known[low] + (known[high] - known[low]) * (length - low) / (high - low)


def speedups_by_draft_length(
    per_position: tuple[float, ...],
    drafts: float,
    plain: float,
    verify: float,
    relative_halfwidth: float | None,
    k: int | None = None,
    measured: Mapping[int, float] | None = None,
    measured_verify: float | None = None,
) -> list[DraftLength]:
    """k' = 0..len(per_position): tokens per step E(k') = 1 + sum_{i<k'} P(more than i drafts
    accepted) (position i is only drafted when k' > i, so the truncated sum is what k' would
    have produced), and a step's seconds by `step_seconds` from the observed verify step at k
    (default: every position given was drafted). `relative_halfwidth`: of the accepted tokens
    per step, taken to scale the accepted part of every E(k') alike (an approximation: the
    positions move together)."""
    k = len(per_position) if k is None else k
    if drafts <= 0 or k == 0 or plain <= 0 or verify <= 0:
        return []
    out = [DraftLength(0, 1.0, 0.0)]
    accepted = 0.0
    for length in range(1, len(per_position) + 1):
        accepted += per_position[length - 1] / drafts
        seconds = step_seconds(length, plain, verify, k, measured, measured_verify)
        speedup = (1 + accepted) * plain / seconds
        half = None if relative_halfwidth is None else accepted * relative_halfwidth
        out.append(DraftLength(length, speedup, None if half is None else half * plain / seconds))
    return out


# draft lengths past k offered where a route's profile is modelled (geometric_positions): a
# draft length the engine must be restarted with; on the GPU bench the agent's best was k = 5
# at a deployed 3 (docs/BENCHMARKS.md §11)
MODELLED_BEYOND = 2


def geometric_positions(
    acceptance: float, k: int, positions: int | None = None
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
