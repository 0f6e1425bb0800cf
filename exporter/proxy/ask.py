"""What the proxy asks the engine for, beyond what the client asked, and what the way back must
then remove so the client gets the engine's own bytes. Each engine states what it wants
(`ProxyHooks.request_flag`, `asks_stream_usage`, `asks_event_usage`); today:

- vLLM (and TensorRT-LLM): a stream's usage event (`include_usage`), where the per-request
  object rides; per-event usage (`continuous_usage_stats`) for token increments while vLLM sends
  no object, n == 1 only.
- SGLang: `return_spec_tokens_details`, its per-request details (its usage fields are left as
  the client asked: they are not needed).
- llama.cpp: nothing (a stream that asks for usage gets its `timings` moved to the usage
  chunk, which would then have to go).

The body is the client's object plus a member spliced in before its closing brace, not
re-encoded: re-encoding a long agent prompt would cost more than the rest of the hop.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from exporter.engines.base import ProxyHooks

_USAGE = {  # spliced into a stream request that set no stream_options
    continuous: json.dumps(
        {"stream_options": {"include_usage": True, "continuous_usage_stats": continuous}}
    ).encode()[1:]
    for continuous in (False, True)
}


@dataclass(frozen=True, slots=True)
class Asked:
    """The body to send and what the way back removes."""

    body: bytes
    strip: tuple[bool, bool] | None  # a stream: (the usage event, the per-event usage fields)
    strip_spec: bool  # SGLang's details


def ask(parsed: dict[str, Any], body: bytes, engine: ProxyHooks, objects_missing: bool) -> Asked:
    """`body` (the completion request `parsed`) as sent to an `engine` upstream."""
    flag = engine.request_flag
    strip_spec = flag is not None and parsed.get(flag) is not True
    if flag is not None and strip_spec:
        body = with_key(body, parsed, flag, True)
    if parsed.get("stream") is not True:
        return Asked(body, None, strip_spec)
    if not engine.asks_stream_usage:
        return Asked(body, (False, False), strip_spec)
    body, strip = _usage(parsed, body, objects_missing and engine.asks_event_usage)
    return Asked(body, strip, strip_spec)


def _usage(
    parsed: dict[str, Any], body: bytes, estimating: bool
) -> tuple[bytes, tuple[bool, bool]]:
    options = parsed.get("stream_options")
    options = dict(options) if isinstance(options, dict) else {}
    usage, continuous = (
        bool(options.get("include_usage")),
        bool(options.get("continuous_usage_stats")),
    )
    # token increments for estimates when vLLM sends no per-request object (n == 1 only)
    want_continuous = continuous or (estimating and (parsed.get("n") or 1) == 1)
    # vLLM sends per-chunk usage only with both options: what the client did not get
    # directly, it must not get through the proxy
    strip = (not usage, want_continuous and not (usage and continuous))
    if "stream_options" not in parsed:  # the common case: the member is ready-made
        body = _splice(body, parsed, _USAGE[want_continuous])
    elif not usage or want_continuous != continuous:
        options |= {"include_usage": True, "continuous_usage_stats": want_continuous}
        body = with_key(body, parsed, "stream_options", options)
    return body, strip


def with_key(body: bytes, parsed: dict[str, Any], key: str, value: Any) -> bytes:
    """`body` (the JSON object `parsed`) with `key` set to `value`."""
    if key in parsed:
        return json.dumps({**parsed, key: value}).encode()
    return _splice(body, parsed, json.dumps({key: value}).encode()[1:])  # '"key": {...}}'


def _splice(body: bytes, parsed: dict[str, Any], member: bytes) -> bytes:
    """A new member ('"key": value}') before the closing brace of `body`, a JSON object
    (`parsed`) and so ending in "}"."""
    return body.rstrip()[:-1] + (b"," if parsed else b"") + member
