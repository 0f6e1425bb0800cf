"""The llama.cpp server: vLLM's four counter names under `llamacpp:` (no labels but the
position; `vllm.spec_decode_families`), the batch in `llamacpp:requests_processing`, and per
request `timings.draft_n` / `draft_n_accepted` (its own draft and accepted tokens, not its
steps). It sends no per-request object; a stream that asks for usage gets its timings moved to
the usage chunk, which would then have to go: nothing is asked."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from exporter.core.counts import MAX_DRAFT_LENGTH, Counts
from exporter.engines.base import Engine, EngineFamilies, Role
from exporter.engines.vllm import spec_decode_counts, spec_decode_families


class Llamacpp(Engine):
    kind = "llamacpp"
    prefix = "llamacpp:"
    exact_per_request = frozenset((Role.DRAFT_TOKENS, Role.ACCEPTED))
    asks_stream_usage = False
    asks_event_usage = False
    # llama-server (llama-cpp-python 0.3.36's vendored build) closes the connection after a
    # streamed response, though its head says `Keep-Alive: timeout=5, max=100`
    keeps_chunked_connections = False

    def families(self, prefix: str | None = None) -> EngineFamilies:
        own = self.prefix if prefix is None else prefix
        return spec_decode_families(self, own, "requests_processing")

    def series_counts(
        self, values: dict[str, float], accepted: dict[int, float], drafted: dict[int, float]
    ) -> Counts | None:
        return spec_decode_counts(values, accepted)

    def worker_fields(self, worker: int) -> dict[str, Any]:
        """Worker w in slot w (`id_slot`, wrapped by the server past its slots; a busy one waits).
        With a KV stream per slot (llama-server's default with `-np` and no `--kv-unified`) a
        batch is cut into one pass over the weights per run of consecutive busy slots
        (`split_equal(..., sequential)` in llama-batch.cpp), so slots picked by prompt
        similarity made a step's cost follow the server's history (at 4 requests up to 4
        passes), which no curve measured beforehand can hold. Pinned, the busy slots at
        concurrency c are 0..c-1: one pass."""
        return {"id_slot": worker}

    def draft_length_fields(self, draft_length: int) -> dict[str, Any] | None:
        """`speculative.n_max`, llama-server's per-request cap (a build that ignores it shows
        in its counters: `specdec measure` checks the drafts it got)."""
        return {"speculative.n_max": draft_length}

    def reads_finish_event(self, event: bytes) -> bool:
        return b'"timings":{' in event

    def finish_timings(self, doc: Mapping[str, Any]) -> dict[str, Any] | None:
        found = doc.get("timings")
        return found if isinstance(found, dict) else None

    def timings(
        self, doc: Mapping[str, Any], streamed: Mapping[str, Any] | None
    ) -> tuple[Mapping[str, Any], int]:
        """On the finish event, or on the usage event when the stream asked for usage."""
        found = streamed or doc.get("timings")
        if not isinstance(found, Mapping):
            return {}, 0
        predicted = found.get("predicted_n")
        return found, predicted if type(predicted) is int and predicted >= 0 else 0

    def prompt_tokens(self, usage: Mapping[str, Any], timings: Mapping[str, Any]) -> int | None:
        """The usage's, else its timings' `prompt_n` evaluated + `cache_n` reused (a stream
        gets no usage unless it asks, and asking moves the timings)."""
        stated = super().prompt_tokens(usage, timings)
        evaluated, cached = timings.get("prompt_n"), timings.get("cache_n", 0)
        if stated is None and type(evaluated) is int and type(cached) is int:
            return evaluated + cached if evaluated >= 0 and cached >= 0 else None
        return stated

    def drafted(self, timings: Mapping[str, Any], draft_length: int) -> tuple[int, int] | None:
        """Its draft and accepted tokens, when they can be true: at most `draft_length` drafts
        per generated token, none accepted beyond them; a request that drafted nothing has no
        draft_n (it did no verify step)."""
        predicted = timings.get("predicted_n")
        if type(predicted) is not int or predicted < 0:
            return None
        tokens, accepted = timings.get("draft_n", 0), timings.get("draft_n_accepted", 0)
        if (
            type(tokens) is int
            and type(accepted) is int
            and 0 <= accepted <= min(tokens, predicted)
            and tokens <= draft_length * predicted
        ):
            return tokens, accepted
        return None

    def stream_counts(self, events: Sequence[Mapping[str, Any]]) -> Counts | None:
        """Its draft and accepted tokens from the last event with `timings` (the finish event,
        or the usage event when the stream asked for usage); its verify steps are not sent."""
        timings = next(
            (e["timings"] for e in reversed(events) if isinstance(e.get("timings"), dict)), None
        )
        found = None if timings is None else self.drafted(timings, MAX_DRAFT_LENGTH)
        return None if found is None else Counts(None, float(found[0]), float(found[1]))


ENGINE = Llamacpp()
