"""The custom collector, read back through prometheus_client's own exposition and parser."""

from __future__ import annotations

import math

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from exporter.accounting.ledger import Accounting, RequestOutcome
from exporter.config import Target
from exporter.core.counts import Counts
from exporter.core.faults import Faults
from exporter.core.windows import Window, parse_window
from exporter.engines import DEFAULT
from exporter.export.guarded import Guarded
from exporter.export.route_collector import RouteCollector
from exporter.export.target_collector import ERROR_REASONS, TargetCollector
from exporter.scrape.target import TargetState

from .pages import MODEL, bump, one_engine, set_counts

WINDOWS = tuple(parse_window(w) for w in ("1m", "5m", "15m"))
NOW = 900.0  # the history covers every window (15m)

TRTLLM_PAGE = """\
# TYPE trtllm_spec_decode_num_draft_tokens_total counter
trtllm_spec_decode_num_draft_tokens_total{{model_name="llama",engine="0"}} {tokens}
# TYPE trtllm_spec_decode_num_accepted_tokens_total counter
trtllm_spec_decode_num_accepted_tokens_total{{model_name="llama",engine="0"}} {accepted}
trtllm_spec_decode_acceptance_length{{model_name="llama",engine="0"}} 2.5
"""


def state(name: str, engine: str = "vllm", windows: tuple[Window, ...] = WINDOWS) -> TargetState:
    return TargetState(Target(name=name, url=f"http://{name}:8000/metrics", kind=engine), windows)


def steady(i: int) -> str:
    return bump(one_engine(), 100 * i, 300 * i, 150 * i, (70 * i, 50 * i, 30 * i))


@pytest.fixture
def targets() -> list[TargetState]:
    gpu0 = state("gpu0")
    for i in range(13):  # t = 0 .. 900: the history covers every window
        page = steady(i)
        if i == 12:
            page += "vllm:spec_decode_num_drafts_total{engine=\n"  # one malformed line
        gpu0.ingest(page, 75.0 * i)
    gpu0.status, gpu0.last_duration = "up", 0.012
    gpu0.errors["timeout"] += 2

    trt = state("trt", engine="trtllm")
    for i in range(13):
        trt.ingest(TRTLLM_PAGE.format(tokens=1000 + 300 * i, accepted=400 + 150 * i), 75.0 * i)
    trt.status, trt.last_duration = "up", 0.003

    quiet = state("quiet")  # answers, but no drafts at all in any window
    for i in range(13):
        quiet.ingest(one_engine(), 75.0 * i)
    quiet.status, quiet.last_duration = "up", 0.004

    down = state("down")  # never answered
    down.status, down.last_duration = "down", 2.0
    down.errors["connection"] += 3

    fresh = state("fresh")  # not scraped yet
    return [gpu0, trt, quiet, down, fresh]


def scrape(targets: list[TargetState], now: float = NOW):
    registry = CollectorRegistry()
    registry.register(TargetCollector(targets, clock=lambda: now))
    text = generate_latest(registry).decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in families.values()
        for s in f.samples
    }
    return families, samples


def labels(**kw: str) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(kw.items()))


def series_of(samples, name: str, **match: str) -> dict[tuple, float]:
    return {
        k: v
        for k, v in samples.items()
        if k[0] == name and all(dict(k[1]).get(a) == b for a, b in match.items())
    }


def test_family_types(targets):
    families, _ = scrape(targets)
    counters = {
        "specdec_drafts",
        "specdec_draft_tokens",
        "specdec_accepted_tokens",
        "specdec_rejected_draft_tokens",
        "specdec_accepted_tokens_per_position",
        "specdec_engine_restarts",
        "specdec_scrape_errors",
        "specdec_malformed_lines",
        "specdec_engine_running_request_seconds",  # the batch integrated (b dt, b^2 dt)
        "specdec_engine_running_request_batch_seconds",
    }
    gauges = {
        "specdec_acceptance_ratio",
        "specdec_mean_acceptance_length",
        "specdec_position_acceptance_ratio",
        "specdec_target_up",
        "specdec_scrape_duration_seconds",
        "specdec_build_info",
        "specdec_engine_reported_acceptance_length",  # the TensorRT-LLM target's own gauge
        "specdec_engine_running_requests",  # vLLM's num_requests_running
    }
    assert {n for n, f in families.items() if f.type == "counter"} == counters
    assert {n for n, f in families.items() if f.type == "gauge"} == gauges


