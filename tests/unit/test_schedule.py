"""vLLM's dynamic speculative decoding schedule, read once: k by batch, the last k above the
last range, and the shapes vLLM would refuse refused with the range named."""

from __future__ import annotations

import pytest

from exporter.config import ModelConfig
from exporter.core.schedule import BadSchedule, Schedule

SCHEDULE = Schedule.parse("[[1,3,3],[4,15,2],[16,256,0]]")


@pytest.mark.parametrize(
    ("batch", "k"), [(0, 3), (1, 3), (3, 3), (3.5, 2), (4, 2), (15, 2), (16, 0), (300, 0)]
)
def test_k_by_batch(batch: float, k: int) -> None:
    assert SCHEDULE.draft_length(batch) == k


def test_the_model_never_runs_more_than_its_k() -> None:
    model = ModelConfig("m", 2, 1.5, draft_length_schedule=SCHEDULE)
    assert [model.scheduled_draft_length(b) for b in (1, 8, 32)] == [2, 2, 0]
    assert ModelConfig("m", 2, 1.5).scheduled_draft_length(32) == 2  # no schedule: its k


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[[2,3,3]]", "range 1: .* must start at 1"),
        ("[[1,3,3],[3,8,2]]", "range 2: .* must start at 4"),
        ("[[1,3,-1]]", "range 1: expected \\[start, end, k\\]"),
        ("[]", "non-empty list"),
        ("[[1,3", "not JSON"),
    ],
)
def test_a_bad_schedule_names_its_range(text: str, message: str) -> None:
    with pytest.raises(BadSchedule, match=message):
        Schedule.parse(text)
