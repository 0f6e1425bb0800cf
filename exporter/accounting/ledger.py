"""Per-route accounting: exact counts from each engine's per-request figures, estimates otherwise.

Exact: a request whose response stated its own counts (vLLM's `metrics.speculative_decoding`,
SGLang's spec details; llama.cpp's timings give its draft and accepted tokens, not its steps)
adds them to its route, and its own figures to the request-level view: the per-request moments
behind a window's standard error (core/stats.py), its acceptance in a histogram, whether
speculation made it slower (its own tokens per step below the model's step cost) and whether it
looks like a repetition loop (acceptance near 1 and cut by max_tokens). Estimated (no figures
sent, n > 1): the engine's work that no exact request explains, shared out over the routes by
their requests' tokens (`apportion.py`). Both are kept apart by the `source` label. `read`
gives one immutable snapshot of it all (`snapshot.py`).
"""

from __future__ import annotations

from bisect import bisect_left
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TypeVar

from exporter.accounting.apportion import Apportioner
from exporter.accounting.snapshot import (
    DecodeKey,
    Example,
    Histogram,
    RouteKey,
    SliceChange,
    SliceKey,
    Snapshot,
    WindowReading,
)
from exporter.config import Breakdown, ModelConfig
from exporter.core.counts import MAX_DRAFT_LENGTH, Counts, total
from exporter.core.payoff import Decode, Load, decode_steps
from exporter.core.reading import RouteWindow
from exporter.core.slices import SliceCounts, Slices
from exporter.core.stats import RequestMoments
from exporter.core.windows import History, Window

BASELINE_SNAPSHOTS = 500  # a breakdown baseline's snapshots: a day's at ~3-minute spacing
DEFAULT_BREAKDOWN = Breakdown()
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 30.0)
RATE_BUCKETS = (5, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100, 120, 150, 200, 300, 500, 1000)
# per-request acceptance: fine near 0 (collapsed drafts) and near 1 (repetition loops)
ACCEPTANCE_BUCKETS = (
    0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.98, 0.99, 1.0
)  # fmt: skip
# seconds an exemplar holds its bucket against a newer request that is neither lower nor slower:
# recent enough to be in the logs' and traces' retention, telling enough to be worth a click
EXEMPLAR_FRESH = 60.0
RUNAWAY_ACCEPTANCE = 0.95  # with finish_reason "length": the signature of a repetition loop
FINISH_REASONS = frozenset(("stop", "length", "tool_calls", "abort"))  # the rest: "other"


@dataclass(slots=True)
class Buckets:
    """A histogram kept by hand, so the collector can build its family fresh on each scrape."""

    bounds: tuple[float, ...]
    higher_tells: bool = False  # a bucket's exemplar: its highest value (TTFT), else its lowest
    counts: list[int] = field(default_factory=list)
    sum: float = 0.0
    examples: list[Example | None] = field(default_factory=list)  # one per bucket, if kept

    def observe(self, value: float, example: Example | None = None) -> None:
        if not self.counts:
            self.counts = [0] * (len(self.bounds) + 1)
        at = bisect_left(self.bounds, value)  # the first bound >= value, or +Inf
        self.counts[at] += 1
        self.sum += value
        if example is not None:
            if not self.examples:
                self.examples = [None] * (len(self.bounds) + 1)
            if _telling(example, self.examples[at], -1.0 if self.higher_tells else 1.0):
                self.examples[at] = example

    def read(self) -> Histogram:
        return Histogram(self.bounds, tuple(self.counts), self.sum, tuple(self.examples))


def _telling(new: Example, old: Example | None, sign: float) -> bool:
    """Whether `new` should stand for its bucket instead of `old`: the worse value (the lower
    acceptance or decode rate, sign 1; the longer TTFT, sign -1), then the slower request,
    among those of the last EXEMPLAR_FRESH seconds; an older one gives way to any."""
    if old is None or new.at - old.at > EXEMPLAR_FRESH:
        return True
    return (sign * new.value, -new.seconds) < (sign * old.value, -old.seconds)


