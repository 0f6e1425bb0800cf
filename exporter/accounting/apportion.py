"""The estimated side of per-route accounting: requests without their steps leave estimated
weights, and each tick the engine's work that no exact request explains is shared out over the
routes by those weights, so estimated route counters add up to the engine's own and never go
down (docs/metrics.md, "Per route")."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from exporter.accounting.snapshot import RouteKey
from exporter.core.counts import Counts, total

ACCEPTED_AT = 2  # where `_vector` puts the accepted tokens


@dataclass(slots=True)
class _Weight:
    steps: float = 0.0
    accepted: float = 0.0

    @property
    def tokens_per_step(self) -> float | None:
        return 1 + self.accepted / self.steps if self.steps else None


class Apportioner:
    """Estimated weights per route, and the estimated counts shared out by them (`estimated`)."""

    def __init__(self) -> None:
        self.estimated: dict[RouteKey, Counts] = {}
        self._weights: dict[RouteKey, _Weight] = {}  # cumulative estimated (steps, accepted)
        self._streamed: dict[RouteKey, _Weight] = {}  # the part of it seen in token increments
        self._tokens_only: Counter[RouteKey] = Counter()  # estimated requests without increments
        # llama.cpp: the exact requests' draft and accepted tokens not yet weighed
        self._drafted: dict[RouteKey, Counts] = {}
        self._draft_tokens_per_step: dict[str, float] = {}  # the engine's, per model_name
        self._explained: dict[str, Counts] = {}  # the exact requests' counts per model_name

    def explained(self, model: str, counts: Counts) -> None:
        """An exact request's counts: engine work no estimate is given."""
        self._explained[model] = self._explained.get(model, Counts()) + counts

    def drafted(self, key: RouteKey, own: Counts) -> float | None:
        """A request with its draft and accepted tokens but not its steps (llama.cpp's timings):
        weighed at the next `apportion`; its verify steps at the engine's last draft tokens
        per step (None before one is known)."""
        self._drafted[key] = self._drafted.get(key, Counts()) + own
        per_step = self._draft_tokens_per_step.get(key[1])
        return (own.draft_tokens or 0.0) / per_step if per_step else None

    def streamed(
        self, key: RouteKey, increments: tuple[int, ...], draft_length: int | None
    ) -> None:
        """A streamed request without figures: each content event after prefill's first is one
        step or, with a draft length k configured, the fewest steps of at most k + 1 tokens
        that make it."""
        for weight in (
            self._weights.setdefault(key, _Weight()),
            self._streamed.setdefault(key, _Weight()),
        ):
            for tokens in increments[1:]:
                steps = 1 if draft_length is None else max(1, -(-tokens // (draft_length + 1)))
                weight.steps += steps
                weight.accepted += tokens - steps

    def tokens_only(self, key: RouteKey, tokens: int) -> None:
        """An unstreamed request without figures: its tokens, weighed at the next `apportion`."""
        self._tokens_only[key] += tokens

    def apportion(self, engine_by_model: dict[str, Counts]) -> None:
        """Give the engine work no exact request explains to the routes with estimates.

        `engine_by_model` is the engine's cumulative work per model_name since the proxy
        started. Each route's cumulative share of that unexplained work follows its cumulative
        estimated weight (steps for drafts, draft tokens and positions; accepted tokens for
        accepted); a route only ever receives more, so its counters never go down. An engine
        whose counters carry no model_name (llama.cpp: one model per server) is every model's.
        """
        for model, engine in engine_by_model.items():
            # SGLang's page counts no draft or accepted tokens: its routes are all exact anyway
            steps, accepted, tokens = engine.drafts, engine.accepted, engine.draft_tokens
            if steps is None or steps <= 0 or accepted is None or tokens is None:
                continue

            def served(key: RouteKey, model: str = model) -> bool:
                return model == "" or key[1] == model

            self._weigh(model, served, 1 + accepted / steps, tokens / steps or 1.0)
            weights = {k: w for k, w in self._weights.items() if served(k)}
            if not weights:
                continue
            explained = (
                total(list(self._explained.values()))
                if model == ""
                else self._explained.get(model, Counts())
            )
            self._share_out(_vector(engine - explained), weights)

    def _weigh(
        self,
        model: str,
        served: Callable[[RouteKey], bool],
        tokens_per_step: float,
        draft_tokens_per_step: float,
    ) -> None:
        """Turn the requests without steps of `model` into estimated weights: llama.cpp's
        (exact draft and accepted tokens) at the engine's draft tokens per step, and their own
        accepted tokens; the unstreamed ones (tokens only) at the route's own streamed tokens
        per step, else the engine's."""
        self._draft_tokens_per_step[model] = draft_tokens_per_step
        for key in [k for k in self._drafted if served(k)]:
            drafted = self._drafted.pop(key)
            weight = self._weights.setdefault(key, _Weight())
            weight.steps += (drafted.draft_tokens or 0.0) / draft_tokens_per_step
            # the accepted tokens no request explains (those of requests cut short: the
            # client left, their timings never came) go by the routes' own accepted tokens,
            # not evenly: evenly, a low-acceptance route reads high (docs/metrics.md)
            weight.accepted += drafted.accepted or 0.0
        for key in [k for k in self._tokens_only if served(k)]:
            produced = self._tokens_only.pop(key)
            weight = self._weights.setdefault(key, _Weight())
            seen = self._streamed.get(key)
            per_step = (seen and seen.tokens_per_step) or tokens_per_step
            weight.steps += produced / per_step
            weight.accepted += produced - produced / per_step

    def _share_out(self, unexplained: list[float], weights: dict[RouteKey, _Weight]) -> None:
        """Raise each route's estimated counts toward its share of `unexplained` (a `_vector`),
        never lowering one: accepted tokens by the estimated accepted tokens, the rest (drafts,
        draft tokens, positions) by the estimated steps."""
        given = {k: _vector(self.estimated.get(k, Counts()), len(unexplained)) for k in weights}
        steps = sum(w.steps for w in weights.values())
        accepted = sum(w.accepted for w in weights.values())
        even = 1 / len(weights)
        by_steps = {k: w.steps / steps if steps else even for k, w in weights.items()}
        by_accepted = {k: w.accepted / accepted if accepted else even for k, w in weights.items()}
        for index, work in enumerate(unexplained):
            share = by_accepted if index == ACCEPTED_AT else by_steps
            available = work - sum(g[index] for g in given.values())
            deficits = {k: max(0.0, work * share[k] - given[k][index]) for k in weights}
            owed = sum(deficits.values())
            if available > 0 and owed > 0:
                scale = min(1.0, available / owed)
                for k in weights:
                    given[k][index] += deficits[k] * scale
        for k, vector in given.items():
            self.estimated[k] = Counts(vector[0], vector[1], vector[ACCEPTED_AT], tuple(vector[3:]))


def _vector(c: Counts, width: int = 0) -> list[float]:
    """drafts, draft tokens, accepted, positions... as one list (padded to `width`)."""
    values = [c.drafts or 0.0, c.draft_tokens or 0.0, c.accepted or 0.0, *c.per_position]
    return values + [0.0] * (width - len(values))
