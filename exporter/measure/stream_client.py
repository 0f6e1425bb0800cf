"""A streaming OpenAI-API client that measures what the published method measures.

Per request: TTFT (request sent -> first content token), decode rate = completion tokens /
seconds after the first token, completion tokens, finish reason, and the events without content
(finish, usage, details), where an engine's per-request figures ride (`Engine.stream_counts`).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import Any

import aiohttp


@dataclass(frozen=True, slots=True)
class Result:
    ttft: float | None
    decode_seconds: float
    completion_tokens: int
    finish_reason: str | None
    events: tuple[dict[str, Any], ...] = ()  # the events without content, in order
    sent: float = 0.0  # time.perf_counter() when sent: where the decode lies in a phase

    @property
    def decode_span(self) -> tuple[float, float] | None:
        """(first content token, last), on time.perf_counter()'s clock (None: no content)."""
        if self.ttft is None:
            return None
        first = self.sent + self.ttft
        return first, first + self.decode_seconds

    @property
    def decode_tokens_per_second(self) -> float | None:
        """Completion tokens / seconds after the first token (the published method)."""
        if self.decode_seconds <= 0:
            return None
        return self.completion_tokens / self.decode_seconds


class RequestFailed(Exception):
    """The server answered with an error status or broke the stream."""


async def stream_chat(
    session: aiohttp.ClientSession,
    url: str,
    body: dict[str, Any],
    headers: dict[str, str] | None = None,
) -> Result:
    """POST a streaming chat/completions request to `url` and measure it."""
    payload = {**body, "stream": True, "stream_options": {"include_usage": True}}
    sent = time.perf_counter()
    first: float | None = None
    last = sent
    usage_tokens: int | None = None
    finish: str | None = None
    events: list[dict[str, Any]] = []
    async with session.post(url, json=payload, headers=headers) as resp:
        if resp.status != 200:
            raise RequestFailed(f"HTTP {resp.status}: {(await resp.text())[:200]}")
        async for raw in resp.content:
            line = raw.strip()
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            content = False
            for choice in chunk.get("choices") or ():
                text = (choice.get("delta") or {}).get("content") or choice.get("text")
                if text:
                    last = time.perf_counter()
                    first = last if first is None else first
                    content = True
                finish = choice.get("finish_reason") or finish
            if not content:
                events.append(chunk)
            if chunk.get("usage") and not chunk.get("choices"):
                usage_tokens = chunk["usage"].get("completion_tokens")
    if usage_tokens is None:
        raise RequestFailed("the stream ended without a usage chunk")
    return Result(
        ttft=None if first is None else first - sent,
        decode_seconds=0.0 if first is None else last - first,
        completion_tokens=usage_tokens,
        finish_reason=finish,
        events=tuple(events),
        sent=sent,
    )
