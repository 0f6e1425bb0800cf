"""A read of the accounting is one immutable snapshot: later requests and ticks leave it as it
was, nobody can change it, and the collectors format what it holds (each reads the ledger
once per scrape)."""

from __future__ import annotations

import dataclasses

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from exporter.accounting.ledger import Accounting, RequestOutcome
from exporter.accounting.snapshot import Snapshot
from exporter.config import ModelConfig
from exporter.core.counts import Counts
from exporter.core.windows import Window, parse_window
from exporter.engines import DEFAULT
from exporter.export.request_collector import RequestCollector
from exporter.export.route_collector import RouteCollector

M = "m"
WINDOW = parse_window("1m")
ONE = Counts(10, 30, 12, (6, 4, 2))


def no_batch(_: Window) -> dict[str, float]:
    return {}


def ledger() -> Accounting:
    return Accounting(("a", "b"), (WINDOW,), {M: ModelConfig(M, 3, 1.5)})


def exact(route: str) -> RequestOutcome:
    return RequestOutcome(route, M, "200", 22, ttft=0.1, decode_seconds=0.5, exact=ONE,
                          increments=(1, 4, 4, 4, 4, 4))  # fmt: skip


def test_a_snapshot_stays_as_read_while_the_ledger_moves_on() -> None:
    acc = ledger()
    acc.tick(0.0)
    acc.record(exact("a"))
    acc.tick(30.0)
    acc.record(exact("a"))
    acc.tick(60.0)
    first = acc.read(60.0, no_batch)
    assert first.exact[("a", M)] == ONE + ONE
    assert first.requests[("a", M, "200", "other")] == 2
    (window,) = first.windows
    assert window.window == WINDOW and window.routes[("a", M)].counts == ONE + ONE
    assert window.moments[("a", M)].requests == 2
    assert first.ttft[("a", M)].cumulative()[-1] == ("+Inf", 2.0)
    before = repr(first)

    for _ in range(3):
        acc.record(exact("a"))
        acc.record(exact("b"))
    acc.tick(90.0)
    assert repr(first) == before  # the ledger moved; the snapshot did not
    later = acc.read(90.0, no_batch)
    assert later.exact[("a", M)] == ONE + ONE + ONE + ONE + ONE
    assert ("b", M) in later.windows[0].routes and ("b", M) not in first.windows[0].routes
    # a reader that gives no batch formats no route window: it gets none, the rest the same
    plain = acc.read(90.0)
    assert not plain.windows[0].routes and plain.windows[0].moments == later.windows[0].moments
    assert plain.exact == later.exact


def test_nobody_can_change_a_snapshot() -> None:
    acc = ledger()
    acc.record(exact("a"))
    snapshot = acc.read(0.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        snapshot.exact = {}  # type: ignore[misc]
    with pytest.raises(TypeError):
        snapshot.exact[("a", M)] = Counts()  # type: ignore[index]
    with pytest.raises(TypeError):
        snapshot.requests[("a", M, "200", "other")] += 1  # type: ignore[index]


def test_the_collectors_read_the_ledger_once_a_scrape_each(monkeypatch: pytest.MonkeyPatch) -> None:
    acc = ledger()
    acc.tick(0.0)
    acc.record(exact("a"))
    acc.tick(60.0)
    reads: list[Snapshot] = []
    real = acc.read

    def counted(*args: object, **kwargs: object) -> Snapshot:
        reads.append(real(*args, **kwargs))  # type: ignore[arg-type]
        return reads[-1]

    monkeypatch.setattr(acc, "read", counted)
    registry = CollectorRegistry()
    registry.register(RouteCollector(acc, {}, None, DEFAULT, lambda: 60.0))
    registry.register(RequestCollector(acc, lambda: 60.0))
    reads.clear()  # registering asks for a description
    page = generate_latest(registry).decode()
    assert len(reads) == 2  # one per collector
    assert (
        'specdec_route_accepted_tokens_total{model_name="m",route="a",source="exact"} 12.0' in page
    )
    assert 'specdec_route_window_spec_requests{model_name="m",route="a",window="1m"} 1.0' in page