def _example(req: RequestOutcome, value: float) -> Example | None:
    """The request as its bucket's exemplar of `value`, where it carries a trace id."""
    if not req.trace_id:
        return None
    return Example(req.trace_id, req.request_id, value, req.at, req.seconds)


@dataclass(frozen=True, slots=True)
class RequestOutcome:
    """What the proxy learned about one request once it ended (or failed, or was dropped)."""

    route: str
    model_name: str
    status: str
    completion_tokens: int = 0
    prompt_tokens: int | None = None  # as the engine stated them (None: not stated)
    finish_reason: str = "other"  # one of FINISH_REASONS, else "other" (`finish_label`)
    ttft: float | None = None
    decode_seconds: float | None = None
    exact: Counts | None = None
    drafted: tuple[int, int] | None = None  # llama.cpp's timings: (draft_n, draft_n_accepted)
    without_exact: str | None = None  # why not, for a 200 (core.reasons)
    increments: tuple[int, ...] = ()  # tokens per content event, when known
    # its decode steps by the drafts proposed in them (0: plain), where the engine stated them
    steps_by_length: tuple[tuple[int, int], ...] = ()
    slices: Slices = ()  # its band of each dimension (core.slices)
    trace_id: str = ""  # its W3C trace id, 32 lowercase hex ("": not traced)
    request_id: str = ""  # the engine's id of it, safe characters only, at most 64
    at: float = 0.0  # when it ended, wall clock
    seconds: float = 0.0  # from its request in to its end


def finish_label(reason: object) -> str:
    """A finish_reason label value: one of the known reasons, or "other"."""
    return reason if isinstance(reason, str) and reason in FINISH_REASONS else "other"


