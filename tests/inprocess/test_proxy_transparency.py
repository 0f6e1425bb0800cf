"""The proxy changes no byte the client would have received from vLLM directly.

Two identical, seeded simulators with a frozen clock: one answers the client directly, the other
through the proxy (which may add stream options upstream and must remove what they add).
"""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from harness.rig import CODE, JA, sidecar, simulator
from harness.wire import fetch

CASES: list[tuple[str, str, dict[str, Any] | None]] = [
    ("POST", "/v1/chat/completions", {"messages": JA, "stream": True, "max_tokens": 30}),
    (
        "POST",
        "/v1/chat/completions",
        {
            "messages": CODE,
            "stream": True,
            "max_tokens": 30,
            "stream_options": {"include_usage": True},
        },
    ),
    (
        "POST",
        "/v1/chat/completions",
        {
            "messages": CODE,
            "stream": True,
            "max_tokens": 30,
            "stream_options": {"continuous_usage_stats": True},
        },
    ),
    ("POST", "/v1/chat/completions", {"messages": JA, "max_tokens": 30}),
    (
        "POST",
        "/v1/chat/completions",
        {
            "messages": JA,
            "stream": True,
            "max_tokens": 30,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        },
    ),
    (
        "POST",
        "/v1/completions",
        {
            "prompt": "def add(a, b):",
            "stream": True,
            "max_tokens": 25,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        },
    ),
    (
        "POST",
        "/v1/completions",
        {
            "prompt": "x = ",
            "stream": True,
            "max_tokens": 1,
            "stream_options": {"continuous_usage_stats": True},
        },
    ),
    ("POST", "/v1/completions", {"prompt": "def add(a, b):", "stream": True, "max_tokens": 25}),
    (
        "POST",
        "/v1/completions",
        {
            "prompt": "def add(a, b):",
            "stream": True,
            "max_tokens": 25,
            "stream_options": {"include_usage": True},
        },
    ),
    ("POST", "/v1/completions", {"prompt": "def add(a, b):", "max_tokens": 25}),
    ("POST", "/v1/chat/completions", {"messages": CODE, "stream": True, "max_tokens": 10, "n": 2}),
    ("POST", "/v1/chat/completions", {"model": "not-served", "messages": CODE}),
    ("GET", "/v1/models", None),
    ("GET", "/health", None),
    ("HEAD", "/v1/models", None),
]


@pytest.mark.parametrize("per_request", ["summary", "none"])
async def test_every_byte_is_what_vllm_sent(per_request: str) -> None:
    frozen = lambda: 1_800_000_000.0  # noqa: E731
    async with (
        simulator(per_request, clock=frozen) as (_, direct),
        simulator(per_request, clock=frozen) as (_, upstream),
        sidecar(upstream) as (side, proxy, _),
        aiohttp.ClientSession() as session,
    ):
        # twice over: the second round runs after the proxy learnt whether objects come back
        for round_ in range(2):
            for method, path, body in CASES:
                want = await fetch(session, direct, method, path, body)
                got = await fetch(session, proxy, method, path, body)
                assert got == want, (round_, path, body)
        assert side.proxy is not None
        assert side.proxy.objects_missing == (per_request == "none")
        # and the proxy did see what it needed: every completion is accounted to a route
        assert sum(side.proxy.accounting.requests.values()) == 2 * sum(
            1 for _, p, _ in CASES if p.endswith("completions")
        )