def test_the_engines_own_gauge_is_reported_as_it_is(targets):
    _, samples = scrape(targets)
    key = (
        "specdec_engine_reported_acceptance_length",
        labels(target="trt", model_name="llama", engine="0"),
    )
    assert samples[key] == 2.5
    assert not [k for k in samples if k[0].endswith("reported_acceptance_length") and k != key]


def test_counter_values_and_labels(targets):
    _, samples = scrape(targets)
    series = labels(target="gpu0", model_name=MODEL, engine="0")
    # lifetime at first sight (t=0) plus 12 steps
    assert samples[("specdec_drafts_total", series)] == 1.2e6 + 1200
    assert samples[("specdec_draft_tokens_total", series)] == 3.6e6 + 3600
    assert samples[("specdec_accepted_tokens_total", series)] == 2.04e6 + 1800
    assert samples[("specdec_rejected_draft_tokens_total", series)] == (3.6e6 + 3600) - (
        2.04e6 + 1800
    )
    assert samples[("specdec_engine_restarts_total", series)] == 0
    per_pos = series_of(samples, "specdec_accepted_tokens_per_position_total", target="gpu0")
    assert per_pos == {
        ("specdec_accepted_tokens_per_position_total", labels(**dict(series), position="0")): (
            900000.0 + 840
        ),
        ("specdec_accepted_tokens_per_position_total", labels(**dict(series), position="1")): (
            680000.0 + 600
        ),
        ("specdec_accepted_tokens_per_position_total", labels(**dict(series), position="2")): (
            460000.0 + 360
        ),
    }
    # counters carry exactly target, model_name, engine (+ position), never window
    for (name, lbls), _ in samples.items():
        if name in ("specdec_drafts_total", "specdec_accepted_tokens_total"):
            assert [k for k, _ in lbls] == ["engine", "model_name", "target"]


def test_window_gauges_per_engine_and_all(targets):
    _, samples = scrape(targets)
    for window in ("1m", "5m", "15m"):
        for engine in ("0", "all"):
            series = labels(target="gpu0", model_name=MODEL, engine=engine, window=window)
            assert samples[("specdec_acceptance_ratio", series)] == pytest.approx(0.5)
            assert samples[("specdec_mean_acceptance_length", series)] == pytest.approx(2.5)
            for position, value in zip("012", (0.7, 0.5, 0.3), strict=True):
                key = labels(**dict(series), position=position)
                assert samples[("specdec_position_acceptance_ratio", key)] == pytest.approx(value)
    assert all(math.isfinite(v) for v in samples.values())


def test_no_gauges_without_drafts_in_the_window(targets):
    _, samples = scrape(targets)
    for name in (
        "specdec_acceptance_ratio",
        "specdec_mean_acceptance_length",
        "specdec_position_acceptance_ratio",
    ):
        assert series_of(samples, name, target="quiet") == {}
        assert series_of(samples, name, target="down") == {}
    # but its counters are there
    assert samples[
        ("specdec_drafts_total", labels(target="quiet", model_name=MODEL, engine="0"))
    ] == (1.2e6)


def test_health_families(targets):
    _, samples = scrape(targets)
    assert samples[("specdec_target_up", labels(target="gpu0"))] == 1
    assert samples[("specdec_target_up", labels(target="down"))] == 0
    assert ("specdec_target_up", labels(target="fresh")) not in samples  # not scraped yet
    assert samples[("specdec_scrape_duration_seconds", labels(target="gpu0"))] == 0.012
    assert samples[("specdec_scrape_duration_seconds", labels(target="down"))] == 2.0
    assert ("specdec_scrape_duration_seconds", labels(target="fresh")) not in samples
    errors = series_of(samples, "specdec_scrape_errors_total")
    assert len(errors) == 5 * len(ERROR_REASONS)  # every reason of every target, from 0
    assert samples[("specdec_scrape_errors_total", labels(target="gpu0", reason="timeout"))] == 2
    assert samples[("specdec_scrape_errors_total", labels(target="down", reason="connection"))] == 3
    assert samples[("specdec_scrape_errors_total", labels(target="down", reason="timeout"))] == 0
    assert samples[("specdec_malformed_lines_total", labels(target="gpu0"))] == 1
    assert samples[("specdec_malformed_lines_total", labels(target="quiet"))] == 0
    [(_, build)] = series_of(samples, "specdec_build_info").items()
    assert build == 1


def test_a_removed_target_vanishes(targets):
    _, before = scrape(targets)
    assert any(("target", "gpu0") in k[1] for k in before)
    del targets[0]
    _, after = scrape(targets)
    assert not any(("target", "gpu0") in k[1] for k in after)
    assert any(("target", "trt") in k[1] for k in after)


