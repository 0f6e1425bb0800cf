"""A collector whose exception costs its own families for one scrape, never the whole page:
Prometheus keeps the rest of the sidecar's series, and the error is counted. Its families are
checked to render, too (every text valid UTF-8): a value that would fail only when the page is
encoded would otherwise cost every family on it."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from exporter.core.faults import Faults
from exporter.export.collector import FamiliesCollector


class Guarded(FamiliesCollector):
    """`inner`, guarded; it describes its families the same way (a failure costs the names)."""

    def __init__(self, inner: Collector, faults: Faults) -> None:
        self.inner = inner
        self.faults = faults

    def collect(self) -> Iterator[Metric]:
        try:
            families = list(self.inner.collect())  # whole, or not at all
            for family in families:
                _renders(family)
        except Exception as exc:
            self.faults.record("collector", exc)
            return iter(())
        return iter(families)


def _renders(family: Metric) -> None:
    """UnicodeEncodeError for a text the page could not encode (a lone surrogate)."""
    family.documentation.encode()
    for sample in family.samples:
        for value in sample.labels.values():
            if not value.isascii():
                value.encode()
