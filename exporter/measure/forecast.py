"""How long `measure --concurrency` takes: its plan, said before the first request, and after
each phase the time left, estimated from the phases already run. With its defaults (three
levels, two replicates, the lengthened phases) it runs 18 phases; on a simulated engine that
ran past 13 minutes without a word of how long it would take.

The estimate rests on what the run has seen, nothing assumed: at one level a phase's time
scales with its rounds (requests / workers: each worker sends that many, one after another).
So a phase still to run takes its rounds x the seconds a round of its kind (its side, lengthened
or not; else its side; else any) took: at its level where one has run; else read between the
levels run (linear in the concurrency, as a step's seconds about are); above the highest, from
its two highest and never below it (a step does not get cheaper with the batch); with one level
run, flat, which a higher level only exceeds, so the line says "likely more". Before the first
phase ends there is nothing to read a time from, and the plan says so.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

SPEC = "speculative"
PLAIN = "plain"
LONGER = ", longer context"  # the lengthened phases: SPEC + LONGER, PLAIN + LONGER
FEWER = SPEC + ", fewer drafts"  # a phase at 1 or k - 1 drafts a step (llama.cpp)


@dataclass(frozen=True, slots=True)
class Planned:
    """A phase of the run: its level, its kind, its requests."""

    concurrency: int
    kind: str
    requests: int

    @property
    def rounds(self) -> int:
        """The requests each worker sends in turn: a phase's time at a level scales with them."""
        return math.ceil(self.requests / self.concurrency)


def curve_plan(
    requests: dict[int, int], replicates: int, longer: bool, fewer_drafts: bool
) -> list[Planned]:
    """The phases `measure_curve` runs, in its order, with `requests` a phase at each level:
    each level's speculative phase, then at fewer drafts where the engine takes a draft length
    per request (at most two: k is known after the first phase), its plain one, both
    lengthened; then the other replicates round-robin over the levels. The round a
    disagreement of replicates adds is not in it (`Forecast.maybe`)."""
    first: list[Planned] = []
    for c, n in requests.items():
        first.append(Planned(c, SPEC, n))
        first += [Planned(c, FEWER, n)] * (2 if fewer_drafts else 0)
        first.append(Planned(c, PLAIN, n))
        if longer:
            first += [Planned(c, SPEC + LONGER, n), Planned(c, PLAIN + LONGER, n)]
    again = [Planned(c, kind, n) for c, n in requests.items() for kind in (SPEC, PLAIN)]
    return first + again * (replicates - 1)


def duration(seconds: float) -> str:
    """45s, 12m05s, 1h02m: read at a glance."""
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def _levels(levels: Iterable[int]) -> str:
    return "c=" + ", ".join(str(c) for c in sorted(set(levels)))


EARLY = 8  # the first estimate comes an EARLY-th into the first phase (at least 4 requests)


