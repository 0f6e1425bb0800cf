"""The proxy's tests run on both event loops: `specdec serve` uses uvloop when it is installed,
and uvloop's transports differ from asyncio's (they are not even asyncio.Transport subclasses)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

import pytest

BOTH_LOOPS = {
    "test_proxy_transparency.py",
    "test_proxy_safety.py",
    "test_upstream.py",
    "test_downstream.py",
    "test_hostile_clients.py",
    "test_hostile_upstream.py",
    "test_connection_burst.py",
    "test_connection_slots.py",
    "test_runtime_info.py",
    "test_lingering_close.py",
}


def pytest_asyncio_loop_factories(
    config: pytest.Config, item: pytest.Item
) -> Mapping[str, Callable[[], asyncio.AbstractEventLoop]]:
    factories: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
        "asyncio": asyncio.new_event_loop
    }
    if item.path.name in BOTH_LOOPS:
        try:
            import uvloop
        except ImportError:
            return factories
        factories["uvloop"] = uvloop.new_event_loop
    return factories