class Accounting:
    def __init__(
        self,
        routes: Sequence[str],
        windows: Sequence[Window],
        models: Mapping[str, ModelConfig],
        breakdown: Breakdown = DEFAULT_BREAKDOWN,
    ) -> None:
        self.routes = tuple(routes)
        self.models = models
        self.exact: dict[RouteKey, Counts] = {}
        self.apportioner = Apportioner()  # the estimated counts, and what they are shared by
        self.requests: Counter[tuple[str, str, str, str]] = Counter()  # + status, finish
        # decode steps by draft length (a str: the label), of the requests that stated them
        self.steps_by_length: Counter[tuple[str, str, str]] = Counter()
        self.without_exact: Counter[tuple[str, str, str]] = Counter()  # + reason
        self.moments: dict[RouteKey, RequestMoments] = {}
        self.acceptance: dict[RouteKey, Buckets] = {}  # per-request acceptance
        self.below_breakeven: Counter[RouteKey] = Counter()
        self.runaway: Counter[RouteKey] = Counter()
        self.generation_tokens: Counter[RouteKey] = Counter()
        self.decode: dict[DecodeKey, Decode] = {}
        self.ttft: dict[RouteKey, Buckets] = {}
        self.decode_rate: dict[RouteKey, Buckets] = {}
        # the proxy's sums begin at zero: a route first seen in a window counts from zero
        self.history: History[RouteKey, Counts] = History(windows, born_at_zero=True)
        self.decode_history: History[DecodeKey, Decode] = History(windows, born_at_zero=True)
        self.moments_history: History[RouteKey, RequestMoments] = History(
            windows, born_at_zero=True
        )
        # the engine's work as each tick apportioned it, sampled at the routes' instants so
        # that a window's coverage compares the two over the same seconds
        self.engine_work: dict[tuple[str], Counts] = {}  # per (model_name,)
        self.engine_history: History[tuple[str], Counts] = History(windows, born_at_zero=True)
        # the exact requests' counts by band of each dimension, over the breakdown's window
        # and its baseline (core.slices)
        self.slices: dict[SliceKey, SliceCounts] = {}
        self.breakdown = breakdown
        self.slice_history: History[SliceKey, SliceCounts] = History(
            (breakdown.window,), born_at_zero=True
        )
        self.slice_baseline: History[SliceKey, SliceCounts] = History(
            (breakdown.baseline,), True, breakdown.baseline.seconds / BASELINE_SNAPSHOTS
        )

    def reconfigure(
        self,
        routes: Sequence[str],
        windows: Sequence[Window],
        models: dict[str, ModelConfig],
        breakdown: Breakdown = DEFAULT_BREAKDOWN,
    ) -> None:
        """A reloaded config's routes, windows (over the same history), models and breakdown;
        the counters are untouched. Requests in flight hold this object, so it takes them in
        place."""
        self.routes = tuple(routes)
        self.models = models
        if tuple(windows) != self.history.windows:
            self._rewindow(windows)
        if breakdown != self.breakdown:
            self.breakdown = breakdown
            self.slice_history = self.slice_history.with_windows((breakdown.window,))
            self.slice_baseline = self.slice_baseline.with_windows(
                (breakdown.baseline,), breakdown.baseline.seconds / BASELINE_SNAPSHOTS
            )

    def _rewindow(self, windows: Sequence[Window]) -> None:
        self.history = self.history.with_windows(windows)
        self.decode_history = self.decode_history.with_windows(windows)
        self.moments_history = self.moments_history.with_windows(windows)
        self.engine_history = self.engine_history.with_windows(windows)

    def draft_length(self, model: str) -> int:
        """The most draft tokens a step of `model` can have: the configured k, else the
        config's bound (an engine's per-position counters show only the positions it has
        accepted so far, llama.cpp's among them: not a bound)."""
        config = self.models.get(model)
        return MAX_DRAFT_LENGTH if config is None else config.num_speculative_tokens

    def record(self, req: RequestOutcome) -> None:
        key = (req.route, req.model_name)
        self.requests[(req.route, req.model_name, req.status, req.finish_reason)] += 1
        if req.status != "200":
            return
        self.generation_tokens[key] += req.completion_tokens
        if req.ttft is not None:
            ttft = self.ttft.setdefault(key, Buckets(TTFT_BUCKETS, higher_tells=True))
            ttft.observe(req.ttft, _example(req, req.ttft))
        if req.decode_seconds:
            self._add_decode(key, req)
        if req.without_exact is not None:
            self.without_exact[(req.route, req.model_name, req.without_exact)] += 1
        for length, n in req.steps_by_length:
            self.steps_by_length[(req.route, req.model_name, str(length))] += n
        if req.exact is not None:
            self._add_exact(key, req.exact)
            self._add_slices(req, req.exact)
            self._request_view(key, req.exact, req)
        elif req.drafted is not None:
            # llama.cpp's own draft and accepted tokens: exact; its verify steps are not known,
            # and are apportioned from the server's counters (weighed by these tokens)
            tokens, accepted = req.drafted
            own = Counts(0.0, float(tokens), float(accepted))
            self._add_slices(req, own)
            self._add_exact(key, own)
            steps = self.apportioner.drafted(key, own)
            self._request_view(key, own, req, steps)
        elif req.increments:
            config = self.models.get(req.model_name)
            draft_length = None if config is None else config.num_speculative_tokens
            self.apportioner.streamed(key, req.increments, draft_length)
        elif req.completion_tokens:
            self.apportioner.tokens_only(key, req.completion_tokens)

    def _decoded(
        self, window: Window, now: float, partial: bool = False
    ) -> dict[RouteKey, tuple[Decode, Decode]]:
        """Per route over the window: the streamed requests' decode, and the part of it whose
        verify steps the engine counted (source exact)."""
        out: dict[RouteKey, tuple[Decode, Decode]] = {}
        for (route, model, source), d in self.decode_history.increase(window, now, partial).items():
            every, exact = out.get((route, model), (Decode(), Decode()))
            out[(route, model)] = (every + d, exact + d if source == "exact" else exact)
        return out

    def _route_windows(
        self, window: Window, now: float, running: Mapping[str, float], partial: bool = False
    ) -> dict[RouteKey, RouteWindow]:
        """Every route's counts over the window, read at once (`core.reading.read_route` makes
        its figures of them): its counts, decode, exact requests' moments and its engine's
        load (`running`: the engine's batch per model)."""
        routes = self.history.increase(window, now, partial)
        decoded = self._decoded(window, now, partial)
        moments = self.moments_history.increase(window, now, partial)
        loads = self._load(window, now, running, partial)
        out = {}
        for key, counts in routes.items():
            every, exact = decoded.get(key, (Decode(), Decode()))
            out[key] = RouteWindow(
                counts,
                every,
                exact,
                moments.get(key, RequestMoments()),
                loads.get(key[1], Load(None)),
            )
        return out

    def _load(
        self, window: Window, now: float, running: Mapping[str, float], partial: bool = False
    ) -> dict[str, Load]:
        """Per model over the window, what its engine ran as every route's requests show it:
        the batch (`running`, the engine's), the context a decoding request held and the draft
        tokens per decode step of the requests whose steps were counted. One figure for all
        the routes: they share the engine's steps."""
        summed: dict[str, Decode] = {}  # estimated requests add no steps, only their context
        for (_, model, _), d in self.decode_history.increase(window, now, partial).items():
            summed[model] = summed.get(model, Decode()) + d
        return {
            model: Load(running.get(model), d.context, d.drafts_per_step)
            for model, d in summed.items()
        } | {model: Load(b) for model, b in running.items() if model not in summed}

    def _add_decode(self, key: RouteKey, req: RequestOutcome) -> None:
        """A streamed request's decode: its tokens after the first content event (prefill's),
        the seconds from that event to the last, and, when the engine stated its accepted
        drafts (source exact: vLLM's object, llama.cpp's timings), its decode steps (verify
        steps plus the steps that drafted nothing, `core.payoff.decode_steps`) and draft
        tokens; where its prompt's tokens are known, the context it held while decoding."""
        seconds = req.decode_seconds or 0.0
        first = req.increments[0] if req.increments else 1
        tokens = max(req.completion_tokens - first, 0)
        drafted = 0.0
        if req.exact is not None and req.exact.accepted is not None:
            steps: float | None = decode_steps(tokens, req.exact.accepted, req.exact.drafts)
            drafted = req.exact.draft_tokens or 0.0
        elif req.drafted is not None:
            steps = decode_steps(tokens, req.drafted[1])
            drafted = float(req.drafted[0])
        else:
            steps = None
        held = 0.0 if req.prompt_tokens is None else seconds
        context = 0.0 if req.prompt_tokens is None else req.prompt_tokens + first + tokens / 2
        decode_key = (*key, "estimated" if steps is None else "exact")
        self.decode[decode_key] = self.decode.get(decode_key, Decode()) + Decode(
            tokens, seconds, steps or 0.0, drafted, context * held, held
        )
        rate = tokens / seconds
        self.decode_rate.setdefault(key, Buckets(RATE_BUCKETS)).observe(rate, _example(req, rate))

    def _add_slices(self, req: RequestOutcome, exact: Counts) -> None:
        """An exact request's draft and accepted tokens, itself and its completion tokens, to
        its band of each dimension: per dimension the bands add up to the route's exact
        counts."""
        counts = SliceCounts(
            exact.draft_tokens or 0.0, exact.accepted or 0.0, 1.0, float(req.completion_tokens)
        )
        for dimension, band in req.slices:
            key = (req.route, req.model_name, dimension, band)
            self.slices[key] = self.slices.get(key, SliceCounts()) + counts

    def _add_exact(self, key: RouteKey, counts: Counts) -> None:
        self.exact[key] = self.exact.get(key, Counts()) + counts
        self.apportioner.explained(key[1], counts)

    def _request_view(
        self, key: RouteKey, exact: Counts, req: RequestOutcome, steps: float | None = None
    ) -> None:
        """One exact request's own figures: its moments, acceptance, payoff and loop signature.
        `steps`: its verify steps when they are an estimate (llama.cpp), not in `exact`."""
        accepted, tokens = exact.accepted, exact.draft_tokens
        if accepted is None or tokens is None or tokens <= 0:
            return
        moments = self.moments.get(key)
        self.moments[key] = (moments or RequestMoments()).with_request(accepted, tokens)
        acceptance = accepted / tokens
        buckets = self.acceptance.get(key)
        if buckets is None:
            buckets = self.acceptance[key] = Buckets(ACCEPTANCE_BUCKETS)
        buckets.observe(acceptance, _example(req, acceptance))
        config = self.models.get(key[1])
        drafts = exact.drafts or steps
        # slower: its own tokens per step / the step cost < 1
        if config is not None and drafts and 1 + accepted / drafts < config.step_cost_ratio:
            self.below_breakeven[key] += 1
        if req.finish_reason == "length" and acceptance >= RUNAWAY_ACCEPTANCE:
            self.runaway[key] += 1

    @property
    def estimated(self) -> dict[RouteKey, Counts]:
        return self.apportioner.estimated

    def apportion(self, engine_by_model: dict[str, Counts]) -> None:
        """Share the engine's cumulative work per model_name that no exact request explains
        over the routes with estimates (`apportion.py`); kept, for the windows' coverage."""
        self.engine_work = {(model,): work for model, work in engine_by_model.items()}
        self.apportioner.apportion(engine_by_model)

    def summed(self) -> dict[RouteKey, Counts]:
        """Exact plus estimated counts per route: what the rolling windows are computed on."""
        keys = {*self.exact, *self.estimated}
        return {k: self.exact.get(k, Counts()) + self.estimated.get(k, Counts()) for k in keys}

    def read(
        self,
        now: float,
        running: Callable[[Window], Mapping[str, float]] | None = None,
        partial: bool = False,
    ) -> Snapshot:
        """Everything a scrape shows, at `now`, as one immutable reading; `running`: the
        engine's mean batch per model over a window (the fronted target's), for the routes'
        load; None: a reader that formats no route's window (the request-level view), whose
        windows then hold no routes (they cost a scrape most of its time). `partial`: windows
        the history does not cover yet read over what it covers (the demo's lines; a scrape's
        never are)."""
        windows = tuple(
            WindowReading(
                window,
                self.history.covered(window, now),
                _fixed(
                    {}
                    if running is None
                    else self._route_windows(window, now, running(window), partial)
                ),
                total(list(self.engine_history.increase(window, now, partial).values())),
                _fixed(self.moments_history.increase(window, now, partial)),
            )
            for window in self.history.windows
        )
        in_window = self.slice_history.increase(self.breakdown.window, now)
        # the baseline ends where the window begins: a drop inside the window is not also in
        # what it is compared with (both histories end at the same newest tick)
        in_baseline = {
            key: counts - in_window.get(key, SliceCounts())
            for key, counts in self.slice_baseline.increase(
                self.breakdown.baseline, now, True
            ).items()
        }
        change = SliceChange(
            self.breakdown.window, self.breakdown.baseline, _fixed(in_window), _fixed(in_baseline)
        )
        return Snapshot(
            requests=_fixed(self.requests),
            without_exact=_fixed(self.without_exact),
            steps_by_length=_fixed(self.steps_by_length),
            exact=_fixed(self.exact),
            estimated=_fixed(self.estimated),
            generation_tokens=_fixed(self.generation_tokens),
            decode=_fixed(self.decode),
            ttft=_fixed({k: b.read() for k, b in self.ttft.items()}),
            decode_rate=_fixed({k: b.read() for k, b in self.decode_rate.items()}),
            moments=_fixed(self.moments),
            acceptance=_fixed({k: b.read() for k, b in self.acceptance.items()}),
            below_breakeven=_fixed(self.below_breakeven),
            runaway=_fixed(self.runaway),
            slices=_fixed(self.slices),
            windows=windows,
            change=change,
        )

    def tick(self, now: float) -> None:
        self.history.record(now, self.summed())
        self.decode_history.record(now, dict(self.decode))
        self.moments_history.record(now, dict(self.moments))
        self.engine_history.record(now, self.engine_work)
        self.slice_history.record(now, dict(self.slices))
        self.slice_baseline.record(now, dict(self.slices))


Key = TypeVar("Key")
V = TypeVar("V")


def _fixed(table: Mapping[Key, V]) -> Mapping[Key, V]:
    """A copy no reader can change (the values are immutable already)."""
    return MappingProxyType(dict(table))