def test_trtllm_target_exports_no_drafts_nor_tokens_per_step(targets):
    _, samples = scrape(targets)
    series = labels(target="trt", model_name="llama", engine="0")
    assert samples[("specdec_draft_tokens_total", series)] == 1000 + 3600
    assert samples[("specdec_accepted_tokens_total", series)] == 400 + 1800
    assert series_of(samples, "specdec_drafts_total", target="trt") == {}
    assert series_of(samples, "specdec_accepted_tokens_per_position_total", target="trt") == {}
    assert series_of(samples, "specdec_mean_acceptance_length", target="trt") == {}
    assert series_of(samples, "specdec_position_acceptance_ratio", target="trt") == {}
    for engine in ("0", "all"):
        key = labels(target="trt", model_name="llama", engine=engine, window="1m")
        assert samples[("specdec_acceptance_ratio", key)] == pytest.approx(0.5)


def test_restart_keeps_counters_monotonic_and_is_counted():
    target = state("gpu0", windows=(Window("10s", 10.0),))
    target.ingest(steady(10), 0.0)
    target.ingest(set_counts(one_engine(), 100, 300, 120, (60, 40, 20)), 10.0)  # restarted
    _, samples = scrape([target], now=10.0)
    series = labels(target="gpu0", model_name=MODEL, engine="0")
    assert samples[("specdec_engine_restarts_total", series)] == 1
    assert samples[("specdec_drafts_total", series)] == 1.2e6 + 1000 + 100
    # the window sees the restarted engine's work, not a negative delta
    window = labels(target="gpu0", model_name=MODEL, engine="0", window="10s")
    assert samples[("specdec_acceptance_ratio", window)] == pytest.approx(120 / 300)


def test_the_collector_reads_the_clock_on_every_scrape(targets):
    now = [NOW]
    registry = CollectorRegistry()
    registry.register(TargetCollector(targets, clock=lambda: now[0]))
    assert b'specdec_acceptance_ratio{engine="all"' in generate_latest(registry)
    now[0] = NOW + 15 * 60 + 1  # every window has passed without a snapshot
    assert b"specdec_acceptance_ratio{" not in generate_latest(registry)
    assert b"specdec_drafts_total{" in generate_latest(registry)  # counters stay


def test_the_registry_refuses_a_family_registered_twice(targets):
    """Every collector describes its families (Guarded passes them on), so a duplicated
    family name fails at registration, not as a page with two families of one name."""
    registry = CollectorRegistry()
    registry.register(Guarded(TargetCollector(targets, lambda: 0.0), Faults()))
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        registry.register(Guarded(TargetCollector(targets, lambda: 0.0), Faults()))


def test_coverage_compares_routes_and_engine_over_the_same_instants() -> None:
    """The routes' sums are sampled each accounting tick (1 s), the engine's at each scrape: a
    window whose start falls between two ticks, while the engine's steps ran, must not put the
    routes' whole work over part of the engine's (a coverage of 2 or 7 for traffic that all
    went through the proxy; the engine's work is taken at the ticks' instants)."""
    windows = (parse_window("2s"),)
    gpu = state("gpu0", windows=windows)
    acc = Accounting(("a",), windows, {})
    work = (100, 300, 150, (70, 50, 30))

    def page_at(t: float, share: float) -> None:
        gpu.ingest(
            bump(one_engine(), *(x * share for x in work[:3]), [x * share for x in work[3]]), t
        )

    def tick(t: float) -> None:
        acc.apportion(gpu.work_by_model())
        acc.tick(t)

    page_at(0.0, 0.0)
    tick(0.0)
    page_at(0.1, 0.0)
    page_at(0.2, 0.5)  # the engine's steps run...
    page_at(0.3, 1.0)
    acc.record(RequestOutcome("a", MODEL, "200", 250, exact=Counts(*work)))  # ...the request ends
    for t in (1.0, 2.0):
        page_at(t, 1.0)
        tick(t)
    registry = CollectorRegistry()
    registry.register(RouteCollector(acc, {}, gpu, DEFAULT, clock=lambda: 2.25))
    found = {
        (s.name, s.labels["window"]): s.value
        for f in text_string_to_metric_families(generate_latest(registry).decode())
        for s in f.samples
        if s.name == "specdec_attribution_coverage_ratio"
    }
    assert found == {("specdec_attribution_coverage_ratio", "2s"): 1.0}
