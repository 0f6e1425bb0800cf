"""Exemplars on the per-request histograms: one request per bucket, the worst (the lowest
acceptance or decode rate, the longest TTFT) and then the slowest of the last minute, an older
one giving way to any; the label names and their size as OpenMetrics requires; the text format
unchanged; the engine's id made safe."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from exporter.accounting.ledger import EXEMPLAR_FRESH, Accounting, RequestOutcome
from exporter.config import ModelConfig
from exporter.core.counts import Counts
from exporter.core.windows import DEFAULT_WINDOWS
from exporter.engines import DEFAULT
from exporter.export.request_collector import RequestCollector
from exporter.export.route_collector import RouteCollector
from exporter.proxy.outcome import REQUEST_ID_CHARS, request_id

M = "m"


def outcome(accepted: int, trace: str, at: float, seconds: float = 1.0) -> RequestOutcome:
    exact = Counts(10, 30, accepted, (accepted, 0, 0))
    return RequestOutcome(
        "a", M, "200", 40, exact=exact, trace_id=trace, request_id=f"cmpl-{trace[:4]}", at=at,
        seconds=seconds,
    )  # fmt: skip


def exemplars(
    acc: Accounting, name: str = "specdec_route_request_acceptance_ratio"
) -> dict[str, tuple[dict[str, str], float]]:
    """le -> (exemplar labels, value) of histogram `name` as Prometheus would parse the
    OpenMetrics page."""
    registry = CollectorRegistry()
    registry.register(RequestCollector(acc, lambda: 60.0))
    registry.register(RouteCollector(acc, {}, None, DEFAULT, lambda: 60.0))
    page = openmetrics(registry).decode()
    out = {}
    for family in text_string_to_metric_families(page):
        if family.name == name:
            for sample in family.samples:
                if sample.exemplar is not None:
                    out[sample.labels["le"]] = (sample.exemplar.labels, sample.exemplar.value)
    return out


def accounting() -> Accounting:
    return Accounting(("a", "other"), DEFAULT_WINDOWS, {M: ModelConfig(M, 3, 1.78)})


def test_each_bucket_keeps_its_lowest_then_its_slowest_request() -> None:
    acc = accounting()
    acc.record(outcome(1, "1" * 32, 100.0))  # 1/30: bucket 0.05
    acc.record(outcome(2, "2" * 32, 101.0))  # 2/30 = 0.067: 0.1, alone
    acc.record(outcome(1, "3" * 32, 102.0, seconds=5.0))  # as low, slower: it stands for 0.05
    acc.record(outcome(1, "4" * 32, 103.0, seconds=2.0))  # as low, faster: not
    acc.record(outcome(24, "5" * 32, 104.0))  # 0.8
    found = exemplars(acc)
    assert found["0.05"][0] == {"trace_id": "3" * 32, "request_id": "cmpl-3333"}
    assert abs(found["0.05"][1] - 1 / 30) < 1e-9
    assert found["0.1"][0]["trace_id"] == "2" * 32
    assert found["0.8"][0]["trace_id"] == "5" * 32
    assert set(found) == {"0.05", "0.1", "0.8"}  # empty buckets carry none
    # a minute on, a request that is neither lower nor slower takes the bucket: recent
    acc.record(outcome(1, "6" * 32, 102.0 + EXEMPLAR_FRESH + 1, seconds=0.1))
    assert exemplars(acc)["0.05"][0]["trace_id"] == "6" * 32


def streamed(trace: str, ttft: float, rate: float, at: float) -> RequestOutcome:
    """A streamed request: its first content token after `ttft` s, then 40 tokens at `rate`."""
    return RequestOutcome(
        "a", M, "200", 41, ttft=ttft, decode_seconds=40 / rate, trace_id=trace, at=at,
        seconds=ttft + 40 / rate, increments=(1,) * 41,
    )  # fmt: skip


def test_ttft_keeps_its_longest_and_the_decode_rate_its_slowest_request() -> None:
    acc = accounting()
    acc.record(streamed("1" * 32, 0.12, 45.0, 100.0))  # TTFT bucket 0.15, rate bucket 50
    acc.record(streamed("2" * 32, 0.14, 42.0, 101.0))  # longer and slower: stands for both
    acc.record(streamed("3" * 32, 0.11, 48.0, 102.0))  # shorter and faster: for neither
    acc.record(streamed("4" * 32, 0.5, 8.0, 103.0))  # 0.5 and 10: alone
    ttft = exemplars(acc, "specdec_route_ttft_seconds")
    assert {le: (e["trace_id"][0], v) for le, (e, v) in ttft.items()} == {
        "0.15": ("2", 0.14), "0.5": ("4", 0.5),
    }  # fmt: skip
    rate = exemplars(acc, "specdec_route_decode_tokens_per_second")
    assert {le: (e["trace_id"][0], v) for le, (e, v) in rate.items()} == {
        "50.0": ("2", 42.0), "10.0": ("4", 8.0),
    }  # fmt: skip
    acc.record(streamed("5" * 32, 0.11, 48.0, 101.0 + EXEMPLAR_FRESH + 1))  # recent: takes both
    assert exemplars(acc, "specdec_route_ttft_seconds")["0.15"][0]["trace_id"] == "5" * 32
    assert (
        exemplars(acc, "specdec_route_decode_tokens_per_second")["50.0"][0]["trace_id"] == "5" * 32
    )


def test_untraced_requests_give_none_and_the_text_format_is_unchanged() -> None:
    acc = accounting()
    acc.record(outcome(1, "", 100.0))
    assert exemplars(acc) == {}
    acc.record(outcome(1, "a" * 32, 100.0))
    registry = CollectorRegistry()
    registry.register(RequestCollector(acc, lambda: 60.0))
    text = generate_latest(registry).decode()
    assert "trace_id" not in text and " # {" not in text
    assert (
        'specdec_route_request_acceptance_ratio_bucket{le="0.05",model_name="m",route="a"} 2.0'
        in text
    )


def test_the_request_id_is_made_safe_and_the_labels_fit_128_runes() -> None:
    assert request_id("chatcmpl-0a1B_2.c:3") == "chatcmpl-0a1B_2.c:3"
    assert request_id('cmpl-1"} 9 # {x="y\n\u2028é') == "cmpl-19xy"
    assert request_id(12) == request_id(None) == ""
    hostile = request_id("x" * 10_000_000)
    assert len(hostile) == REQUEST_ID_CHARS
    labels = {"trace_id": "f" * 32, "request_id": hostile}
    assert sum(len(k) + len(v) for k, v in labels.items()) <= 128
