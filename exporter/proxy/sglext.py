"""SGLang's per-request speculative-decoding details: reading them, and removing them again.

SGLang (0.5.19+) returns `sglext.spec_tokens_details` on its OpenAI API when a request sets
`"return_spec_tokens_details": true`: at the root of a whole response (absent, never null,
without the flag), and in a stream as its own chunk (`"choices":[]`, `"usage":null`,
`"sglext":{...}`) after the finish chunks and before the usage chunk; a list when n > 1, with
choices that made no verify step left out. `sglext` drops its None members, and SGLang writes
compact JSON with `sglext` as the last key, so removing what the proxy asked for is a cut of
bytes: the `spec_tokens_details` member, or the whole `sglext` (the whole chunk in a stream)
when it was its only member. Nothing is re-encoded, so the client gets SGLang's own bytes.

The key names of the details moved between releases (one meaning, three spellings); all are
read. `spec_num_proposed_drafts` is SGLang's verify steps x (speculative_num_draft_tokens - 1),
`spec_correct_drafts_histogram[j]` the verify steps that accepted exactly j drafts (the bonus
token excluded; it grows to the largest j seen), so per position i the steps that accepted more
than i drafts are its tail sums, as for vLLM's histogram.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from exporter.core.counts import BadSpecObject, Counts, total

FLAG = "return_spec_tokens_details"
_MEMBER = b'"spec_tokens_details":'
_SGLEXT = b'"sglext":{'
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
