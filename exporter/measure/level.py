"""What one concurrency level of the step-time curve reads: its phases' steady decode, the
replicates pooled, the row of the `--json` document (`curve.measure_curve` runs the phases).

Only the steady span of a phase counts (`Phase.steady_span`): from the time as many requests
have ended as there are workers (the first cohort, sent together with its prefills batched and no
arrivals between them, has turned over) to the time the first worker finds nothing left (from
then on the batch drains, and a draining engine's steps cost more a token than steady ones at
the same level). Each request counts with the part of its decode inside that span, pro
rata: counting only the requests that ended inside it would choose the ones that ran fast.
(Counting the tokens by when they arrived was tried and failed the simulators' A/B check:
likeliest, because a phase states its context as each request's whole-life mean, so the steps
counted must be whole requests' too, or the per-context-token slopes read from measure's two
contexts no longer match the steps they are read with.) Per level:

- plain seconds per step = decode seconds / decode tokens (one token per plain step);
- speculative seconds per step = decode seconds / decode steps, the steps from each request's
  own counts (`core.payoff.decode_steps`: decode tokens - accepted drafts; vLLM's objects and
  llama.cpp's timings both state the accepted drafts);
- tokens per step, decode rates and the speedup (spec rate / plain rate);
- the verify step's seconds at the shorter draft lengths measured (`Level.draft_seconds`), each
  kept only where the engine's counters say its steps drafted that many tokens (a build that
  ignores the field drafts k).

Replicates: a side's figure pools the fastest replicate and those within TIE of it (`steps.py`
argues the estimator: a disturbance only ever adds time); its standard error is the kept ones'
spread, its `*_spread` the farthest of all replicates from it (the error over the whole run);
one left out is named.

Decode = tokens after the first / seconds from the first content token to the last.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

from exporter.core.counts import Counts
from exporter.measure.runner import Request, ScenarioResult
from exporter.measure.steps import (
    Steady,
    agree,
    fastest,
    per_step,
    pooled,
    replicate_error,
    spread,
)

ERROR_BLOCKS = 4  # blocks of a phase's steady span its error is read from


@dataclass
class Phase:
    """One endpoint at one level: its requests and the batch seen while they ran."""

    results: list[ScenarioResult] = field(default_factory=list)
    running: list[tuple[float, float]] = field(default_factory=list)  # (time, the batch gauge)
    counted: Counts | None = None  # the engine's /metrics delta over the phase
    workers: int = 1
    dry_at: float | None = None  # when a worker first found nothing left to send

    @property
    def requests(self) -> list[Request]:
        return [r for s in self.results for r in s.requests]

    def steady_span(self) -> tuple[float, float] | None:
        """The steady span, on time.perf_counter()'s clock: from the `workers`-th request's end
        to `dry_at` (None where that is empty or unknown: then all of the phase counts)."""
        ends = sorted(span[1] for r in self.requests if (span := r.result.decode_span))
        if self.dry_at is None or len(ends) < self.workers:
            return None
        start = ends[self.workers - 1]
        return (start, self.dry_at) if start < self.dry_at else None

    def decode(self) -> tuple[float, float, float | None]:
        """(tokens after the first, their seconds, decode steps or None when not counted),
        inside the steady span: each request's share of them as much as its decode lies in it."""
        d = self.steady()
        return d.tokens, d.seconds, d.steps

    def steady(self, within: tuple[float, float] | None = None) -> Steady:
        """The decode inside the steady span (or `within`, a part of it), each request pro rata
        as much as its decode lies in it: tokens, seconds, steps where counted, draft tokens,
        and the context the requests held (their prompt + half their decode, by seconds)."""
        steady = within or self.steady_span()
        tokens = seconds = steps = drafted = context = weight = 0.0
        counted = True
        for r in self.requests:
            own, spent, made = r.decode()
            span = r.result.decode_span
            if spent <= 0 or span is None:
                continue
            inside = spent if steady is None else min(steady[1], span[1]) - max(steady[0], span[0])
            if inside <= 0:
                continue
            share = inside / spent
            tokens, seconds = tokens + own * share, seconds + inside
            if (prompt := r.prompt_tokens) is not None:
                context += inside * (prompt + 1 + own / 2)
                weight += inside
            if made is None or r.counts is None:
                counted = False
                continue
            steps += made * share
            drafted += (r.counts.draft_tokens or 0.0) * share
        return Steady(
            tokens,
            seconds,
            steps if counted and steps else None,
            drafted if counted and steps else None,
            context / weight if weight else None,
        )

    def relative_error(self, plain: bool) -> float | None:
        """The standard error of the steady span's seconds per step (per token when `plain`), as
        a share of it: the span cut in ERROR_BLOCKS equal blocks, the spread of their figures
        (batch means: the batch and its contexts drift within a phase). None: too short."""
        steady = self.steady_span()
        if steady is None:
            return None
        width = (steady[1] - steady[0]) / ERROR_BLOCKS
        figures = []
        for i in range(ERROR_BLOCKS):
            d = self.steady((steady[0] + i * width, steady[0] + (i + 1) * width))
            per = d.tokens if plain else d.steps
            if not per or not d.seconds:
                return None
            figures.append(d.seconds / per)
        mean = statistics.fmean(figures)
        return statistics.stdev(figures) / math.sqrt(ERROR_BLOCKS) / mean

    def batch(self) -> list[float]:
        """The batch gauge's reads inside the steady span (all of them where none is)."""
        steady = self.steady_span()
        inside = [v for t, v in self.running if steady and steady[0] <= t <= steady[1]]
        return inside or [v for _, v in self.running]


