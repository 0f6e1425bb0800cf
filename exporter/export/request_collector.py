"""The request-level view of each route (exact requests only): the per-request moments behind
a window's standard error, the distribution of per-request acceptance, the requests that
speculation made slower and the ones that look like repetition loops; and, for people reading
the sidecar directly, each window's standard error and request count."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from exporter.accounting.ledger import RUNAWAY_ACCEPTANCE, Accounting
from exporter.accounting.snapshot import Snapshot
from exporter.core.stats import MIN_EFFECTIVE_REQUESTS
from exporter.export.collector import ROUTE_LABELS, FamiliesCollector, with_exemplars

MOMENTS = (  # family, help, field of RequestMoments: the names are a contract
    (
        "specdec_route_spec_requests",
        "Requests whose per-request object was read and had at least one draft token (m).",
        "requests",
    ),
    (
        "specdec_route_request_draft_tokens_squared",
        "Sum over those requests of the square of their draft tokens (S_tt).",
        "draft_tokens_squared",
    ),
    (
        "specdec_route_request_accepted_tokens_squared",
        "Sum over those requests of the square of their accepted draft tokens (S_aa).",
        "accepted_squared",
    ),
    (
        "specdec_route_request_accepted_times_draft_tokens",
        "Sum over those requests of accepted times draft tokens (S_at).",
        "accepted_times_draft_tokens",
    ),
    (
        "specdec_route_request_draft_tokens_cubed",
        "Sum over those requests of the cube of their draft tokens (S_ttt): the small-sample "
        "factor of a window of unequal lengths.",
        "draft_tokens_cubed",
    ),
)


class RequestCollector(FamiliesCollector):
    def __init__(self, accounting: Accounting, clock: Callable[[], float]) -> None:
        self.accounting = accounting
        self.clock = clock

    def collect(self) -> Iterator[Metric]:
        acc = self.accounting.read(self.clock())
        for name, doc, attribute in MOMENTS:
            family = CounterMetricFamily(name, doc, labels=ROUTE_LABELS)
            for key, moments in sorted(acc.moments.items()):
                family.add_metric(list(key), getattr(moments, attribute))
            yield family
        slower = CounterMetricFamily(
            "specdec_route_requests_below_breakeven",
            "Requests whose own tokens per step / the model's step_cost_ratio < 1: speculation "
            "made them slower (models with a config only).",
            labels=ROUTE_LABELS,
        )
        # every route with exact requests gets both counters from 0, so the first one counts
        # in rate() and a share has its denominator's series to divide
        for key in sorted(acc.moments):
            slower.add_metric(list(key), float(acc.below_breakeven.get(key, 0)))
        runaway = CounterMetricFamily(
            "specdec_route_runaway_requests",
            f"Requests cut by max_tokens (finish_reason length) with acceptance >= "
            f"{RUNAWAY_ACCEPTANCE}: the signature of a repetition loop.",
            labels=ROUTE_LABELS,
        )
        for key in sorted(acc.moments):
            runaway.add_metric(list(key), float(acc.runaway.get(key, 0)))
        histogram = HistogramMetricFamily(
            "specdec_route_request_acceptance_ratio",
            "Per request: accepted / draft tokens (requests with at least one draft token).",
            labels=ROUTE_LABELS,
        )
        for key, observed in sorted(acc.acceptance.items()):
            histogram.add_metric(list(key), with_exemplars(observed), observed.sum)
        yield from (slower, runaway, histogram)
        yield from self._windows(acc)

    def _windows(self, acc: Snapshot) -> Iterator[Metric]:
        labels = [*ROUTE_LABELS, "window"]
        acceptance = GaugeMetricFamily(
            "specdec_route_exact_acceptance_ratio",
            "Accepted / draft tokens over the window of the route's requests with exact counts: "
            "the figure the interval surrounds.",
            labels=labels,
        )
        stderr = GaugeMetricFamily(
            "specdec_route_acceptance_stderr",
            "Cluster-robust standard error of the route's exact acceptance over the window "
            "(requests as the units, small-sample factor from S_tt and S_ttt); "
            f"absent below {MIN_EFFECTIVE_REQUESTS:g} effective requests.",
            labels=labels,
        )
        halfwidth = GaugeMetricFamily(
            "specdec_route_acceptance_ci_halfwidth",
            "Half-width of the 95 % interval of the route's exact acceptance over the window: "
            "Student's t(0.975, effective requests - 1) x the standard error.",
            labels=labels,
        )
        requests = GaugeMetricFamily(
            "specdec_route_window_spec_requests",
            "Requests with at least one draft token that ended in the window.",
            labels=labels,
        )
        for per_window in acc.windows:
            for key, moments in sorted(per_window.moments.items()):
                series = [*key, per_window.window.label]
                requests.add_metric(series, moments.requests)
                if moments.draft_tokens > 0:
                    acceptance.add_metric(series, moments.accepted / moments.draft_tokens)
                if (interval := moments.interval()) is not None:
                    stderr.add_metric(series, interval.stderr)
                    halfwidth.add_metric(series, interval.halfwidth)
        yield from (acceptance, stderr, halfwidth, requests)
