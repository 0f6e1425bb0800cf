"""The true best draft length, as pure functions (unit-tested in bench/tests/test_gpu_harness.py).

At one level, the A/B at k = 0..K in two rounds (ascending, then descending k: a drift over
the rounds cancels), each k's rate over k = 0's (the plain server), the rounds pooled.
`mixed`: the routes together on the engine, every request at k, which is what the sidecar's
options by draft length say (the whole batch at k, on the engine the routes share); `alone`:
each route alone, load without mixing. On the H200 two starts of the same server differ at
c = 16 by up to 13 % (the sweep's k = 3 against the A/B's, docs/BENCHMARKS.md §11, runs 15-21),
so the truth the sidecar is held to is the mixed sweep of its own run, on its own servers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from bench.gpu.rounds import TOLERANCE, Rate, best

MIXES = ("mixed", "alone")


def _ratio(rate: Rate, reference: Rate) -> float | None:
    """rate / reference per second; None when either decoded nothing (no figure, not 0)."""
    a, b = rate.per_second, reference.per_second
    return a / b if a is not None and b else None


def entry(
    concurrency: int,
    route: str,
    mix: str,
    rounds: Sequence[Mapping[int, Rate]],
    rates: Sequence[float] = (),
) -> dict[str, Any]:
    """One route's sweep at one level: per k its speedup (the rounds pooled), each round's, the
    true best k and its lead over the runner-up, and with the route's synthetic `rates` the step
    each k's speedup implies (`implied_steps`)."""
    ks = sorted(rounds[0])
    per_round = [{k: _ratio(r[k], r[0]) for k in ks} for r in rounds]
    pooled = {k: sum((r[k] for r in rounds), Rate()) for k in ks}
    speedup = {k: _ratio(pooled[k], pooled[0]) for k in ks}
    top = best(speedup)
    return {
        "concurrency": concurrency,
        "route": route,
        "mix": mix,
        "speedup": speedup,
        "rounds": per_round,
        "best": None if top is None else top[0],
        "lead": None if top is None else top[1],
        "steps": implied_steps(speedup, rates),
    }


def implied_steps(
    speedup: Mapping[int, float | None], rates: Sequence[float]
) -> dict[int, float | None]:
    """Per k, the step in plain steps that the true speedup implies: E(k) / speedup, E(k) = 1 +
    the route's first k unconditional acceptance rates (what the server's synthetic acceptance
    gives). The sidecar's options are E(k) over its step model, so this row beside measure's
    steps says which of the two a best-k miss comes from (for k past the route's rates: none)."""
    return {
        k: (1 + sum(rates[:k])) / x if x and k <= len(rates) else None for k, x in speedup.items()
    }


Said = int | tuple[int, ...]  # a k the sidecar named, or the ks it called a tie (its top two)


def top_two(options: Mapping[int, float]) -> tuple[int, ...]:
    """The sidecar's top two draft lengths by its own options: what a reading of no best k
    (the top two within its error) left the user to choose between."""
    return tuple(k for _, k in sorted(((v, k) for k, v in options.items()), reverse=True)[:2])


def judged(speedup: Mapping[int, float | None], said: Sequence[Said]) -> str:
    """Whether the sidecar's readings of the best draft length meet the true one: `met` where
    each names the true best k; `met: tie` where it called its top two a tie and the truth
    puts both within the A/B's own tolerance (5 %) of the best, so either choice is right;
    `within error` where it named a k whose truth is within that tolerance of the best;
    otherwise `missed`, with the readings that missed."""
    top = best(speedup)
    if top is None or not said:
        return "-"
    k_best = top[0]
    figure = speedup[k_best] or 0.0

    def close(k: int) -> bool:
        mine = speedup.get(k)
        return mine is not None and bool(figure) and 1 - mine / figure <= TOLERANCE

    verdicts = []
    for k in said:
        if k == k_best:
            verdicts.append("met")
        elif isinstance(k, tuple):
            verdicts.append("met: tie" if len(k) == 2 and all(map(close, k)) else "missed")
        else:
            verdicts.append("within error" if close(k) else "missed")
    if "missed" in verdicts:
        return f"missed ({verdicts.count('missed')} of {len(verdicts)})"
    return "met" if set(verdicts) == {"met"} else " / ".join(sorted(set(verdicts)))


def regret(speedup: Mapping[int, float | None], said: Said) -> float | None:
    """What following a reading costs: 1 - the true speedup at the k it named / the true
    speedup at the true best k; a tie (its top two) is charged the worse of the two. None where
    the truth has no figure for a k it named."""
    top = best(speedup)
    if top is None:
        return None
    figure = speedup[top[0]] or 0.0
    named = said if isinstance(said, tuple) else (said,)
    values = [speedup.get(k) for k in named]
    if not figure or not values or any(v is None for v in values):
        return None
    return max(1 - (v or 0.0) / figure for v in values)


def worst_regret(speedup: Mapping[int, float | None], said: Sequence[Said]) -> float | None:
    """The largest regret of the readings (None: none could be charged)."""
    charged = [r for s in said if (r := regret(speedup, s)) is not None]
    return max(charged) if charged else None


def tally(verdicts: Sequence[str]) -> str:
    """The count line of `judged`'s verdicts, by the issue's rule: the true best k named, or a
    tie the truth bears out; a wrong k within 5 % of the best is counted apart, not as met."""
    counted = [v for v in verdicts if v != "-"]
    near = sum("within error" in v and not v.startswith("missed") for v in counted)
    met = sum(v.startswith("met") and "within error" not in v for v in counted)
    return f"Best draft length: {met} of {len(counted)} met (mixed sweep)" + (
        f"; {near} named a k within 5 % of the best" if near else ""
    )
