"""SGLang: on /metrics it counts verify calls (`sglang:spec_verify_calls_total`, 0.5.13+) and
generation tokens, so its tokens per step are generated / verify calls (its own definition: the
prefill's token included); its acceptance only as gauges of the last logging interval
(`spec_accept_length`, `spec_accept_rate`), kept as gauges; the batch in `num_running_reqs`.
Counters carry labels of their own (is_streaming, custom ones): summed per series.

Per request it returns `sglext.spec_tokens_details` (0.5.19+) when the request sets
`"return_spec_tokens_details": true`: exact steps, draft and accepted tokens and positions, a
list when n > 1 (the choices' sum is exact too), none when no verify step ran.

The key names of the details moved between releases (one meaning, three spellings); all are
read. `spec_num_proposed_drafts` is SGLang's verify steps x (speculative_num_draft_tokens - 1),
`spec_correct_drafts_histogram[j]` the verify steps that accepted exactly j drafts (the bonus
token excluded; it grows to the largest j seen), so per position i the steps that accepted more
than i drafts are its tail sums, as for vLLM's histogram.

Removing them again, where the proxy asked and the client did not: they come at the root of a
whole response (absent, never null, without the flag), and in a stream as their own chunk
(`"choices":[]`, `"usage":null`, `"sglext":{...}`) after the finish chunks and before the usage
chunk. `sglext` drops its None members, and SGLang writes compact JSON with `sglext` as the
last key, so removing them is a cut of bytes: the `spec_tokens_details` member, or the whole
`sglext` (the whole chunk in a stream) when it was its only member. Nothing is re-encoded, so
the client gets SGLang's own bytes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from exporter.core import reasons
from exporter.core.counts import BadSpecObject, Counts, total
from exporter.engines.base import (
    RUNNING,
    Engine,
    EngineFamilies,
    RequestFigures,
    Response,
    Role,
)

FLAG = "return_spec_tokens_details"
# (role, the names it had: newest first, and the release that wrote each)
NAMES: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = (
    ("steps", (("spec_verify_ct", "all releases"),)),
    (
        "accepted",
        (
            ("spec_num_correct_drafts", "0.5.12+"),
            ("spec_accepted_drafts", "0.5.11 (an alias until 0.5.20)"),
            ("spec_accept_token_num", "<= 0.5.10.post1"),
        ),
    ),
    (
        "draft_tokens",
        (
            ("spec_num_proposed_drafts", "0.5.12+"),
            ("spec_proposed_drafts", "0.5.11 (an alias until 0.5.20)"),
            ("spec_draft_token_num", "<= 0.5.10.post1"),
        ),
    ),
    (
        "histogram",
        (
            ("spec_correct_drafts_histogram", "0.5.12+"),
            ("spec_accept_histogram", "<= 0.5.20"),
        ),
    ),
)


def details(doc: Mapping[str, Any] | None) -> object:
    """`sglext.spec_tokens_details` of a response or stream chunk, or None."""
    sglext = doc.get("sglext") if doc is not None else None
    return sglext.get("spec_tokens_details") if isinstance(sglext, dict) else None


def counts(spec: object) -> Counts:
    """One request's counts (a list, n > 1: the sum of its choices'); BadSpecObject for
    anything SGLang does not send."""
    if isinstance(spec, list) and spec:
        return total([_one(item) for item in spec])
    if isinstance(spec, dict):
        return _one(spec)
    raise BadSpecObject(f"not spec_tokens_details: {spec!r:.200}")


def _one(item: object) -> Counts:
    if not isinstance(item, dict):
        raise BadSpecObject(f"not spec_tokens_details: {item!r:.200}")
    found: dict[str, object] = {}
    for role, names in NAMES:
        found[role] = next((item[name] for name, _ in names if name in item), None)
    histogram = found["histogram"] if found["histogram"] is not None else []
    numbers = [found["steps"], found["accepted"], found["draft_tokens"]]
    if not isinstance(histogram, list) or not all(
        type(n) is int and n >= 0 for n in [*numbers, *histogram]
    ):
        raise BadSpecObject(f"not spec_tokens_details: {item!r:.200}")
    steps, accepted, tokens = (int(n) for n in numbers)  # type: ignore[call-overload]
    if accepted > tokens or (histogram and sum(histogram) != steps):
        raise BadSpecObject(f"impossible counts: {item!r:.200}")
    per_position = tuple(float(sum(histogram[i + 1 :])) for i in range(len(histogram) - 1))
    return Counts(float(steps), float(tokens), float(accepted), per_position)


_MEMBER = b'"spec_tokens_details":'
_SGLEXT = b'"sglext":{'


def without_details(data: bytes) -> bytes:
    """`data` (a whole response, or one stream event) as SGLang sends it without the flag:
    the `spec_tokens_details` member cut out of the root's `sglext`, or `sglext` itself when
    nothing else is in it; a stream event left with nothing of its own goes (b""). Anything
    not of SGLang's shape passes unchanged."""
    start = data.rfind(_SGLEXT)
    member = data.find(_MEMBER, start) if start != -1 else -1
    end = _value_end(data, member + len(_MEMBER)) if member != -1 else -1
    if end == -1:
        return data
    inner_open, inner_close = start + len(_SGLEXT), _value_end(data, start + len(_SGLEXT) - 1)
    if inner_close == -1:
        return data
    if member == inner_open and end == inner_close - 1:  # the only member: sglext goes
        if data.startswith(b"data: ") and data[inner_close : inner_close + 1] == b"}":
            head = data[:start].rstrip(b",")
            if head.endswith(b'"choices":[],"usage":null'):
                return b""  # the chunk only carried what the proxy asked for
        comma = start - 1 if data[start - 1 : start] == b"," else start
        return data[:comma] + data[inner_close:]
    if data[end : end + 1] == b",":  # a member follows: take the comma after it
        return data[:member] + data[end + 1 :]
    return data[: member - 1] + data[end:]  # the last member: take the comma before it


