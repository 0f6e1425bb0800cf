"""The sidecar's own life: what it runs on, the config reloads (Prometheus' names for them)
and the internal errors that cost a figure but no byte (`core/faults.py`)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from exporter.core.faults import Faults
from exporter.export.collector import FamiliesCollector
from exporter.process import Runtime


@dataclass(slots=True)
class ReloadStatus:
    """How the last config reload went (the start counts as one that succeeded)."""

    successful: bool = True
    success_at: float = field(default_factory=time.time)

    def succeeded(self) -> None:
        self.successful, self.success_at = True, time.time()

    def failed(self) -> None:
        self.successful = False


class LifecycleCollector(FamiliesCollector):
    def __init__(self, reloads: ReloadStatus, faults: Faults, runtime: Runtime) -> None:
        self.reloads = reloads
        self.faults = faults
        self.runtime = runtime

    def collect(self) -> Iterator[Metric]:
        runtime = self.runtime
        info = GaugeMetricFamily(
            "specdec_runtime_info",
            "What the sidecar runs on: the event loop (uvloop, or asyncio's own: a proxy that "
            "costs several times the CPU), the proxy's HTTP request parser, Python.",
            labels=["event_loop", "event_loop_version", "http_parser", "http_parser_version",
                    "python"],
        )  # fmt: skip
        info.add_metric(
            [runtime.event_loop, runtime.event_loop_version, runtime.http_parser,
             runtime.http_parser_version, runtime.python],
            1.0,
        )  # fmt: skip
        yield info
        yield GaugeMetricFamily(
            "specdec_config_last_reload_successful",
            "Whether the last config reload (SIGHUP) succeeded: 1, or 0 while a bad file is "
            "kept out and the previous config runs.",
            value=1.0 if self.reloads.successful else 0.0,
        )
        yield GaugeMetricFamily(
            "specdec_config_last_reload_success_timestamp_seconds",
            "When the running config was loaded: the start or the last successful reload.",
            value=self.reloads.success_at,
        )
        errors = CounterMetricFamily(
            "specdec_proxy_internal_errors",
            "Exceptions beside the byte path, by stage (routing, tap, accounting, collector): "
            "each cost a figure; the bytes were relayed unchanged.",
            labels=["stage"],
        )
        for stage, n in sorted(self.faults.counts.items()):
            errors.add_metric([stage], float(n))
        yield errors
