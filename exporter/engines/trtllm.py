"""TensorRT-LLM: `trtllm_spec_decode_*` token counters, per-position drafted and accepted
tokens (`token_position`, 0-based; a position's series appears once it was first drafted), an
acceptance-length gauge and no batch gauge. It counts no verify steps, but every step drafts
position 0, so its drafted tokens there are the steps; pages without them give tokens only.
Its OpenAI API sends no per-request figures."""

from __future__ import annotations

from exporter.core import reasons
from exporter.core.counts import Counts
from exporter.engines.base import Engine, EngineFamilies, Role, dense

NAMES = {
    "num_draft_tokens": Role.DRAFT_TOKENS,
    "num_accepted_tokens": Role.ACCEPTED,
    "drafted_tokens": Role.DRAFTED_PER_POSITION,
    "accepted_tokens": Role.PER_POSITION,
}


class Trtllm(Engine):
    kind = "trtllm"
    prefix = "trtllm_"
    without_object = reasons.ENGINE_SENDS_NONE

    def families(self, prefix: str | None = None) -> EngineFamilies:
        base = (self.prefix if prefix is None else prefix) + "spec_decode_"
        roles = {base + n: r for n, r in NAMES.items()}
        gauges = ((base + "acceptance_length", "acceptance_length"),)
        return EngineFamilies(self, base, roles, "token_position", gauges)

    def series_counts(
        self, values: dict[str, float], accepted: dict[int, float], drafted: dict[int, float]
    ) -> Counts | None:
        """The token counters, or their per-position sums where only those exist; the steps
        are position 0's drafted tokens. A position never accepted has no series yet (0)."""
        if drafted and (
            max(drafted) + 1 != len(drafted) or max(accepted, default=0) >= len(drafted)
        ):
            return None
        tokens = values.get(Role.DRAFT_TOKENS, sum(drafted.values()) if drafted else None)
        taken = values.get(Role.ACCEPTED, sum(accepted.values()) if drafted else None)
        if tokens is None or taken is None:
            return None
        if not drafted:  # nothing drafted yet has no position series either: 0 steps
            return Counts(0.0 if tokens == 0 else None, tokens, taken, ())
        return Counts(drafted[0], tokens, taken, dense(accepted, len(drafted)))


ENGINE = Trtllm()
