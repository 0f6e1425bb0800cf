"""The simulated engine: verify steps, counters, per-request objects and the timing model.

One request = a prefill that yields the first token, then verify steps. The request draws its
own acceptance around its profile's (profiles.py); each step proposes k drafts, of which that
acceptance decides how many are accepted; the step emits accepted + 1 tokens (the bonus token),
cut at max_tokens. Like vLLM, the counters and the per-request object count every accepted
draft, even those max_tokens cuts from the output. A request ends at its natural length (drawn
per profile, at least `min_tokens`) unless `ignore_eos` or a repetition loop runs it to
max_tokens.

Timing: a step's seconds come from `steptime.py` at the state of the request's engine: its
running requests, the tokens they hold in their KV and the prefill chunks riding in the step
(72 tok/s plain and 1.78 plain steps per verify step at k = 3 single-stream; the payoff shrinks
as the batch grows, and moves as contexts grow). A request waits 50-100 ms to be scheduled,
then its prompt is prefilled in chunks of PREFILL_CHUNK tokens, one a step, in the others'
decode steps (vLLM's chunked prefill). `speed` divides every delay; each request keeps its own
timeline (`Pace`), so a late wake-up on a busy host shortens its next wait instead of adding to
the modelled seconds. The engine also keeps, per
profile, what speculation really paid: every verify step's seconds beside the seconds a plain
step would have taken in the same state (`payoff`, the A/B truth at the load).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field

from exporter.core.counts import Counts
from exporter.core.schedule import Schedule
from exporter.sim.metrics import EngineMetrics
from exporter.sim.profiles import DEFAULT_PROFILES, LOOP_ACCEPTANCE, Profile, draw
from exporter.sim.steptime import MODEL, StepShift, StepTime

TEXT = {  # token pieces the simulated model cycles through, per profile
    "ja_chat": tuple(
        "うん|、|そう|だ|ね|！|今日|は|少し|寒い|けど|、|元気|だよ|。|あなた|は|どう|？".split("|")
    ),
    "code_agent": tuple(
        "def| parse|(|line|:| str|)| ->| int|:|\n   | return| int|(|line|.|strip|())|\n".split("|")
    ),
    "default": tuple("Sure|,| here| is| a| short| answer| to| your| question|.".split("|")),
}
LENGTHS = {"ja_chat": (30, 90), "code_agent": (120, 360), "default": (60, 160)}
UNBOUNDED = 32768  # tokens a request without max_tokens may run to (the served max_model_len)
PREFILL_CHUNK = 512  # prompt tokens a step takes in for one request (vLLM's chunked prefill)


@dataclass(frozen=True, slots=True)
class Payoff:
    """Decode steps of a profile: their tokens and seconds, and a plain step's at the same batch."""

    steps: int = 0
    tokens: int = 0
    seconds: float = 0.0
    plain_seconds: float = 0.0

    def __add__(self, other: Payoff) -> Payoff:
        return Payoff(
            self.steps + other.steps,
            self.tokens + other.tokens,
            self.seconds + other.seconds,
            self.plain_seconds + other.plain_seconds,
        )

    @property
    def speedup(self) -> float | None:
        """Decode rate / the plain decode rate at the same batches (1.0 when plain)."""
        if not self.seconds or not self.steps:
            return None
        return (self.tokens / self.seconds) / (self.steps / self.plain_seconds)


SAMPLING_LOSS = 0.4  # the share of its acceptance a request loses at temperature 1


def sampled_share(temperature: float | None) -> float:
    """What a request keeps of its acceptance at `temperature`: 1 - 0.4 min(T, 1.5) (1 greedy
    or unset; 0.72 at 0.7, 0.6 at 1, 0.4 from 1.5). Verifying sampled tokens accepts less than
    greedy ones (a sampled draft matches the target's own sample less often; vLLM's rejection
    sampler keeps more than exact matching, still less than greedy), so the simulator's
    requests lose acceptance with their temperature: the traffic's own change that
    `specdec_route_acceptance_change_ratio` tells from the engine's."""
    return 1.0 - SAMPLING_LOSS * min(temperature or 0.0, 1.5)


@dataclass(frozen=True, slots=True)
class Sampling:
    """The sampling fields of a request that decide its length (vLLM's names), and the draft
    length it caps its steps at (llama-server's `speculative.n_max`; None: the engine's)."""

    max_tokens: int | None = None
    min_tokens: int = 0
    ignore_eos: bool = False
    draft_length: int | None = None
    temperature: float | None = None  # None: the simulator's default, greedy


@dataclass(slots=True)
class Output:
    """What one engine iteration adds to a request: its new tokens (one chunk on the wire)."""

    tokens: list[str]
    finish_reason: str | None = None


