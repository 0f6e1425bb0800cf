"""vLLM's dynamic speculative decoding schedule (`num_speculative_tokens_per_batch_size` in its
`--speculative-config`, PR #32374): inclusive batch-size ranges from 1, each with the draft
length the engine runs at that batch; the last range's k holds above it (as vLLM 0.32 reads
it; `specdec advise` prints this shape). One reading for the config that names the schedule an
engine runs, the simulator that runs it and the alerts that follow it."""

from __future__ import annotations

import json
from dataclasses import dataclass


class BadSchedule(ValueError):
    """Not a schedule vLLM would take: the message says which range and why."""


@dataclass(frozen=True, slots=True)
class Schedule:
    ranges: tuple[tuple[int, int, int], ...]  # (first batch, last batch, k), contiguous from 1

    @classmethod
    def parse(cls, value: object) -> Schedule:
        """From vLLM's shape: a list of [start, end, k], or its JSON text."""
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as exc:
                raise BadSchedule(f"not JSON: {exc.msg} at column {exc.colno}") from None
        if not isinstance(value, list) or not value:
            raise BadSchedule("expected a non-empty list of [start, end, k]")
        ranges, expected = [], 1
        for i, item in enumerate(value):
            if not (
                isinstance(item, list)
                and len(item) == 3
                and all(type(n) is int and n >= 0 for n in item)
            ):
                raise BadSchedule(f"range {i + 1}: expected [start, end, k], non-negative ints")
            start, end, k = item
            if start != expected or end < start:
                raise BadSchedule(
                    f"range {i + 1}: [{start}, {end}, ...] must start at {expected} and end at "
                    "or after its start (ranges are contiguous from batch 1)"
                )
            ranges.append((start, end, k))
            expected = end + 1
        return cls(tuple(ranges))

    def range_at(self, batch: float) -> tuple[int, int, int]:
        """The range a batch of `batch` running requests falls in (below 1: the first; above
        the last: the last, whose k holds there)."""
        return next((r for r in self.ranges if batch <= r[1]), self.ranges[-1])

    def draft_length(self, batch: float) -> int:
        """k at a batch of `batch` running requests."""
        return self.range_at(batch)[2]

    def as_config(self) -> list[list[int]]:
        return [list(r) for r in self.ranges]


def draft_length_at(schedule: Schedule | None, draft_length: int, batch: float) -> int:
    """The draft length an engine of `draft_length` (k) runs at `batch`: its schedule's there
    (at most k), else k. One reading for the config, the curve and the collectors."""
    return draft_length if schedule is None else min(schedule.draft_length(batch), draft_length)
