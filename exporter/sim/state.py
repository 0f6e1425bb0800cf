"""The simulator's state behind every handler, and vLLM's JSON response shapes."""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from exporter.sim.decoder import SimEngine
from exporter.sim.dialects import dumps
from exporter.sim.wire import error

FAULTS = ("slow_metrics", "http_500", "malformed_metrics", "spec_off", "drop_connection_mid_stream")


@dataclass
class SimState:
    engine: SimEngine
    per_request: str = "summary"
    kind: str = "vllm"  # whose wire shapes and metrics page: an engine kind
    faults: dict[str, float] = field(default_factory=dict)  # name -> value (seconds, chunks)
    ids: itertools.count[int] = field(default_factory=itertools.count)
    clock: Callable[[], float] = time.time  # `created` stamps; tests fix it for byte equality
    # the last completion requests' ids and the `traceparent` each came with (/admin/received)
    received: deque[tuple[str, str | None]] = field(default_factory=lambda: deque(maxlen=4096))


SIM: web.AppKey[SimState] = web.AppKey("sim", SimState)


def state_of(request: web.Request) -> SimState:
    return request.app[SIM]


def json_error(status: int, message: str, kind: str, param: str | None = None) -> web.Response:
    return json_body(error(status, message, kind, param), status)


def json_body(data: Any, status: int = 200) -> web.Response:
    """Compact JSON as vLLM (FastAPI) sends it: `application/json`, no charset parameter."""
    body = dumps(data)
    return web.Response(body=body, status=status, headers={"Content-Type": "application/json"})