def _value_end(data: bytes, at: int) -> int:
    """The index just past the JSON object or array that starts at `at`, or -1 (strings are
    skipped whole, escapes included)."""
    if at >= len(data) or data[at] not in b"[{":
        return -1
    depth, i = 0, at
    while i < len(data):
        byte = data[i]
        if byte == 0x22:  # '"': to the closing quote that no backslash escapes
            i += 1
            while i < len(data) and data[i] != 0x22:
                i += 2 if data[i] == 0x5C else 1
        elif byte in b"[{":
            depth += 1
        elif byte in b"]}":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return -1


class Sglang(Engine):
    kind = "sglang"
    prefix = "sglang:"
    exact_per_request = frozenset(
        (Role.DRAFTS, Role.DRAFT_TOKENS, Role.ACCEPTED, Role.PER_POSITION)
    )
    sums_series_labels = True
    request_flag = FLAG
    asks_event_usage = False  # its details come whatever the usage options

    def families(self, prefix: str | None = None) -> EngineFamilies:
        lead = self.prefix if prefix is None else prefix
        roles = {
            lead + "spec_verify_calls": Role.DRAFTS,
            lead + "generation_tokens": Role.GENERATED,
        }
        gauges = (
            (lead + "spec_accept_length", "acceptance_length"),
            (lead + "spec_accept_rate", "acceptance_rate"),
            (lead + "num_running_reqs", RUNNING),
        )
        return EngineFamilies(self, lead, roles, gauges=gauges)

    def speculates(self, values: dict[str, float]) -> bool:
        return Role.DRAFTS in values  # generation tokens alone: speculation is off

    def series_counts(
        self, values: dict[str, float], accepted: dict[int, float], drafted: dict[int, float]
    ) -> Counts | None:
        """Steps and generated tokens, both present."""
        if Role.GENERATED not in values:
            return None
        return Counts(values[Role.DRAFTS], None, None, generated=values[Role.GENERATED])

    def request_figures(self, response: Response) -> RequestFigures:
        spec = response.streamed_details if response.streamed else details(response.doc)
        if spec is None:  # no verify step ran (speculation off, max_tokens 1), or stripped
            return RequestFigures(None, reasons.NOT_SENT)
        choices = len(spec) if isinstance(spec, list) else 1
        try:
            return RequestFigures(counts(spec), None, choices)
        except BadSpecObject:
            return RequestFigures(None, reasons.UNKNOWN_SHAPE, choices)

    def details_event(self, event: bytes) -> bool:
        return b'"choices":[]' in event and _SGLEXT in event and b'"usage":null' in event

    def event_details(self, doc: Mapping[str, Any] | None) -> object:
        return details(doc)

    def without_asked(self, data: bytes) -> bytes:
        return without_details(data)

    def stream_counts(self, events: Sequence[Mapping[str, Any]]) -> Counts | None:
        """Its details ride on an event of their own (`choices: []`), before the usage event."""
        found = next((d for e in events if (d := details(e)) is not None), None)
        if found is None:
            return None
        return self.request_figures(Response({}, True, found, True)).exact


ENGINE = Sglang()
