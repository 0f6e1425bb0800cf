"""The A/B's rules, as pure functions (unit-tested in bench/tests/test_gpu_harness.py).

One round is a speculative phase and a plain phase of the same closed-loop traffic, run one
after the other (phases alternate: spec, plain, spec, plain, ...). A route's A/B in a round is
its decode rate with speculation over its rate without. Rounds are repeated until two of them
agree within a tolerance (5 %); the truth is those two rounds pooled. A round that agrees with
no other is named with the phase that moved (its speculative or its plain phase, whichever is
further from the other rounds' same phase), never averaged in.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

TOLERANCE = 0.05


@dataclass
class Rate:
    """Decode tokens (after each request's first) and their seconds, pooled over requests."""

    tokens: float = 0.0
    seconds: float = 0.0
    requests: int = 0  # finished inside the phase
    partial: int = 0  # cut at its end, counted with what they had decoded

    def add(self, tokens: float, seconds: float) -> None:
        self.tokens += tokens
        self.seconds += seconds
        self.requests += 1

    def add_partial(self, tokens: float, seconds: float) -> None:
        self.tokens += tokens
        self.seconds += seconds
        self.partial += 1

    @property
    def per_second(self) -> float | None:
        return self.tokens / self.seconds if self.seconds > 0 else None

    def __add__(self, other: Rate) -> Rate:
        return Rate(
            self.tokens + other.tokens,
            self.seconds + other.seconds,
            self.requests + other.requests,
            self.partial + other.partial,
        )


@dataclass
class Round:
    """One round: per route, the speculative phase's rate and the plain phase's."""

    spec: dict[str, Rate] = field(default_factory=dict)
    plain: dict[str, Rate] = field(default_factory=dict)

    def ab(self, route: str) -> float | None:
        s, p = self.spec.get(route), self.plain.get(route)
        if s is None or p is None or s.per_second is None or not p.per_second:
            return None
        return s.per_second / p.per_second


def agree(a: float, b: float, tolerance: float = TOLERANCE) -> bool:
    """Whether two A/B figures agree: the larger within `tolerance` of the smaller."""
    return max(a, b) / min(a, b) <= 1 + tolerance


def agreeing_pair(
    rounds: Sequence[Round], route: str, tolerance: float = TOLERANCE
) -> tuple[int, int] | None:
    """The first two rounds (in the order they ran) whose A/B for `route` agree, or None."""
    figures = [r.ab(route) for r in rounds]
    for i, j in itertools.combinations(range(len(rounds)), 2):
        a, b = figures[i], figures[j]
        if a is not None and b is not None and agree(a, b, tolerance):
            return i, j
    return None


def settled(rounds: Sequence[Round], routes: Sequence[str], tolerance: float = TOLERANCE) -> bool:
    """Every route has two agreeing rounds."""
    return all(agreeing_pair(rounds, route, tolerance) is not None for route in routes)


def truth(rounds: Sequence[Round], route: str, pair: tuple[int, int]) -> float | None:
    """The A/B of the two agreeing rounds pooled: their spec tokens / seconds over their plain."""
    spec = rounds[pair[0]].spec[route] + rounds[pair[1]].spec[route]
    plain = rounds[pair[0]].plain[route] + rounds[pair[1]].plain[route]
    if spec.per_second is None or not plain.per_second:
        return None
    return spec.per_second / plain.per_second


def outliers(rounds: Sequence[Round], route: str, pair: tuple[int, int] | None) -> list[str]:
    """Each round outside the agreeing pair, named with the phase that moved: the one whose
    rate is further (relatively) from the median of the other rounds' same phase."""
    named = []
    for i, r in enumerate(rounds):
        if pair is not None and i in pair:
            continue
        others = [o for j, o in enumerate(rounds) if j != i]
        moved = _moved(r, others, route)
        if moved is not None:
            side, ratio = moved
            named.append(f"round {i + 1}: its {side} phase ran at x{ratio:.2f} of the others'")
    return named


def _moved(r: Round, others: Sequence[Round], route: str) -> tuple[str, float] | None:
    found: list[tuple[float, str, float]] = []
    for side in ("spec", "plain"):
        mine = getattr(r, side).get(route)
        theirs = [x for o in others if (x := _rate(getattr(o, side), route)) is not None]
        if mine is None or mine.per_second is None or not theirs:
            continue
        ratio = mine.per_second / statistics.median(theirs)
        found.append((abs(ratio - 1), side, ratio))
    if not found:
        return None
    _, side, ratio = max(found)
    return side, ratio


def _rate(rates: Mapping[str, Rate], route: str) -> float | None:
    found = rates.get(route)
    return None if found is None else found.per_second


@dataclass(frozen=True)
class Verdict:
    """A route at a level: the truth (None: no two rounds agreed), the rounds' A/B figures,
    the agreeing pair and the outliers named."""

    route: str
    truth: float | None
    figures: tuple[float | None, ...]
    pair: tuple[int, int] | None
    outliers: tuple[str, ...]


def verdict(rounds: Sequence[Round], route: str, tolerance: float = TOLERANCE) -> Verdict:
    pair = agreeing_pair(rounds, route, tolerance)
    return Verdict(
        route,
        None if pair is None else truth(rounds, route, pair),
        tuple(r.ab(route) for r in rounds),
        pair,
        tuple(outliers(rounds, route, pair)),
    )


def within(figure: float | None, reference: float | None, bound: float) -> bool | None:
    """Whether `figure` is within `bound` (relative) of `reference`; None when either is missing."""
    if figure is None or reference is None or reference <= 0:
        return None
    return abs(figure / reference - 1) <= bound


def best(options: Mapping[int, float | None]) -> tuple[int, float] | None:
    """The draft length with the highest figure, and its lead over the runner-up (relative)."""
    known = sorted(((v, k) for k, v in options.items() if v is not None), reverse=True)
    if not known:
        return None
    if len(known) == 1:
        return known[0][1], float("inf")
    (top, k), (second, _) = known[0], known[1]
    return k, top / second - 1