@dataclass(slots=True)
class RequestStats:
    """vLLM's RequestSpecDecodeMetrics for one request."""

    draft_length: int
    histogram: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.histogram = self.histogram or [0] * (self.draft_length + 1)  # k + 1 zeros, no step

    draft_tokens: int = 0
    per_step_accepted: list[int] = field(default_factory=list)
    per_step_drafted: list[int] = field(default_factory=list)
    completion_tokens: int = 0

    def to_dict(self, detailed: bool, whole: bool = False) -> dict[str, object]:
        steps = sum(self.histogram)
        accepted = sum(j * n for j, n in enumerate(self.histogram))
        result: dict[str, object] = {
            "mean_acceptance_length": 1.0 + accepted / steps if steps else 1.0,
            "draft_acceptance_rate": accepted / self.draft_tokens if self.draft_tokens else 0.0,
            "acceptance_histogram": list(self.histogram),
            "num_spec_steps": steps,
            "num_accepted_draft_tokens": accepted,
            "num_draft_tokens": self.draft_tokens,
            "num_spec_tokens": self.draft_length,
        }
        if detailed and self.per_step_accepted:
            result["per_step_accepted"] = self.per_step_accepted
            result["per_step_drafted"] = self.per_step_drafted
        elif whole:  # pydantic's full dump of a non-streamed response keeps them, as null
            result |= {"per_step_accepted": None, "per_step_drafted": None}
        return result


class Pace:
    """One request's timeline: each delay is due when the previous one was due plus its seconds
    / speed, not when the previous wait happened to end. A host that wakes the request late (a
    busy core, another test's process) takes that lateness out of the next wait, so the request
    keeps the modelled seconds as long as the host keeps up on average, at any `speed`."""

    def __init__(self, speed: float) -> None:
        self.speed, self.due = speed, time.monotonic()

    async def wait(self, seconds: float) -> None:
        if seconds > 0:
            self.due += seconds / self.speed
            await asyncio.sleep(max(0.0, self.due - time.monotonic()))


