"""SGLang's per-request speculative-decoding details: removing them again (reading them is
`engines/sglang.py`).

SGLang (0.5.19+) returns `sglext.spec_tokens_details` on its OpenAI API when a request sets
`"return_spec_tokens_details": true`: at the root of a whole response (absent, never null,
without the flag), and in a stream as its own chunk (`"choices":[]`, `"usage":null`,
`"sglext":{...}`) after the finish chunks and before the usage chunk; a list when n > 1, with
choices that made no verify step left out. `sglext` drops its None members, and SGLang writes
compact JSON with `sglext` as the last key, so removing what the proxy asked for is a cut of
bytes: the `spec_tokens_details` member, or the whole `sglext` (the whole chunk in a stream)
when it was its only member. Nothing is re-encoded, so the client gets SGLang's own bytes.
"""

from __future__ import annotations

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
