"""Through the proxy to the simulator: whatever shape a request's sampling and output fields
take, it is relayed and accounted, it lands in a band of every dimension, and no label value is
ever the client's."""

from __future__ import annotations

import aiohttp

from exporter.core.slices import BANDS
from harness.helpers import eventually
from harness.pages import samples
from harness.rig import JA, sidecar, simulator

CASES = [  # (extra body fields, its temperature band, its output band)
    ({}, "unset", "text"),
    ({"temperature": 0}, "greedy", "text"),
    ({"temperature": 1e300}, "high", "text"),
    ({"temperature": 0.3, "response_format": ["json_object"]}, "low", "text"),
    ({"response_format": {"type": 5}}, "unset", "text"),
    ({"response_format": "json_object"}, "unset", "text"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x'); DROP"}}},
     "unset", "structured"),
    ({"guided_json": None, "structured_outputs": {"regex": "[a-z]+"}}, "unset", "structured"),
    ({"tools": "all of them"}, "unset", "text"),
    ({"tools": [{"type": "function", "function": {"name": "f"}}], "temperature": 0.9},
     "mid", "tools"),
]  # fmt: skip


async def test_any_request_shape_lands_in_known_bands() -> None:
    async with simulator() as (_, upstream), sidecar(upstream) as (_, proxy, metrics):
        async with aiohttp.ClientSession() as session:
            for extra, *_ in CASES:
                body = {"model": "sim-27b", "messages": JA, "max_tokens": 16, **extra}
                async with session.post(
                    f"{proxy}/v1/chat/completions", json=body, headers={"X-Route": "voice"}
                ) as resp:
                    assert resp.status == 200, (extra, await resp.text())
                    assert (await resp.json())["choices"]

            async def accounted() -> dict[tuple[str, str], float] | None:
                async with session.get(metrics) as resp:
                    page = samples(await resp.text())
                found = {
                    (dict(ls)["dimension"], dict(ls)["band"]): v
                    for (name, ls), v in page.items()
                    if name == "specdec_route_slice_requests_total"
                }
                done = sum(v for (d, _), v in found.items() if d == "output")
                return found if done == len(CASES) else None

            found = await eventually(accounted, 10.0)
    for dimension, band in found:
        assert band in BANDS[dimension], (dimension, band)
    for dimension, index in (("temperature", 1), ("output", 2)):
        want: dict[str, float] = {}
        for case in CASES:
            want[case[index]] = want.get(case[index], 0) + 1
        got = {b: v for (d, b), v in found.items() if d == dimension}
        assert got == want, (dimension, got, want)