class SimEngine:
    def __init__(
        self,
        model: str,
        draft_length: int = 3,
        data_parallel_size: int = 1,
        speed: float = 1.0,
        seed: int = 0,
        profiles: dict[str, Profile] | None = None,
        adaptive: bool = False,
        step_time: StepTime = MODEL,
        schedule: Schedule | None = None,
        shifts: tuple[StepShift, ...] = (),
    ) -> None:
        self.model, self.draft_length = model, draft_length
        # a step's time moved from one start (or one time) to the next, as a GPU's does
        self.shifts, self._born = shifts, time.monotonic()
        self.engines, self.speed = data_parallel_size, speed
        self.adaptive = adaptive  # each step drafts 1..k tokens, as vLLM's adaptive draft length
        # k by the engine's batch at each step, as vLLM's dynamic speculative decoding runs it
        self.schedule = schedule
        self.profiles = dict(profiles or DEFAULT_PROFILES)
        self.spec = draft_length > 0
        self.metrics = EngineMetrics(model, data_parallel_size, draft_length, self.spec)
        self.step_time = step_time
        self.truth: dict[str, Counts] = {}
        self.steps: dict[str, Counter[int]] = {}  # per profile: decode steps by draft length
        self.payoff: dict[str, Payoff] = {}
        self.running = [0] * data_parallel_size
        self.held = [0] * data_parallel_size  # tokens in the KV of each engine's decoding requests
        self.prefilling = [0] * data_parallel_size  # prompt tokens in each engine's next step
        self._rng = random.Random(seed)
        self.seed, self.starts = seed, 0
        self._next_engine = 0

    def restart(self) -> None:
        """Counters back to zero, new `_created` stamps and fingerprint, like a restarted vLLM."""
        self.metrics = EngineMetrics(
            self.model, self.engines, self.draft_length, self.draft_length > 0
        )
        self.starts += 1

    @property
    def fingerprint(self) -> str:
        """vLLM's system_fingerprint changes with every start; twins with one seed share it."""
        return f"vllm-sim-{self.seed:04x}{self.starts:04x}"

    def set_spec(self, on: bool) -> None:
        """Speculation on or off (`spec_off` fault): the counters stay, no drafts are made."""
        self.spec = on and self.draft_length > 0

    async def generate(
        self, profile_name: str, prompt_tokens: int, sampling: Sampling, stats: RequestStats
    ) -> AsyncGenerator[Output]:
        """Yield the request's outputs, one per engine iteration, updating every counter."""
        profile = self.profiles[profile_name]
        rng = random.Random(self._rng.random())
        engine = str(self._next_engine)
        self._next_engine = (self._next_engine + 1) % self.engines
        labels = (self.model, engine)
        lo, hi = LENGTHS.get(profile_name, LENGTHS["default"])
        natural = max(rng.randint(lo, hi), sampling.min_tokens)
        loop = rng.random() < profile.loop_share
        max_tokens = sampling.max_tokens
        if loop or sampling.ignore_eos:
            natural = UNBOUNDED  # no end of sequence comes: max_tokens ends it
        limit = natural if max_tokens is None else min(natural, max_tokens)
        acceptance = LOOP_ACCEPTANCE if loop else profile.request_acceptance(rng)
        acceptance *= sampled_share(sampling.temperature)
        chain = profile.conditional(self.draft_length, acceptance) if self.draft_length else ()
        words = TEXT.get(profile_name, TEXT["default"])
        emitted, finish, held = 0, None, 0
        e = int(engine)
        self._running(engine, +1)
        try:
            start = time.monotonic()
            pace = Pace(self.speed)
            await pace.wait(rng.uniform(0.05, 0.10))
            await self._prefill(e, prompt_tokens, pace)
            held = prompt_tokens
            self.held[e] += held
            self.metrics.prompt_tokens.labels(*labels).inc(prompt_tokens)
            self.metrics.ttft.labels(*labels).observe(time.monotonic() - start)
            while finish is None:
                count = 1
                if emitted:
                    step_start = time.monotonic()
                    count, drafted = self._step(
                        profile.name, chain, rng, labels, stats, limit - emitted,
                        sampling.draft_length,
                    )  # fmt: skip
                    await pace.wait(self._timed(profile.name, engine, count, drafted))
                    self.metrics.itl.labels(*labels).observe(time.monotonic() - step_start)
                tokens = [
                    words[(emitted + i) % len(words)] for i in range(min(count, limit - emitted))
                ]
                emitted += len(tokens)
                held += len(tokens)
                self.held[e] += len(tokens)
                stats.completion_tokens = emitted
                self.metrics.generation_tokens.labels(*labels).inc(len(tokens))
                if emitted >= limit:
                    finish = "length" if limit == max_tokens else "stop"
                yield Output(tokens, finish)
        finally:  # a client that hung up is an abort, as in vLLM
            self.metrics.success.labels(*labels, finish or "abort").inc()
            self.held[e] -= held
            self._running(engine, -1)

    async def _prefill(self, engine: int, prompt_tokens: int, pace: Pace) -> None:
        """The prompt in chunks, each riding in one step of the engine (its seconds as a plain
        step's in the engine's state, the chunk in it)."""
        left = prompt_tokens
        while left > 0:
            chunk = min(left, PREFILL_CHUNK)
            self.prefilling[engine] += chunk
            state = (self.running[engine], self.held[engine], self.prefilling[engine])
            try:
                await pace.wait(self.step_time.plain(*state) * self.shift(False))
            finally:
                self.prefilling[engine] -= chunk
            left -= chunk

    def shift(self, spec: bool) -> float:
        """What a verify (`spec`) or plain step's modelled seconds are multiplied by now
        (`--step-shift`)."""
        elapsed, factor = time.monotonic() - self._born, 1.0
        for shift in self.shifts:
            factor *= shift.factor(spec, self.starts, elapsed)
        return factor

    def _timed(self, profile: str, engine: str, tokens: int, drafted: int) -> float:
        """One step's seconds in the engine's state now, before `speed`; kept in the truth
        (its plain counterfactual with the plain steps' shift)."""
        e = int(engine)
        state = (self.held[e], self.prefilling[e])
        seconds = self.step_time.verify(self.running[e], drafted, *state) * self.shift(drafted > 0)
        plain = self.step_time.plain(self.running[e], *state) * self.shift(False)
        step = Payoff(1, tokens, seconds, plain)
        self.payoff[profile] = self.payoff.get(profile, Payoff()) + step
        return seconds

    def _running(self, engine: str, change: int) -> None:
        self.running[int(engine)] += change
        self.metrics.running.labels(self.model, engine).set(self.running[int(engine)])

    def _step(
        self,
        profile: str,
        chain: tuple[float, ...],
        rng: random.Random,
        labels: tuple[str, str],
        stats: RequestStats,
        room: int,
        cap: int | None = None,
    ) -> tuple[int, int]:
        """One decode step: count its drafts everywhere; return its tokens and draft tokens.
        No draft is accepted past the request's `room` (the tokens it may still make), so its
        tokens are 1 + its steps + its accepted drafts and its plain steps follow from them."""
        steps = self.steps.setdefault(profile, Counter())
        k = 0
        if self.spec:
            k = self.draft_length
            if self.schedule is not None:
                k = min(self.schedule.draft_length(self.running[int(labels[1])]), self.draft_length)
            elif self.adaptive:
                k = rng.randint(1, self.draft_length)
            if cap is not None:
                k = min(k, cap)
        steps[k] += 1
        if not k:
            return 1, 0
        # a draft that was not proposed is not accepted, nor one past the request's end
        accepted = min(draw(rng, chain), k, max(room - 1, 0))
        assert self.metrics.spec_counters is not None
        drafts, proposed, accepted_tokens, per_pos = self.metrics.spec_counters
        drafts.labels(*labels).inc()
        proposed.labels(*labels).inc(k)
        accepted_tokens.labels(*labels).inc(accepted)
        for pos in range(accepted):
            per_pos.labels(*labels, str(pos)).inc()
        drafted = self.metrics.drafted_per_position
        for pos in range(k):
            drafted[pos] = drafted.get(pos, 0) + 1
        self.metrics.last_step = (accepted, k)
        stats.histogram[accepted] += 1
        stats.draft_tokens += k
        stats.per_step_accepted.append(accepted)
        stats.per_step_drafted.append(k)
        step = Counts(
            1, k, accepted, tuple(1.0 if p < accepted else 0.0 for p in range(self.draft_length))
        )
        self.truth[profile] = self.truth.get(profile, Counts()) + step
        return accepted + 1, k
