"""Through the proxy, an SGLang client gets the bytes SGLang would have sent it, whether or not
it asked for `return_spec_tokens_details` or usage itself; and every completion is accounted.

Two identical, seeded simulators speaking SGLang with a frozen clock: one answers directly, the
other through the proxy, which adds the flag (and include_usage) and removes what they add.
"""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from harness.rig import CODE, JA, sidecar, simulator
from harness.wire import fetch

FLAG = "return_spec_tokens_details"
USAGE = {"stream_options": {"include_usage": True}}
BASE: list[tuple[str, dict[str, Any]]] = [
    ("/v1/chat/completions", {"messages": JA, "stream": True, "max_tokens": 30}),
    ("/v1/chat/completions", {"messages": CODE, "stream": True, "max_tokens": 30} | USAGE),
    ("/v1/chat/completions", {"messages": JA, "max_tokens": 30}),
    ("/v1/chat/completions", {"messages": CODE, "stream": True, "max_tokens": 12, "n": 2}),
    ("/v1/chat/completions", {"messages": CODE, "max_tokens": 12, "n": 2}),
    ("/v1/chat/completions", {"messages": JA, "stream": True, "max_tokens": 1}),  # no verify step
    ("/v1/completions", {"prompt": "def add(a, b):", "stream": True, "max_tokens": 25}),
    ("/v1/completions", {"prompt": "def add(a, b):", "stream": True, "max_tokens": 25} | USAGE),
    ("/v1/completions", {"prompt": "def add(a, b):", "max_tokens": 25}),
]
# each case as the client sends it: without the flag, with it, with it set false
CASES = [
    (path, body if flag is None else body | {FLAG: flag})
    for path, body in BASE
    for flag in (None, True, False)
]


@pytest.mark.parametrize("round_", [0, 1])
async def test_every_byte_is_what_sglang_sent(round_: int) -> None:
    frozen = lambda: 1_800_000_000.0  # noqa: E731
    async with (
        simulator(clock=frozen, kind="sglang", seed=round_) as (_, direct),
        simulator(clock=frozen, kind="sglang", seed=round_) as (_, upstream),
        sidecar(upstream, kind="sglang") as (side, proxy, _),
        aiohttp.ClientSession() as session,
    ):
        for path, body in CASES:
            want = await fetch(session, direct, "POST", path, body)
            got = await fetch(session, proxy, "POST", path, body)
            assert got == want, (path, body)
        assert side.proxy is not None
        accounting = side.proxy.accounting
        assert sum(accounting.requests.values()) == len(CASES)
        # exact for all but the max_tokens=1 requests (SGLang sends no details: no verify step)
        without = sum(accounting.without_exact.values())
        assert without == 3, accounting.without_exact
