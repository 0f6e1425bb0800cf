"""Fixture pages whose spec-decode counters advance, shared by the benchmarks.

`CounterPage(text).render(step)` returns the page with every `<lead>*_total` spec-decode
counter advanced by `step` verify steps' worth of work: drafts +100 per step, draft tokens
+100*k, accepted tokens per position +100*0.75**(i+1) and accepted tokens their sum. All other
lines (including the `_created` gauges) stay as they are, so the sidecar sees live traffic and
no restart.
"""

from __future__ import annotations

import re
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "fixtures"
PAGE_1ENGINE = FIXTURES / "vllm-0.33-1engine-k3.prom"
PAGE_4ENGINE = FIXTURES / "vllm-0.33-4engine-k5.prom"

DRAFTS_PER_STEP = 100
_SAMPLE = re.compile(r"^(?P<name>[^{ ]+)(?P<labels>\{[^}]*\})? (?P<value>\S+)$")
_POSITION = re.compile(r'position="(\d+)"')


class CounterPage:
    """A page split into fixed text and the spec-decode counter values that advance."""

    def __init__(self, text: str, lead: str = "vllm:spec_decode_num_") -> None:
        self.chunks: list[str] = []  # text between the values; len(values) + 1 of them
        self.values: list[tuple[float, float]] = []  # (value in the page, increase per step)
        positions = [int(p) for p in _POSITION.findall(text)]
        k = max(positions) + 1 if positions else 1
        per_pos = [DRAFTS_PER_STEP * 0.75 ** (i + 1) for i in range(k)]
        increase = {
            "drafts": float(DRAFTS_PER_STEP),
            "draft_tokens": float(DRAFTS_PER_STEP * k),
            "accepted_tokens": sum(per_pos),
        }
        pending: list[str] = []
        for line in text.splitlines(keepends=True):
            match = _SAMPLE.match(line.rstrip("\n"))
            if match is None or not line.startswith(lead) or not match["name"].endswith("_total"):
                pending.append(line)
                continue
            role = match["name"][len(lead) : -len("_total")]
            if role == "accepted_tokens_per_pos":
                position = _POSITION.search(match["labels"] or "")
                step = per_pos[int(position.group(1))] if position else 0.0
            else:
                step = increase.get(role, 0.0)
            pending.append(line[: match.start("value")])
            self.chunks.append("".join(pending))
            self.values.append((float(match["value"]), step))
            pending = [line[match.end("value") :]]
        self.chunks.append("".join(pending))
        self.counters = len(self.values)

    def render(self, step: int) -> str:
        """The page after `step` steps of traffic (step 0 is the fixture as it is)."""
        out = [self.chunks[0]]
        for (base, per_step), chunk in zip(self.values, self.chunks[1:], strict=True):
            out.append(repr(base + per_step * step))
            out.append(chunk)
        return "".join(out)
