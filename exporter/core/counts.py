"""The value type every layer shares: speculative-decoding counts for one series.

Scraped counters, running sums, window deltas, per-request objects and per-route totals are
all `Counts`, so acceptance, tokens per step and per-position acceptance are defined once
(`ratios`), the way vLLM's SpecDecodingLogging defines them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from itertools import zip_longest
from typing import Any


@dataclass(frozen=True, slots=True)
class Counts:
    """Drafts (verify steps), draft tokens, accepted tokens and accepted tokens per position.

    `per_position[i]` counts steps that accepted more than `i` drafts, so the positions sum to
    `accepted`. A count the engine does not give is None, never 0: `drafts` for engines that
    do not count verify steps (TensorRT-LLM), `draft_tokens` and `accepted` for one that
    counts steps and generated tokens only (SGLang's /metrics; `generated` is set then, and
    its tokens per step are generated / drafts). A sum or difference with an unknown is
    unknown.
    """

    drafts: float | None = 0.0
    draft_tokens: float | None = 0.0
    accepted: float | None = 0.0
    per_position: tuple[float, ...] = ()
    generated: float | None = None

    @property
    def rejected(self) -> float | None:
        """Draft tokens proposed and not accepted (None when either is unknown)."""
        return _combine(self.draft_tokens, self.accepted, -1)

    def __add__(self, other: Counts) -> Counts:
        return Counts(
            _combine(self.drafts, other.drafts, 1),
            _combine(self.draft_tokens, other.draft_tokens, 1),
            _combine(self.accepted, other.accepted, 1),
            tuple(
                a + b for a, b in zip_longest(self.per_position, other.per_position, fillvalue=0.0)
            ),
            _either(self.generated, other.generated, 1),
        )

    def __sub__(self, other: Counts) -> Counts:
        return Counts(
            _combine(self.drafts, other.drafts, -1),
            _combine(self.draft_tokens, other.draft_tokens, -1),
            _combine(self.accepted, other.accepted, -1),
            tuple(
                a - b for a, b in zip_longest(self.per_position, other.per_position, fillvalue=0.0)
            ),
            _either(self.generated, other.generated, -1),
        )


class BadSpecObject(ValueError):
    """A per-request object that is not what vLLM sends (wrong types, impossible counts)."""


def from_spec_object(obj: Mapping[str, Any]) -> Counts:
    """Counts of one vLLM per-request `metrics.speculative_decoding` object; BadSpecObject
    for anything else, so a garbled object is left out rather than counted.

    `acceptance_histogram[j]` is the number of steps that accepted exactly j drafts, so the
    steps that accepted more than i drafts (per position i) are the histogram's tail sums.
    """
    fields = ("num_spec_steps", "num_draft_tokens", "num_accepted_draft_tokens")
    raw_histogram = obj.get("acceptance_histogram")
    given = [obj.get(name) for name in fields]
    given += raw_histogram if isinstance(raw_histogram, list) else [None]
    if not all(type(n) is int and n >= 0 for n in given):  # bool is not a count either
        raise BadSpecObject(f"not a speculative_decoding object: {dict(obj)!r:.200}")
    steps, tokens, accepted, *histogram = (int(n) for n in given)  # type: ignore[arg-type]
    if accepted > tokens or sum(histogram) != steps:
        raise BadSpecObject(f"impossible counts: {dict(obj)!r:.200}")
    per_position = tuple(float(sum(histogram[i + 1 :])) for i in range(len(histogram) - 1))
    return Counts(float(steps), float(tokens), float(accepted), per_position)


def spec_steps_by_length(obj: Mapping[str, Any]) -> dict[int, int] | None:
    """A vLLM object's verify steps by the drafts proposed in them: exact from `per_step_drafted`
    (the `detailed` level), else all at `num_spec_tokens` when the draft tokens say every step
    drafted that many; None when the summary mixes draft lengths (a schedule, adaptive k)."""
    steps, tokens = obj.get("num_spec_steps"), obj.get("num_draft_tokens")
    if type(steps) is not int or type(tokens) is not int:
        return None
    drafted = obj.get("per_step_drafted")
    if isinstance(drafted, list) and len(drafted) == steps:
        if all(type(k) is int and k > 0 for k in drafted) and sum(drafted) == tokens:
            found: dict[int, int] = {}
            for k in drafted:
                found[k] = found.get(k, 0) + 1
            return found
        return None
    k = obj.get("num_spec_tokens")
    if not steps:
        return {}
    if type(k) is int and k > 0 and tokens == k * steps:
        return {k: steps}
    return None


MAX_DRAFT_LENGTH = 64  # the longest draft a config may name: the bound when none is known


def fits(counts: Counts, draft_length: int, completion_tokens: int, choices: int = 1) -> bool:
    """Whether one request's counts can be true of a response of `completion_tokens` tokens (0:
    not known; over its `choices`) from an engine drafting at most `draft_length` tokens per
    step: accepted <= draft tokens <= draft_length x steps, at most draft_length positions, and
    every verify step emits at least one token, so steps <= completion tokens and steps +
    accepted <= completion tokens + draft_length per choice (its last step cut by max_tokens
    or a stop string)."""
    steps, accepted, tokens = counts.drafts or 0.0, counts.accepted, counts.draft_tokens
    if accepted is None or tokens is None:
        return False  # a request's own counts state both
    if (
        accepted > tokens
        or tokens > draft_length * steps
        or len(counts.per_position) > draft_length
    ):
        return False
    return not completion_tokens or (
        steps <= completion_tokens
        and steps + accepted <= completion_tokens + choices * draft_length
    )


def _combine(a: float | None, b: float | None, sign: int) -> float | None:
    return None if a is None or b is None else a + sign * b


def _either(a: float | None, b: float | None, sign: int) -> float | None:
    """Generated tokens: counted by one engine kind only, so a missing side is zero (Counts()
    is the zero of every kind)."""
    return None if a is None and b is None else (a or 0.0) + sign * (b or 0.0)


def total(items: list[Counts]) -> Counts:
    """Sum of `items` (empty sum: zero counts)."""
    result = Counts()
    for item in items:
        result = result + item
    return result


@dataclass(frozen=True, slots=True)
class Ratios:
    """Derived figures; a field is None when its denominator is zero (no traffic, not 0 %)."""

    acceptance: float | None
    mean_acceptance_length: float | None
    per_position: tuple[float, ...] | None


def ratios(counts: Counts) -> Ratios:
    """acceptance = accepted / draft_tokens; tokens per step = 1 + accepted / drafts (SGLang:
    generated / drafts, its own definition); per-position = per_position[i] / drafts
    (P(accepted > i), not conditional)."""
    accepted, tokens, drafts = counts.accepted, counts.draft_tokens, counts.drafts
    acceptance = accepted / tokens if accepted is not None and tokens and tokens > 0 else None
    if drafts is None or drafts <= 0:
        return Ratios(acceptance, None, None)
    if counts.generated is not None:
        return Ratios(None, counts.generated / drafts, None)
    if accepted is None:
        return Ratios(acceptance, None, None)
    return Ratios(
        acceptance,
        1.0 + accepted / drafts,
        tuple(p / drafts for p in counts.per_position),
    )
