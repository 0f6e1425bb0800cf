"""The sidecar says what it runs on: `specdec_runtime_info` names the event loop the proxy
runs on (uvloop, or asyncio's own: a proxy that costs several times the CPU) and its request
parser, so a slow install shows on the sidecar's own page. Run on both loops."""

from __future__ import annotations

import asyncio

from harness.pages import read
from harness.rig import sidecar, simulator


async def test_the_runtime_info_names_the_loop_it_runs_on() -> None:
    running = type(asyncio.get_running_loop()).__module__.split(".")[0]
    async with simulator() as (_, upstream), sidecar(upstream) as (_, _, metrics):
        page = await read(metrics)
    [(labels, value)] = [(k, v) for k, v in page.items() if k[0] == "specdec_runtime_info"]
    found = dict(labels[1])
    assert value == 1.0
    assert found["event_loop"] == ("uvloop" if running == "uvloop" else "asyncio"), found
    assert found["http_parser"] == "httptools" and found["http_parser_version"] != "unknown"
