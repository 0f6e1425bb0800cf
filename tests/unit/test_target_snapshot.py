"""A read of a target is one immutable snapshot, as a read of the accounting is: later pages
leave it as it was, nobody can change it, each collector reads each target once per scrape, and
its windows mean what `specdec derive` says of the same two pages (`scrape.figures`, one home)."""

from __future__ import annotations

import dataclasses

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from exporter.accounting.ledger import Accounting
from exporter.config import Target
from exporter.core.windows import parse_window
from exporter.engines import DEFAULT
from exporter.export.route_collector import RouteCollector
from exporter.export.target_collector import TargetCollector
from exporter.scrape.derive import delta, report
from exporter.scrape.families import families
from exporter.scrape.figures import ALL_RANKS
from exporter.scrape.snapshot import TargetSnapshot
from exporter.scrape.target import TargetState

from .pages import MODEL, bump, four_engines

WINDOW = parse_window("1m")


def running(text: str, batch: int) -> str:
    return text + "".join(
        f'vllm:num_requests_running{{engine="{rank}",model_name="{MODEL}"}} {batch + rank}\n'
        for rank in range(4)
    )


def page(i: int) -> str:
    return running(bump(four_engines(), 100 * i, 400 * i, 150 * i, (70 * i, 50 * i, 30 * i)), 2)


def gpu() -> TargetState:
    state = TargetState(Target("gpu0", "http://gpu0:8000/metrics"), (WINDOW,))
    state.ingest(page(0), 0.0)
    state.ingest(page(1), 60.0)
    state.status, state.last_duration = "up", 0.01
    return state


def test_a_snapshot_stays_as_read_while_the_target_moves_on() -> None:
    state = gpu()
    first = state.read(60.0)
    assert first.up is True and first.name == "gpu0" and len(first.series) == 4
    (window,) = first.windows
    assert window.covered == 60.0 and window.running[MODEL] > 0
    before = repr(first)
    state.ingest(running(page(5), 9), 90.0)
    state.errors["timeout"] += 1
    state.status = "down"
    assert repr(first) == before  # the target moved; the snapshot did not
    later = state.read(90.0)
    assert later.up is False and later.errors["timeout"] == 1
    assert later.windows[0].work.total.counts != window.work.total.counts


def test_nobody_can_change_a_snapshot() -> None:
    snapshot = gpu().read(60.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        snapshot.bad_lines = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        snapshot.errors["timeout"] = 1  # type: ignore[index]
    with pytest.raises(TypeError):
        snapshot.gauges[(MODEL, "0")]["running"] = 1.0  # type: ignore[index]
    with pytest.raises(TypeError):
        snapshot.windows[0].running[MODEL] = 1.0  # type: ignore[index]


def test_each_collector_reads_each_target_once_a_scrape(monkeypatch: pytest.MonkeyPatch) -> None:
    state = gpu()
    reads: list[TargetSnapshot] = []
    real = state.read

    def counted(*args: object, **kwargs: object) -> TargetSnapshot:
        reads.append(real(*args, **kwargs))  # type: ignore[arg-type]
        return reads[-1]

    monkeypatch.setattr(state, "read", counted)
    acc = Accounting(("a",), (WINDOW,), {})
    registry = CollectorRegistry()
    registry.register(TargetCollector((state,), lambda: 60.0))
    registry.register(RouteCollector(acc, {}, state, DEFAULT, lambda: 60.0))
    reads.clear()  # registering asks for a description
    page_text = generate_latest(registry).decode()
    assert len(reads) == 2  # one per collector
    assert 'specdec_target_up{target="gpu0"} 1.0' in page_text


def test_the_live_window_and_the_offline_delta_read_a_span_alike() -> None:
    """The sidecar's window over two pages and `specdec derive` of the same two pages: the
    same figures per series, and the model's sum over its ranks is derive's total."""
    (window,) = gpu().read(60.0).windows
    offline = report(delta(page(0), page(1), families("vllm")).series)
    live = {(f.model_name, f.rank): f for f in window.work.series}
    assert len(offline["series"]) == len(live) == 4
    for row in offline["series"]:
        figures = live[(row["model_name"], row["engine"])]
        assert row["acceptance_rate"] == figures.acceptance
        assert row["mean_acceptance_length"] == figures.mean_acceptance_length
        assert row["per_position"] == list(figures.per_position or ())
    (summed,) = window.work.by_model
    assert summed.rank == ALL_RANKS
    assert offline["total"]["acceptance_rate"] == summed.acceptance
    assert offline["total"]["per_position"] == list(summed.per_position or ())
