"""The published payoff analysis as pure functions of measured numbers plus model config.

A verify step with k drafts costs `step_cost_ratio` plain decode steps and yields `tokens per
step` tokens, so speculation pays `tokens_per_step / step_cost_ratio`; it breaks even when
1 + k * acceptance = step_cost_ratio. Decoding reads every weight once per step, so memory
bandwidth / bytes per token bounds plain decode (the roofline).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Decode:
    """Decode tokens and the seconds they took (after each request's first token)."""

    tokens: float = 0.0
    seconds: float = 0.0

    def __add__(self, other: Decode) -> Decode:
        return Decode(self.tokens + other.tokens, self.seconds + other.seconds)

    def __sub__(self, other: Decode) -> Decode:
        return Decode(self.tokens - other.tokens, self.seconds - other.seconds)

    @property
    def rate(self) -> float | None:
        return self.tokens / self.seconds if self.seconds > 0 else None


def estimated_speedup(tokens_per_step: float, step_cost_ratio: float) -> float:
    return tokens_per_step / step_cost_ratio


def breakeven_acceptance(step_cost_ratio: float, k: int) -> float:
    """The acceptance at which speculation neither gains nor loses: (cost - 1) / k."""
    return (step_cost_ratio - 1.0) / k


def decode_ceiling(bandwidth_bytes_per_second: float, bytes_per_token: float) -> float:
    """Roofline: plain decode cannot beat bandwidth / bytes read per token."""
    return bandwidth_bytes_per_second / bytes_per_token