@dataclass
class Level:
    concurrency: int
    spec: Phase = field(default_factory=Phase)
    plain: Phase = field(default_factory=Phase)
    drafting: dict[int, Phase] = field(default_factory=dict)  # the speculative endpoint at j < k
    # spec and plain again with the scenarios lengthened (`measure_curve`'s `longer`)
    longer: tuple[Phase, Phase] | None = None
    again: list[tuple[Phase, Phase]] = field(default_factory=list)  # replicates after the first

    def sides(self) -> tuple[list[Phase], list[Phase]]:
        """Every replicate's speculative phases, then its plain ones."""
        pairs = [(self.spec, self.plain), *self.again]
        return [s for s, _ in pairs], [p for _, p in pairs]

    def figures(self, plain: bool) -> list[float | None]:
        """Each replicate's seconds per step on one side."""
        return [per_step(p.steady(), plain) for p in self.sides()[plain]]

    def agrees(self) -> bool:
        """Both sides have two replicates within AGREE (a single replicate agrees trivially)."""
        if not self.again:
            return True
        return all(agree(self.figures(plain)) for plain in (False, True))

    def kept(self, plain: bool) -> list[Phase]:
        """The phases a side's figure pools (`steps.fastest`)."""
        phases = self.sides()[plain]
        return [phases[i] for i in fastest(self.figures(plain))] or phases[:1]

    def left_out(self) -> list[str]:
        """One line per replicate a side's figure leaves out: which, and how far off it ran."""
        lines = []
        for plain, side in ((False, "speculative"), (True, "plain")):
            figures = self.figures(plain)
            kept = fastest(figures)
            pooled_figure = self.seconds(plain)
            for i, f in enumerate(figures):
                if i not in kept and f is not None and pooled_figure:
                    lines.append(
                        f"c={self.concurrency} {side}: replicate {i + 1} ran at "
                        f"x{f / pooled_figure:.2f} of the fastest's seconds a step (left out)"
                    )
        return lines

    def seconds(self, plain: bool) -> float | None:
        """A side's seconds per step: its kept replicates pooled."""
        return per_step(pooled([p.steady() for p in self.kept(plain)]), plain)

    def spread(self, plain: bool) -> float | None:
        """A side's error over the whole run (`steps.spread`): every replicate's distance from
        the figure, kept or not, at least twice the standard error."""
        figure = self.seconds(plain)
        if figure is None:
            return None
        found = [f for f in self.figures(plain) if f is not None]
        return spread(figure, found, self.error(plain))

    def error(self, plain: bool) -> float | None:
        """A side's relative standard error: the kept replicates' spread, or with one
        replicate the spread within its steady span (`Phase.relative_error`)."""
        figures = [per_step(p.steady(), plain) for p in self.kept(plain)]
        found = [f for f in figures if f is not None]
        if len(found) >= 2:
            return replicate_error(found)
        return self.kept(plain)[0].relative_error(plain)

    def draft_seconds(self) -> dict[int, float]:
        """Seconds per verify step at each draft length whose phase drafted that many tokens."""
        found = {}
        for length, phase in sorted(self.drafting.items()):
            counted = phase.counted
            if counted is None or not counted.drafts or counted.draft_tokens is None:
                continue
            if counted.draft_tokens / counted.drafts > length * 1.05:  # it drafted more
                continue
            _, seconds, steps = phase.decode()
            if steps:
                found[length] = seconds / steps
        return found

    def row(self) -> dict[str, Any]:
        """The level as the `--json` document has it (None where it cannot be said): with the
        draft tokens per step of its speculative phase, the context its requests held, what a
        step gains per token more of it (from the lengthened phases) and each step's relative
        standard error."""
        spec_phases, plain_phases = self.kept(False), self.kept(True)
        spec = pooled([p.steady() for p in spec_phases])
        plain = pooled([p.steady() for p in plain_phases])
        spec_rate = spec.tokens / spec.seconds if spec.seconds else None
        plain_rate = plain.tokens / plain.seconds if plain.seconds else None
        samples = [b for p in (*spec_phases, *plain_phases) for b in p.batch()]
        busy = sum(samples)  # weighed by requests: the batch a running request sees
        contexts = [c for c in (spec.context, plain.context) if c is not None]
        slopes: tuple[float | None, float | None] = (None, None)
        if self.longer is not None:
            long_spec, long_plain = (p.steady() for p in self.longer)
            slopes = (_per_context_token(plain, long_plain, True),
                      _per_context_token(spec, long_spec, False))  # fmt: skip
        return {
            "concurrency": self.concurrency,
            "requests": len(self.spec.requests),
            "running": sum(b * b for b in samples) / busy if busy else None,
            "verify_seconds": spec.seconds / spec.steps if spec.steps else None,
            "verify_drafts": (
                spec.draft_tokens / spec.steps if spec.steps and spec.draft_tokens else None
            ),
            "draft_seconds": self.draft_seconds(),
            "plain_seconds": plain.seconds / plain.tokens if plain.tokens else None,
            "context": statistics.fmean(contexts) if contexts else None,
            "plain_per_context_token": slopes[0],
            "verify_per_context_token": slopes[1],
            "plain_error": self.error(True),
            "verify_error": self.error(False),
            # the error over the whole run: the farthest replicate, kept or not
            "plain_spread": self.spread(True),
            "verify_spread": self.spread(False),
            "replicates": len(self.again) + 1,
            "left_out": self.left_out(),
            "tokens_per_step": spec.tokens / spec.steps if spec.steps else None,
            "decode_tokens_per_second": spec_rate,
            "plain_decode_tokens_per_second": plain_rate,
            "speedup": spec_rate / plain_rate if spec_rate and plain_rate else None,
        }


def _per_context_token(short: Steady, long: Steady, plain: bool) -> float | None:
    """Seconds a step gains per token of context, from a phase and its lengthened twin (a
    plain phase makes one token a step); never below 0 (a step does not get cheaper with
    more to read: a fall is noise). None where the contexts are not known or barely differ."""
    per = (short.tokens, long.tokens) if plain else (short.steps, long.steps)
    if short.context is None or long.context is None or not per[0] or not per[1]:
        return None
    gained = long.context - short.context
    if gained < 0.1 * short.context or gained <= 0:
        return None
    return max(0.0, (long.seconds / per[1] - short.seconds / per[0]) / gained)
