"""The base of the sidecar's collectors: families built fresh on each scrape, and `describe()`
giving the families of the state now, so the registry refuses a family name registered twice
(without it a registry cannot see a collector's names)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

ROUTE_LABELS = ["route", "model_name"]  # every per-route family's labels, first


class FamiliesCollector(Collector):
    def collect(self) -> Iterator[Metric]:
        raise NotImplementedError

    def describe(self) -> Iterator[Metric]:
        return self.collect()
