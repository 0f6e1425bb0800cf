"""The base of the sidecar's collectors: families built fresh on each scrape, and `describe()`
giving the families of the state now, so the registry refuses a family name registered twice
(without it a registry cannot see a collector's names); and the per-request histograms'
buckets with their exemplars."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import Exemplar, Metric
from prometheus_client.registry import Collector

from exporter.accounting.snapshot import Histogram

ROUTE_LABELS = ["route", "model_name"]  # every per-route family's labels, first


class FamiliesCollector(Collector):
    def collect(self) -> Iterator[Metric]:
        raise NotImplementedError

    def describe(self) -> Iterator[Metric]:
        return self.collect()


def with_exemplars(observed: Histogram) -> list[tuple[str, float] | tuple[str, float, Exemplar]]:
    """A per-request histogram's cumulative buckets, each with its request as an OpenMetrics
    exemplar where it has one: `trace_id` and `request_id` (the label names are a contract;
    40 + 10 + at most 64 runes, within the format's 128). Only the OpenMetrics format shows
    them."""
    buckets: list[tuple[str, float] | tuple[str, float, Exemplar]] = []
    examples = observed.examples
    for i, (bound, count) in enumerate(observed.cumulative()):
        example = examples[i] if examples else None
        if example is None:
            buckets.append((bound, count))
            continue
        labels = {"trace_id": example.trace_id}
        if example.request_id:
            labels["request_id"] = example.request_id
        at = example.at or None  # unknown: Prometheus stamps it with the scrape
        buckets.append((bound, count, Exemplar(labels, example.value, at)))
    return buckets
