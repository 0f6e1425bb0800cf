"""Acceptance profiles: how often drafts are accepted for a kind of request.

A profile's `acceptance` is the mean share of draft tokens accepted (accepted / draft tokens, vLLM's
acceptance rate) at k = 3, as published; at other k the same per-position chain is cut or
extended, so the acceptance rate falls with k as a real drafter's does. Requests differ: each
draws its own acceptance from Beta(acceptance * c, (1 - acceptance) * c), c the profile's
`concentration` (15 gives the per-request sd of ~0.11-0.12 seen in published per-request traces;
infinity makes every request alike). Drafts are verified left to right and the first rejection
ends the step, so position i is reached only if 0..i-1 were accepted; its conditional acceptance
decays with the position (`q_i = q_0 * decay**i`), which gives vLLM's falling per-position
curve. `q_0` is solved so that a step's expected acceptance equals the request's. A share of
requests (`loop_share`) can be repetition loops: acceptance near 1, generating until max_tokens.
"""

from __future__ import annotations

import functools
import math
import random
import re
from dataclasses import dataclass

_JAPANESE = re.compile(r"[\u3040-\u30ff\u4e00-\u9fff]")
_CODE = re.compile(
    r"```|\b(def|class|import|return|function|code|coding|script|implement|refactor|bug|"
    r"python|sql|bash|rust|typescript|javascript|dockerfile|regex|api)\b",
    re.IGNORECASE,
)


DEFAULT_CONCENTRATION = 15.0
REFERENCE_DRAFT_LENGTH = 3  # a profile's acceptance is the published one, at k = 3
LOOP_ACCEPTANCE = 0.98  # a repetition loop: the drafter predicts the loop almost perfectly


@dataclass(frozen=True, slots=True)
class Profile:
    name: str
    acceptance: float
    decay: float = 0.85  # in (0, 1]
    concentration: float = DEFAULT_CONCENTRATION  # of the per-request Beta; inf: all alike
    loop_share: float = 0.0  # requests that are repetition loops

    def __post_init__(self) -> None:
        if not (0 <= self.acceptance <= 1 and 0 < self.decay <= 1 and 0 <= self.loop_share <= 1):
            raise ValueError("acceptance and loop_share must be in [0, 1], decay in (0, 1]")
        if not self.concentration > 0:
            raise ValueError("concentration must be > 0 (inf: identical requests)")

    def request_acceptance(self, rng: random.Random) -> float:
        """One request's own acceptance, drawn around the profile's."""
        mean, c = self.acceptance, self.concentration
        if math.isinf(c) or not 0 < mean < 1:
            return mean
        return rng.betavariate(mean * c, (1 - mean) * c)

    def conditional(self, draft_length: int, acceptance: float | None = None) -> tuple[float, ...]:
        """Per-position conditional acceptance q_0..q_{k-1}: the chain whose expected
        acceptance at REFERENCE_DRAFT_LENGTH drafts is `acceptance` (the profile's by default),
        cut or extended to k. A drafter's acceptance at position i does not depend on how many
        positions follow, so a run at another k is what truncating this one predicts."""
        mean = self.acceptance if acceptance is None else acceptance
        first = _first_position(mean, self.decay, REFERENCE_DRAFT_LENGTH)
        return _chain(first, self.decay, draft_length)


def draw(rng: random.Random, conditional: tuple[float, ...]) -> int:
    """Accepted drafts of one verify step: each position in turn, until the first rejection."""
    accepted = 0
    for q in conditional:
        if rng.random() >= q:
            break
        accepted += 1
    return accepted


@functools.lru_cache(maxsize=4096)  # per-request acceptances are continuous: bounded
def _first_position(acceptance: float, decay: float, draft_length: int) -> float:
    """q_0 (before the cap at 1) of the chain whose expected acceptance at k is `acceptance`."""
    lo, hi = 0.0, decay ** -(draft_length - 1)  # at hi every q_i is capped at 1: acceptance 1
    for _ in range(60):
        mid = (lo + hi) / 2
        if expected_acceptance(_chain(mid, decay, draft_length)) < acceptance:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def _chain(q0: float, decay: float, draft_length: int) -> tuple[float, ...]:
    return tuple(min(1.0, q0 * decay**i) for i in range(draft_length))


def expected_acceptance(conditional: tuple[float, ...]) -> float:
    """E[accepted] / k when position i is reached only after 0..i-1 were accepted."""
    reach, total = 1.0, 0.0
    for q in conditional:
        reach *= q
        total += reach
    return total / len(conditional) if conditional else 0.0


DEFAULT_PROFILES = {
    "ja_chat": Profile("ja_chat", 0.36),
    "code_agent": Profile("code_agent", 0.71),
    "default": Profile("default", 0.55),
}


def classify(text: str, uses_tools: bool) -> str:
    """Japanese text -> ja_chat; code-looking or tool-using -> code_agent; else default."""
    if _JAPANESE.search(text):
        return "ja_chat"
    if uses_tools or _CODE.search(text):
        return "code_agent"
    return "default"
