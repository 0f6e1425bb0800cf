"""What the sidecar knows of a serving engine, as one protocol per concern: `ScrapeHooks` (which
/metrics families carry its speculative-decoding counters and how a series of them reads as
`Counts`), `ProxyHooks` (what the proxy asks of a completion request, how a finished response's
per-request figures read) and `LoadHooks` (the body members and events a load generator uses).
Each side is typed with its own, so it can lean on no other's. `Engine` gives every hook a
neutral default; one module per engine overrides what differs, and `exporter.engines` is the
registry."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, ClassVar, Protocol

from exporter.core import reasons
from exporter.core.counts import Counts


class Role(StrEnum):
    """What a counter family counts, whatever the engine calls it."""

    DRAFTS = "drafts"
    DRAFT_TOKENS = "draft_tokens"
    ACCEPTED = "accepted"
    PER_POSITION = "per_position"
    DRAFTED_PER_POSITION = "drafted_per_position"  # TensorRT-LLM: position 0 = the steps
    GENERATED = "generated"  # SGLang: generation tokens, with its verify calls the steps


RUNNING = "running_requests"  # the engine's batch: requests in model execution now


@dataclass(frozen=True, slots=True)
class EngineFamilies:
    """Family base names (without `_total` / `_created`) for one engine and prefix."""

    engine: ScrapeHooks
    lead: str  # the common start of the counter names: what a page is scanned for
    roles: dict[str, Role]
    position_label: str = "position"
    # the engine's own gauges, kept as they are (sample name -> our name): never counters
    gauges: tuple[tuple[str, str], ...] = ()

    def classify(self, name: str) -> tuple[Role, bool] | None:
        """(role, is_created_gauge) for a sample name, or None when it is not ours."""
        for suffix, created in (("_total", False), ("_created", True)):
            if name.endswith(suffix):
                role = self.roles.get(name[: -len(suffix)])
                return None if role is None else (role, created)
        return None


@dataclass(frozen=True, slots=True)
class RequestFigures:
    """A finished 200's own counts, or why there are none (`core.reasons`); `choices`: how many
    choices the counts are over (their plausibility bound)."""

    exact: Counts | None
    without: str | None
    choices: int = 1
    spec_steps: Mapping[int, int] | None = None  # verify steps by their drafts, where stated


@dataclass(frozen=True, slots=True)
class Response:
    """What the proxy read of a finished 200: the decoded body (or a stream's usage event),
    whether it streamed, the per-request details a stream carried in an event of their own, and
    whether the request asked for one choice."""

    doc: Mapping[str, Any]
    streamed: bool
    streamed_details: object
    single: bool


class ScrapeHooks(Protocol):
    """The scrape side's: an engine's /metrics families and how one series of them reads."""

    @property
    def kind(self) -> str: ...
    @property
    def exact_per_request(self) -> frozenset[Role]: ...
    @property
    def sums_series_labels(self) -> bool: ...
    @property
    def running_gauge(self) -> str | None: ...
    def families(self, prefix: str | None = None) -> EngineFamilies: ...
    def speculates(self, values: dict[str, float]) -> bool: ...
    def series_counts(
        self, values: dict[str, float], accepted: dict[int, float], drafted: dict[int, float]
    ) -> Counts | None: ...


class RequestHooks(Protocol):
    """What both the proxy and a load generator need of a completion request: the flag that asks
    for figures, whether a streamed connection stays open, and the timings and prompt a finished
    one states."""

    @property
    def kind(self) -> str: ...
    @property
    def request_flag(self) -> str | None: ...
    @property
    def keeps_chunked_connections(self) -> bool: ...
    def timings(
        self, doc: Mapping[str, Any], streamed: Mapping[str, Any] | None
    ) -> tuple[Mapping[str, Any], int]: ...
    def prompt_tokens(self, usage: Mapping[str, Any], timings: Mapping[str, Any]) -> int | None: ...


class ProxyHooks(RequestHooks, Protocol):
    """The proxy's: what else it asks of a completion request, what it strips from the answer,
    and how a finished response's own figures read."""

    @property
    def asks_stream_usage(self) -> bool: ...
    @property
    def asks_event_usage(self) -> bool: ...
    def request_figures(self, response: Response) -> RequestFigures: ...
    def details_event(self, event: bytes) -> bool: ...
    def event_details(self, doc: Mapping[str, Any] | None) -> object: ...
    def without_asked(self, data: bytes) -> bytes: ...
    def reads_finish_event(self, event: bytes) -> bool: ...
    def finish_timings(self, doc: Mapping[str, Any]) -> dict[str, Any] | None: ...
    def drafted(self, timings: Mapping[str, Any], draft_length: int) -> tuple[int, int] | None: ...


class LoadHooks(RequestHooks, Protocol):
    """A load generator's (`measure`, the bench): the members that pin a worker or a draft
    length, and a stream's own counts."""

    def worker_fields(self, worker: int) -> dict[str, Any]: ...
    def draft_length_fields(self, draft_length: int) -> dict[str, Any] | None: ...
    def stream_counts(self, events: Sequence[Mapping[str, Any]]) -> Counts | None: ...


class Engine:
    """One engine kind, with every side's hooks. Subclasses set the class attributes and
    override what differs."""

    kind: ClassVar[str]  # its name in the config (`engine:`)
    prefix: ClassVar[str]  # its own metric prefix
    # which of a request's counts a finished response states exactly (the rest are apportioned
    # from the engine's counters): Role values
    exact_per_request: ClassVar[frozenset[Role]] = frozenset()
    sums_series_labels: ClassVar[bool] = False  # its counters carry labels of their own: summed
    request_flag: ClassVar[str | None] = None  # a member the proxy sets true on each request
    asks_stream_usage: ClassVar[bool] = True  # a stream's usage event (where the object rides)
    asks_event_usage: ClassVar[bool] = True  # per-event usage while no object comes (n == 1)
    without_object: ClassVar[str] = reasons.NOT_SENT  # the reason when a response has none
    # the connection stays open after a chunked (streamed) response, as HTTP/1.1 keep-alive
    # says: else the proxy does not reuse it (a request written to it would meet the close)
    keeps_chunked_connections: ClassVar[bool] = True

    def families(self, prefix: str | None = None) -> EngineFamilies:
        raise NotImplementedError

    def speculates(self, values: dict[str, float]) -> bool:
        """Whether a series' counters show speculation on (else it is no series of ours)."""
        return True

    def series_counts(
        self,
        values: dict[str, float],
        accepted: dict[int, float],
        drafted: dict[int, float],
    ) -> Counts | None:
        """One series' Counts from its counters by role and per position, or None when the
        page holds it incomplete (a truncated page would look like a restart)."""
        raise NotImplementedError

    def request_figures(self, response: Response) -> RequestFigures:
        """A 200's own counts, where the engine sends them; none here (`without_object`)."""
        if not response.single:
            return RequestFigures(None, reasons.N_ABOVE_1)
        return RequestFigures(None, self.without_object)

    def details_event(self, event: bytes) -> bool:
        """A stream event of its own carrying the request's figures (SGLang's `sglext` event,
        between the finish and the usage events); none here."""
        return False

    def event_details(self, doc: Mapping[str, Any] | None) -> object:
        """The figures such an event carries (decoded), or None."""
        return None

    def without_asked(self, data: bytes) -> bytes:
        """A whole response, or one stream event, without the figures the proxy asked for
        beyond the client's request where they ride in the body (SGLang's details; vLLM's
        usage is the stream tap's); b"" for an event left with nothing. Unchanged here."""
        return data

    def reads_finish_event(self, event: bytes) -> bool:
        """The stream's finish event carries the request's own figures (llama.cpp's
        `timings`): decode it."""
        return False

    def finish_timings(self, doc: Mapping[str, Any]) -> dict[str, Any] | None:
        """The figures on a decoded finish event (see `timings`)."""
        return None

    def timings(
        self, doc: Mapping[str, Any], streamed: Mapping[str, Any] | None
    ) -> tuple[Mapping[str, Any], int]:
        """A finished request's own timings (from its stream's finish event, else its
        response) and the tokens they say it generated; ({}, 0) where it sends none."""
        return {}, 0

    def prompt_tokens(self, usage: Mapping[str, Any], timings: Mapping[str, Any]) -> int | None:
        """The tokens of a request's prompt the engine held in its KV: its usage's (None: not
        stated, or not a count)."""
        stated = usage.get("prompt_tokens")
        return stated if type(stated) is int and stated >= 0 else None

    def worker_fields(self, worker: int) -> dict[str, Any]:
        """Body members that keep a load generator's `worker` on one part of the engine from one
        request to the next, where the part changes a step's cost; none here."""
        return {}

    def draft_length_fields(self, draft_length: int) -> dict[str, Any] | None:
        """Body members that make one request draft at most `draft_length` tokens a step, where
        the engine takes a draft length per request; None where it runs one for all (vLLM)."""
        return None

    def drafted(self, timings: Mapping[str, Any], draft_length: int) -> tuple[int, int] | None:
        """A request's own draft and accepted tokens from its timings, where the engine sends
        them (llama.cpp); None elsewhere."""
        return None

    @property
    def running_gauge(self) -> str | None:
        """The sample name of the engine's batch (requests in model execution), if it has one."""
        return next((name for name, role in self.families().gauges if role == RUNNING), None)

    def stream_counts(self, events: Sequence[Mapping[str, Any]]) -> Counts | None:
        """A streamed completion's own counts, from its events without content (the finish,
        usage and details events) as this engine sends them; None when it sent none. Here: the
        figures `request_figures` reads on the usage event."""
        usage = next((e for e in reversed(events) if e.get("usage") and not e.get("choices")), None)
        if usage is None:
            return None
        return self.request_figures(Response(usage, True, None, True)).exact

    def __repr__(self) -> str:
        return f"<engine {self.kind}>"


def dense(per_position: dict[int, float], positions: int) -> tuple[float, ...]:
    """Positions 0..`positions`-1 (the draft length k), a missing one 0."""
    return tuple(per_position.get(i, 0.0) for i in range(positions))
