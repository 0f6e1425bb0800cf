"""Acceptance profiles: how often drafts are accepted for a kind of request.

A profile's `acceptance` is the share of draft tokens accepted (accepted / draft tokens, vLLM's
acceptance rate). Drafts are verified left to right and the first rejection ends the step, so
position i is reached only if 0..i-1 were accepted; its conditional acceptance decays with the
position (`q_i = q_0 * decay**i`), which gives vLLM's falling per-position curve. `q_0` is
solved so that the expected acceptance equals `acceptance` exactly.
"""

from __future__ import annotations

import functools
import random
import re
from dataclasses import dataclass

_JAPANESE = re.compile(r"[\u3040-\u30ff\u4e00-\u9fff]")
_CODE = re.compile(
    r"```|\b(def|class|import|return|function|code|coding|script|implement|refactor|bug|"
    r"python|sql|bash|rust|typescript|javascript|dockerfile|regex|api)\b",
    re.IGNORECASE,
)


@dataclass(frozen=True, slots=True)
class Profile:
    name: str
    acceptance: float
    decay: float = 0.85  # in (0, 1]

    def conditional(self, k: int) -> tuple[float, ...]:
        """Per-position conditional acceptance q_0..q_{k-1} whose expected acceptance is ours."""
        return _solve(self.acceptance, self.decay, k)

    def draw(self, rng: random.Random, k: int) -> int:
        """Accepted drafts of one verify step with k drafts."""
        accepted = 0
        for q in self.conditional(k):
            if rng.random() >= q:
                break
            accepted += 1
        return accepted


@functools.cache
def _solve(acceptance: float, decay: float, k: int) -> tuple[float, ...]:
    lo, hi = 0.0, decay ** -(k - 1)  # at hi every q_i is capped at 1: acceptance 1
    for _ in range(60):
        mid = (lo + hi) / 2
        if expected_acceptance(_chain(mid, decay, k)) < acceptance:
            lo = mid
        else:
            hi = mid
    return _chain((lo + hi) / 2, decay, k)


def _chain(q0: float, decay: float, k: int) -> tuple[float, ...]:
    return tuple(min(1.0, q0 * decay**i) for i in range(k))


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
