"""vLLM V1 (and its re-labelled copies under KServe or Ray): four counter families
(`vllm:spec_decode_num_{drafts,draft_tokens,accepted_tokens,accepted_tokens_per_pos}`), the
batch in `vllm:num_requests_running`, and a per-request `metrics.speculative_decoding` object
on the OpenAI API (n == 1; a stream's usage event carries it)."""

from __future__ import annotations

from exporter.core.counts import Counts
from exporter.engines.base import RUNNING, Engine, EngineFamilies, Role, dense

NAMES = {
    "drafts": Role.DRAFTS,
    "draft_tokens": Role.DRAFT_TOKENS,
    "accepted_tokens": Role.ACCEPTED,
    "accepted_tokens_per_pos": Role.PER_POSITION,
}


class Vllm(Engine):
    kind = "vllm"
    prefix = "vllm:"
    running_suffix: str | None = "num_requests_running"  # the batch gauge, after the prefix
    exact_per_request = frozenset(
        (Role.DRAFTS, Role.DRAFT_TOKENS, Role.ACCEPTED, Role.PER_POSITION)
    )

    def families(self, prefix: str | None = None) -> EngineFamilies:
        own = self.prefix if prefix is None else prefix
        lead = own + "spec_decode_num_"
        running = ((own + self.running_suffix, RUNNING),) if self.running_suffix is not None else ()
        roles = {lead + suffix: role for suffix, role in NAMES.items()}
        return EngineFamilies(self, lead, roles, gauges=running)

    def series_counts(
        self, values: dict[str, float], accepted: dict[int, float], drafted: dict[int, float]
    ) -> Counts | None:
        """All three token families present, positions 0..k-1 without a gap."""
        if any(r not in values for r in (Role.DRAFTS, Role.DRAFT_TOKENS, Role.ACCEPTED)):
            return None
        if accepted and max(accepted) + 1 != len(accepted):
            return None
        return Counts(
            values[Role.DRAFTS],
            values[Role.DRAFT_TOKENS],
            values[Role.ACCEPTED],
            dense(accepted, len(accepted)),
        )


ENGINE = Vllm()