@dataclass
class Forecast:
    """The phases still to run and what those run took; `say` gets a line early in the first
    phase, a line per phase run (the time left), and one where the plan grows."""

    pending: list[Planned]
    say: Callable[[str], None]
    maybe: int = 0  # phases a disagreement of replicates may add (decided at the end: `settle`)
    took: list[tuple[Planned, float]] = field(default_factory=list)
    early: bool = False  # the first phase's estimate has been said

    def describe(self, spec_url: str, plain_url: str, replicates: int, longer: int) -> str:
        """The plan in one line, before the first request."""
        per_level = {p.concurrency: p.requests for p in self.pending}
        each = [f"{replicates} replicate(s)"] + [f"1 with {longer} tokens more context"] * (
            longer > 0
        )
        fewer = sum(1 for p in self.pending if p.kind == FEWER)
        a_phase = ", ".join(f"{n} at c={c}" for c, n in sorted(per_level.items()))
        first = self.pending[0]
        line = (
            f"plan: {len(per_level)} level(s) ({_levels(per_level)}) x 2 sides ({SPEC} on "
            f"{spec_url}, {PLAIN} on {plain_url}) x {replicates + (longer > 0)} phase(s) "
            f"({', '.join(each)}): {len(self.pending)} phases, "
            f"{sum(p.requests for p in self.pending)} requests (a phase: {a_phase})"
        )
        if fewer:
            line += f", {fewer} of them at 1 and k - 1 drafts a step if the engine drafts them"
        if self.maybe:
            line += f"; up to {self.maybe} more where a level's replicates disagree"
        early = max(4, first.requests // EARLY)
        return (
            f"{line}. The expected time follows {early} requests of the first phase; "
            "--replicates 1, --context-tokens 0 or fewer levels shorten it (measure --help: "
            "what each costs)"
        )

    def during(self, phase: Planned, done: int, elapsed: float) -> None:
        """A request of a phase has ended: early in the first phase (which at c=1 sends its
        requests one after another, minutes on a GPU), the first estimate, said once."""
        if self.took or self.early or done >= phase.requests:
            return
        if done < max(4, phase.requests // EARLY):
            return
        self.early = True
        projected = [(phase, elapsed * phase.requests / done)]
        left = self._left(projected, elapsed)
        self.say(
            f"{done} of the first phase's {phase.requests} requests in {duration(elapsed)}: {left}"
        )

    def done(self, phase: Planned, seconds: float, name: str) -> None:
        """A phase has run (`name`: as its progress lines name it): the time left, said."""
        if phase in self.pending:
            self.pending.remove(phase)
        self.took.append((phase, seconds))
        count = f"{len(self.took)}/{len(self.took) + len(self.pending)}"
        ran = f"phase {count} done ({name}, {phase.requests} requests) in {duration(seconds)}"
        if self.pending:
            self.say(f"{ran}; {self._left(self.took)}")
        elif self.maybe:
            self.say(
                f"{ran}; the replicates are checked: up to {self.maybe} more where they disagree"
            )
        else:
            self.say(f"{ran}; that was the last")

    def drop_fewer_drafts(self, concurrency: int, every: bool) -> None:
        """The phases at fewer drafts that will not run: the rest of a level's (its k asked
        for fewer than two), or all (the engine does not draft what a request asks)."""
        self.pending = [
            p
            for p in self.pending
            if p.kind != FEWER or not (every or p.concurrency == concurrency)
        ]

    def settle(self, added: Iterable[Planned]) -> None:
        """The disagreement round decided: `added` is what it runs (said where any)."""
        self.maybe = 0
        new = list(added)
        self.pending += new
        if new:
            levels = _levels(p.concurrency for p in new)
            self.say(
                f"the replicates disagree at {levels}: one more round; {self._left(self.took)}"
            )

    def _left(self, took: list[tuple[Planned, float]], running: float = 0.0) -> str:
        """The time left, from `took`, less `running` (seconds into the first phase), with what
        it rests on."""
        left = sum(_estimate(took, p) for p in self.pending) - running
        spent = sum(seconds for _, seconds in self.took) + running
        line = (
            f"about {duration(left)} left for {len(self.pending)} phase(s) "
            f"(~{duration(spent + left)} in all)"
        )
        if self.maybe:
            line += f", + up to {self.maybe} where replicates disagree"
        run = {p.concurrency for p, _ in took}
        unseen = {p.concurrency for p in self.pending} - run
        if unseen:
            guess = ", likely more" if len(run) == 1 else ""
            line += f"; {_levels(unseen)} not run yet: read from {_levels(run)}{guess}"
        return line


def _estimate(took: list[tuple[Planned, float]], phase: Planned) -> float:
    """Seconds `phase` should take: its rounds x a round's seconds of its kind (else its side,
    else any kind) at its level, or between or beyond the levels run (`_at`)."""
    side = phase.kind.split(",")[0]
    alike: tuple[Callable[[str], bool], ...] = (
        lambda kind: kind == phase.kind,
        lambda kind: kind.split(",")[0] == side,
        lambda kind: True,
    )
    for same in alike:
        per_round: dict[int, list[float]] = {}
        for p, seconds in took:
            if same(p.kind):
                per_round.setdefault(p.concurrency, []).append(seconds / p.rounds)
        if per_round:
            points = {c: statistics.fmean(v) for c, v in per_round.items()}
            return phase.rounds * _at(points, phase.concurrency)
    return 0.0


def _at(points: dict[int, float], c: int) -> float:
    """A round's seconds at concurrency `c` from the levels run: linear between two of them;
    above the highest, from the two highest, never below the highest; flat below the lowest,
    or with one level."""
    if c in points:
        return points[c]
    levels = sorted(points)
    below = [x for x in levels if x < c]
    above = [x for x in levels if x > c]
    if not below or (not above and len(levels) < 2):
        return points[levels[0] if not below else levels[-1]]
    a, b = (below[-1], above[0]) if above else (levels[-2], levels[-1])
    read = points[a] + (points[b] - points[a]) / (b - a) * (c - a)
    return read if above else max(read, points[b])
