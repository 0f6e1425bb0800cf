"""Reading vLLM's per-request `metrics.speculative_decoding`: its documented fields, fields of
newer or older revisions ignored, and anything that cannot be a real object refused."""

from __future__ import annotations

from typing import Any

import pytest

from exporter.core.counts import BadSpecObject, Counts, from_spec_object

SUMMARY = {  # vLLM 0.32, summary level (tests/fixtures/real-vllm-chat.json: these + per_step_*)
    "mean_acceptance_length": 2.75,
    "draft_acceptance_rate": 0.5833333333333334,
    "acceptance_histogram": [1, 0, 2, 1],
    "num_spec_steps": 4,
    "num_accepted_draft_tokens": 7,
    "num_draft_tokens": 12,
    "num_spec_tokens": 3,
}
EXPECTED = Counts(4.0, 12.0, 7.0, (3.0, 3.0, 1.0))


def test_the_summary_object_gives_steps_tokens_and_the_histograms_tail_sums() -> None:
    assert from_spec_object(SUMMARY) == EXPECTED


@pytest.mark.parametrize(
    "extra",
    [
        {"per_step_accepted": [0, 2, 2, 3], "per_step_drafted": [3, 3, 3, 3]},  # detailed
        {"per_step_accepted": None, "per_step_drafted": None},  # a whole response's dump
        {"acceptance_histogram_by_draft_length": {"3": [1, 0, 2, 1]}},  # newer main, adaptive k
        {"acceptance_histogram_by_draft_length": [[1, 0, 2, 1]]},  # whatever its final shape
        {"something_new": {"nested": True}},
    ],
    ids=["detailed", "nulls", "by-length-map", "by-length-list", "unknown"],
)
def test_fields_beyond_the_documented_ones_are_ignored(extra: dict[str, Any]) -> None:
    assert from_spec_object({**SUMMARY, **extra}) == EXPECTED


def test_a_varying_draft_length_needs_nothing_but_the_documented_fields() -> None:
    """Adaptive k: 4 steps drafting 3, 1, 2, 3 tokens (9, not k x steps = 12)."""
    obj = {**SUMMARY, "num_draft_tokens": 9, "acceptance_histogram": [1, 1, 1, 1]}
    obj["num_accepted_draft_tokens"] = 6
    assert from_spec_object(obj) == Counts(4.0, 9.0, 6.0, (3.0, 2.0, 1.0))


@pytest.mark.parametrize(
    "change",
    [
        {"num_draft_tokens": "12"},
        {"num_spec_steps": 4.0},
        {"num_spec_steps": True},
        {"num_accepted_draft_tokens": -1},
        {"num_accepted_draft_tokens": 13},  # more accepted than proposed
        {"num_spec_steps": 5},  # the histogram counts 4 steps
        {"acceptance_histogram": "1,0,2,1"},
        {"acceptance_histogram": None},
    ],
    ids=str,
)
def test_an_object_that_cannot_be_real_is_refused(change: dict[str, Any]) -> None:
    with pytest.raises(BadSpecObject):
        from_spec_object({**SUMMARY, **change})


def test_a_missing_field_is_refused() -> None:
    obj = dict(SUMMARY)
    del obj["num_draft_tokens"]
    with pytest.raises(BadSpecObject):
        from_spec_object(obj)
