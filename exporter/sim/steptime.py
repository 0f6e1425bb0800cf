"""How long one decode step takes: a memory-bound floor, batched compute, the KV read, prefills.

A decode step reads every weight once whatever the batch (the floor `weights`), and computes
over every token it processes (`per_token` each): b tokens for a plain step of b running
requests, b x (k + 1) for a verify step of k drafts each; and the prompt tokens of the prefill
chunks riding in it (vLLM's chunked prefill: a new request's prompt is computed in the decode
steps of the others), `prefill_per_token` each: a prompt's tokens go through the weights in
one large product, several times cheaper a token than a batch's few decode tokens (a 27B's
550-token prompt ~50 ms on an H100, ~4 plain steps). The drafter costs a fixed part per
draft position (`draft_floor`, its own weights) and a part per drafted token
(`draft_per_token`). Attention reads every running
request's KV once a step (`kv_per_token` per token held, the k + 1 queries of a verify step
sharing the read), so a step costs more as contexts grow, the same for a plain and a verify
step. In units of the single-stream plain step (1/72 s, the dense-27B figure), with C the
tokens held in the batch's KV and P the prefill tokens in the step:

    plain(b)     = weights + per_token * b + prefill_per_token * P + kv_per_token * C
    verify(b, k) = plain(b) + k * (draft_floor + draft_per_token * b) + per_token * b * k

`kv_per_token` 1.5e-5: a 32B model's bf16 KV (~256 KB a token) against its ~16 GB of NVFP4
weights, the ratio the two reads have on any card.

Calibrated to the published single-stream figures: plain(1) = 1 (72 tok/s) and verify(1, 3) =
1.78 plain steps (x1.12 at 36 % and x1.85 at 71 % acceptance with k = 3). As b grows the step
leaves the memory-bound regime and the verify step's extra tokens cost compute: at k = 3 a
verify step costs 2.24 plain steps at b = 8 and 3.20 at b = 32, so low-acceptance traffic
(2.08 tokens per step) pays x1.17 alone, x0.93 at 8 and x0.65 at 32. Sources: the linear
batch-time model of SmartSpec/TurboSpec (arXiv 2406.14066, goodput from a batch-time model)
and Kong et al. (arXiv 2605.15051, step latency a + b * lambda); the roofline of
`core/payoff.py`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from exporter.core.durations import parse_duration

SINGLE_STREAM_STEP_SECONDS = 1 / 72  # one plain decode step at batch 1


@dataclass(frozen=True, slots=True)
class StepTime:
    """The model's coefficients, in single-stream plain steps."""

    weights: float = 0.98
    per_token: float = 0.02
    draft_floor: float = 0.23
    draft_per_token: float = 0.01
    kv_per_token: float = 1.5e-5
    prefill_per_token: float = 0.006

    def plain(self, batch: int, held: float = 0.0, prefill: float = 0.0) -> float:
        """Seconds of one plain decode step with `batch` running requests, `held` tokens in
        their KV and `prefill` prompt tokens of prefill chunks in the step."""
        return self.verify(batch, 0, held, prefill)

    def verify(self, batch: int, drafts: int, held: float = 0.0, prefill: float = 0.0) -> float:
        """Seconds of one verify step of `drafts` draft tokens per request (0: a plain step)."""
        b = max(batch, 1)
        draft = drafts * (self.draft_floor + self.draft_per_token * b)
        compute = self.per_token * b * (drafts + 1) + self.prefill_per_token * prefill
        return SINGLE_STREAM_STEP_SECONDS * (
            self.weights + draft + compute + self.kv_per_token * held
        )


MODEL = StepTime()


@dataclass(frozen=True, slots=True)
class StepShift:
    """A GPU's behaviour from one start to the next: the plain steps (prefill chunks, a
    schedule's k = 0 steps, every step of a server without speculation) or the verify steps
    taking `fraction` more (less, below 0) time than the model says, from the first
    /admin/restart on (`after` None) or from `after` seconds (wall clock) after the simulator
    started. On a GPU the speculative server's step moved 3-11 % between starts while its plain
    step held (docs/metrics.md): measure on one side of a shift, live traffic on the other."""

    side: str  # "plain" or "spec"
    fraction: float
    after: float | None = None  # seconds after the start; None: from the first restart on

    @classmethod
    def parse(cls, text: str) -> StepShift:
        """SIDE=[+-]FRACTION[@restart|@DURATION], e.g. spec=+0.10 or plain=-0.1@90s."""
        found = re.fullmatch(r"(plain|spec)=([+-]?[0-9.]+)(?:@(.+))?", text.strip())
        if found is None:
            raise ValueError(
                f"{text!r}: wants SIDE=FRACTION[@restart|@DURATION], SIDE plain or spec, "
                "e.g. spec=+0.10 or plain=-0.1@90s"
            )
        side, number, when = found.groups()
        try:
            fraction = float(number)
        except ValueError:
            raise ValueError(f"{text!r}: {number!r} is not a fraction") from None
        if not -0.9 <= fraction <= 10.0:
            raise ValueError(f"{text!r}: the fraction must be within -0.9..10")
        after = None
        if when is not None and when != "restart":
            try:
                after = parse_duration(when)
            except ValueError as exc:
                raise ValueError(f"{text!r}: {exc}") from None
        return cls(side, fraction, after)

    def factor(self, spec: bool, starts: int, elapsed: float) -> float:
        """What a step of that side (`spec`: a verify step) is multiplied by now."""
        if spec != (self.side == "spec"):
            return 1.0
        due = starts >= 1 if self.after is None else elapsed >= self.after
        return 1.0 + self.fraction if due else 1.0
