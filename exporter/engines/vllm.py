"""vLLM V1 (and its re-labelled copies under KServe or Ray): four counter families
(`vllm:spec_decode_num_{drafts,draft_tokens,accepted_tokens,accepted_tokens_per_pos}`), the
batch in `vllm:num_requests_running`, and a per-request `metrics.speculative_decoding` object
on the OpenAI API (n == 1; a stream's usage event carries it). The counter names are shared
with llama.cpp's server under its own prefix: `spec_decode_families` and `spec_decode_counts`
are the helpers both use."""

from __future__ import annotations

from exporter.core import reasons
from exporter.core.counts import BadSpecObject, Counts, from_spec_object, spec_steps_by_length
from exporter.engines.base import (
    RUNNING,
    Engine,
    EngineFamilies,
    RequestFigures,
    Response,
    Role,
    dense,
)

NAMES = {
    "drafts": Role.DRAFTS,
    "draft_tokens": Role.DRAFT_TOKENS,
    "accepted_tokens": Role.ACCEPTED,
    "accepted_tokens_per_pos": Role.PER_POSITION,
}


def spec_decode_families(engine: Engine, prefix: str, running: str) -> EngineFamilies:
    """`{prefix}spec_decode_num_*` by role, and the batch gauge `{prefix}{running}`."""
    lead = prefix + "spec_decode_num_"
    roles = {lead + suffix: role for suffix, role in NAMES.items()}
    return EngineFamilies(engine, lead, roles, gauges=((prefix + running, RUNNING),))


def spec_decode_counts(values: dict[str, float], accepted: dict[int, float]) -> Counts | None:
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


class Vllm(Engine):
    kind = "vllm"
    prefix = "vllm:"
    exact_per_request = frozenset(
        (Role.DRAFTS, Role.DRAFT_TOKENS, Role.ACCEPTED, Role.PER_POSITION)
    )

    def families(self, prefix: str | None = None) -> EngineFamilies:
        own = self.prefix if prefix is None else prefix
        return spec_decode_families(self, own, "num_requests_running")

    def series_counts(
        self, values: dict[str, float], accepted: dict[int, float], drafted: dict[int, float]
    ) -> Counts | None:
        return spec_decode_counts(values, accepted)

    def request_figures(self, response: Response) -> RequestFigures:
        """`metrics.speculative_decoding` of a one-choice 200 (vLLM sends none for n > 1)."""
        if not response.single:
            return RequestFigures(None, reasons.N_ABOVE_1)
        metrics = response.doc.get("metrics")
        spec = metrics.get("speculative_decoding") if isinstance(metrics, dict) else None
        if spec is None:
            return RequestFigures(None, self.without_object)
        if not isinstance(spec, dict):
            return RequestFigures(None, reasons.UNKNOWN_SHAPE)
        try:
            return RequestFigures(from_spec_object(spec), None, 1, spec_steps_by_length(spec))
        except BadSpecObject:
            return RequestFigures(None, reasons.UNKNOWN_SHAPE)


ENGINE = Vllm()
