"""The sidecar takes its proxy's address before it serves /metrics and accepts on it last:
where another process holds the proxy's address (taken after `serve` checked it), the start
fails with /metrics never up, so a readiness check never sees the sidecar come up and go; where
/metrics cannot bind, the proxy never accepted a client, and its address is free again after."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from exporter.config import Config, ProxyConfig, Route, Target
from exporter.sidecar import Sidecar
from harness.helpers import free_port

NOWHERE = "http://127.0.0.1:1"  # nothing listens: the start never needs an upstream


@contextmanager
def held() -> Iterator[int]:
    """A port another process would hold: bound and listening."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield holder.getsockname()[1]


def refused(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) != 0


def config(metrics_port: int, proxy_port: int) -> Config:
    return Config(
        listen=("127.0.0.1", metrics_port),
        targets=(Target("sim", f"{NOWHERE}/metrics"),),
        proxy=ProxyConfig(NOWHERE, ("127.0.0.1", proxy_port), "sim", (Route("agent"),)),
    )


@pytest.mark.parametrize("taken", ["proxy", "metrics"])
async def test_a_taken_address_fails_the_start_with_the_other_never_answering(taken: str) -> None:
    free = free_port()
    with held() as busy:
        metrics_port, proxy_port = (free, busy) if taken == "proxy" else (busy, free)
        side = Sidecar(config(metrics_port, proxy_port))
        try:
            with pytest.raises(OSError):
                await side.start()
            assert refused(free), f"the {taken} address was taken, yet the other one answered"
        finally:
            await side.stop()
    with socket.socket() as again:  # stop() let a bound address go
        again.bind(("127.0.0.1", free))
