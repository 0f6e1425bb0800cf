"""Per-route families (the proxy's accounting) and the payoff figures, built on each scrape."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import NamedTuple

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from exporter.accounting.ledger import Accounting
from exporter.accounting.snapshot import RouteKey, Snapshot
from exporter.config import ModelConfig
from exporter.core.counts import total
from exporter.core.payoff import Decode, Drift, Load, curve_drift
from exporter.core.reading import RouteReading, RouteWindow, read_route
from exporter.core.slices import SliceCounts, change_parts
from exporter.core.windows import Window
from exporter.engines.base import Role, ScrapeHooks
from exporter.export.collector import ROUTE_LABELS, FamiliesCollector, with_exemplars
from exporter.scrape.snapshot import TargetSnapshot
from exporter.scrape.target import TargetState

# the shortest window the curve's drift is read over, where one is configured (seconds)
DRIFT_WINDOW = 300.0


class RouteCollector(FamiliesCollector):
    """The routes' figures from the proxy's accounting; the fronted target (the engine the
    routes share), read once per scrape, gives the batch their payoff is computed at and the
    coverage's whole; the proxied engine says whether a route's per-position counts are its
    own."""

    def __init__(
        self,
        accounting: Accounting,
        models: dict[str, ModelConfig],
        target: TargetState | None,
        engine: ScrapeHooks,
        clock: Callable[[], float],
    ) -> None:
        self.accounting = accounting
        self.models = models
        self.target = target
        self.clock = clock
        # whether the routes' per-position counts are their requests' own (vLLM, SGLang), or
        # the engine's apportioned (llama.cpp): then each route's profile is modelled
        self._own_positions = Role.PER_POSITION in engine.exact_per_request

    def collect(self) -> Iterator[Metric]:
        now = self.clock()
        target = None if self.target is None else self.target.read(now, work=False)
        acc = self.accounting.read(now, _no_batch if target is None else target.running)
        yield from self._requests(acc)
        yield from self._spec_counts(acc)
        yield from self._decode(acc)
        yield from self._histograms(acc)
        yield from self._windows(acc, target)
        yield from self._slices(acc)

    def _requests(self, acc: Snapshot) -> Iterator[Metric]:
        """Requests by status and finish reason, and those without exact counts by reason."""
        requests = CounterMetricFamily(
            "specdec_route_requests",
            "Completion requests through the proxy by HTTP status (499: the client hung up) and "
            "finish_reason (stop, length, tool_calls, abort, other).",
            labels=[*ROUTE_LABELS, "status", "finish_reason"],
        )
        for request_labels, n in sorted(acc.requests.items()):
            requests.add_metric(list(request_labels), float(n))
        yield requests
        without = CounterMetricFamily(
            "specdec_route_requests_without_spec_metrics",
            "Completed (200) requests with no exact per-request counts, left to estimates, by "
            "reason: n_above_1 (vLLM sends none for n > 1), not_sent (the engine's per-request "
            "flag is off, or something upstream strips the object), unknown_shape, tokens_only "
            "(llama.cpp: its own draft and accepted tokens, steps estimated), engine_sends_none "
            "(TensorRT-LLM).",
            labels=[*ROUTE_LABELS, "reason"],
        )
        for reason_labels, n in sorted(acc.without_exact.items()):
            without.add_metric(list(reason_labels), float(n))
        yield without
        steps = CounterMetricFamily(
            "specdec_route_steps",
            "Decode steps of the route's requests by the drafts proposed in them "
            "(draft_length=0: steps without speculation, as under a dynamic schedule), from "
            "the requests that stated them (vLLM's object: per step with `detailed`; with "
            "`summary` when every verify step drafted num_spec_tokens); plain steps are the "
            "completion tokens less 1, the verify steps and the accepted drafts.",
            labels=[*ROUTE_LABELS, "draft_length"],
        )
        for step_labels, n in sorted(acc.steps_by_length.items()):
            steps.add_metric(list(step_labels), float(n))
        yield steps

    def _spec_counts(self, acc: Snapshot) -> Iterator[Metric]:
        """The route's drafts, draft and accepted tokens, per position: exact or apportioned."""
        spec = [*ROUTE_LABELS, "source"]
        drafts = CounterMetricFamily(
            "specdec_route_drafts",
            "Verify steps of the route's requests "
            "(source=exact: per-request objects; estimated: apportioned).",
            labels=spec,
        )
        tokens = CounterMetricFamily(
            "specdec_route_draft_tokens", "Draft tokens proposed for the route.", labels=spec
        )
        accepted = CounterMetricFamily(
            "specdec_route_accepted_tokens", "Draft tokens accepted for the route.", labels=spec
        )
        per_pos = CounterMetricFamily(
            "specdec_route_accepted_tokens_per_position",
            "Verify steps of the route that accepted more than `position` drafts.",
            labels=[*spec, "position"],
        )
        for source, table in (("exact", acc.exact), ("estimated", acc.estimated)):
            for (route, model), c in sorted(table.items()):
                labels = [route, model, source]
                drafts.add_metric(labels, c.drafts or 0.0)
                if c.draft_tokens is not None and c.accepted is not None:  # a route's are known
                    tokens.add_metric(labels, c.draft_tokens)
                    accepted.add_metric(labels, c.accepted)
                for i, v in enumerate(c.per_position):
                    per_pos.add_metric([*labels, str(i)], v)
        yield from (drafts, tokens, accepted, per_pos)

    def _decode(self, acc: Snapshot) -> Iterator[Metric]:
        """Completion tokens, and the streamed requests' decode tokens, seconds and steps."""
        generated = CounterMetricFamily(
            "specdec_route_generation_tokens", "Completion tokens returned.", labels=ROUTE_LABELS
        )
        sourced = [*ROUTE_LABELS, "source"]
        decode_tokens = CounterMetricFamily(
            "specdec_route_decode_tokens",
            "Streamed requests' completion tokens after their first content event (decode rate "
            "numerator); source: whether the request's verify steps are the engine's own.",
            labels=sourced,
        )
        decode_seconds = CounterMetricFamily(
            "specdec_route_decode_seconds",
            "Streamed requests' seconds from their first to their last content event.",
            labels=sourced,
        )
        decode_steps = CounterMetricFamily(
            "specdec_route_decode_steps",
            "Decode steps of the streamed requests whose steps the engine counted (source="
            "exact): verify steps plus steps that drafted nothing. Seconds per step = "
            "rate(decode_seconds{source=exact}) / rate(this).",
            labels=sourced,
        )
        decode_drafts = CounterMetricFamily(
            "specdec_route_decode_draft_tokens",
            "Draft tokens proposed in the decode steps of specdec_route_decode_steps_total "
            "(source=exact); summed over the routes of a model, their ratio is the drafts per "
            "decode step the engine ran (0: speculation off, as a schedule's k = 0).",
            labels=sourced,
        )
        held = CounterMetricFamily(
            "specdec_route_decode_context_token_seconds",
            "Streamed requests' decode seconds x the tokens each held in its KV meanwhile "
            "(its prompt + half its decode), where the engine stated its prompt's tokens; over "
            "specdec_route_decode_context_seconds_total: the context a decoding request held.",
            labels=sourced,
        )
        held_seconds = CounterMetricFamily(
            "specdec_route_decode_context_seconds",
            "Decode seconds of the streamed requests whose prompt's tokens are known.",
            labels=sourced,
        )
        for key, n in sorted(acc.generation_tokens.items()):
            generated.add_metric(list(key), float(n))
        for decode_key, d in sorted(acc.decode.items()):
            labels = list(decode_key)
            decode_tokens.add_metric(labels, d.tokens)
            decode_seconds.add_metric(labels, d.seconds)
            held.add_metric(labels, d.context_seconds)
            held_seconds.add_metric(labels, d.context_weight)
            if decode_key[2] == "exact":
                decode_steps.add_metric(labels, d.steps)
                decode_drafts.add_metric(labels, d.draft_tokens)
        yield from (generated, decode_tokens, decode_seconds, decode_steps, decode_drafts)
        yield from (held, held_seconds)

    def _histograms(self, acc: Snapshot) -> Iterator[Metric]:
        for name, doc, table in (
            (
                "specdec_route_ttft_seconds",
                "Request in -> first content token out, streamed requests.",
                acc.ttft,
            ),
            (
                "specdec_route_decode_tokens_per_second",
                "Per request: completion tokens / seconds after the first token.",
                acc.decode_rate,
            ),
        ):
            family = HistogramMetricFamily(name, doc, labels=ROUTE_LABELS)
            for key, histogram in sorted(table.items()):
                family.add_metric(list(key), with_exemplars(histogram), histogram.sum)
            yield family

    def _windows(self, acc: Snapshot, target: TargetSnapshot | None) -> Iterator[Metric]:
        f = _window_families()
        drift_window = _drift_window([w.window for w in acc.windows])
        for per_window in acc.windows:
            window, routes = per_window.window, per_window.routes
            drifts = self._drifts(routes)
            if window == drift_window:
                for model, drift in sorted(drifts.items()):
                    if drift is not None:
                        f.drift.add_metric([model], drift.ratio)
                        f.drift_tolerance.add_metric([model], drift.tolerance)
            for (route, model), seen in sorted(routes.items()):
                config = self.models.get(model)
                curve = None if config is None else config.curve
                reading = read_route(seen, curve, self._own_positions, drifts.get(model))
                series = [route, model, window.label]
                if reading.acceptance is not None:
                    f.acceptance.add_metric(series, reading.acceptance)
                if reading.tokens_per_step is not None:
                    f.length.add_metric(series, reading.tokens_per_step)
                _add_payoff(f, series, reading)
            if target is not None and per_window.engine.drafts:
                routed = total([seen.counts for seen in routes.values()])
                f.coverage.add_metric(
                    [target.name, window.label],
                    (routed.drafts or 0.0) / per_window.engine.drafts,
                )
        yield from f

    def _drifts(self, routes: Mapping[RouteKey, RouteWindow]) -> dict[str, Drift | None]:
        """Per model with a measured curve (`step_time`), its engine's drift from the curve over
        the window: every route's counted steps against the curve at the engine's load."""
        exact: dict[str, Decode] = {}
        loads: dict[str, Load] = {}
        for (_, model), seen in routes.items():
            exact[model] = exact.get(model, Decode()) + seen.exact
            loads[model] = seen.load
        out: dict[str, Drift | None] = {}
        for model, decoded in exact.items():
            config = self.models.get(model)
            if config is not None and config.step_time:
                out[model] = curve_drift(config.curve, loads[model], decoded)
        return out

    def _slices(self, acc: Snapshot) -> Iterator[Metric]:
        """The exact requests' counts by band of each dimension, and each route's acceptance
        change over the breakdown's window against its baseline, split into mix and within
        (core.slices)."""
        labels = [*ROUTE_LABELS, "dimension", "band"]
        families = {
            field: CounterMetricFamily(f"specdec_route_slice_{name}", doc, labels=labels)
            for field, name, doc in _SLICE_COUNTERS
        }
        for key, counts in sorted(acc.slices.items()):
            for field, family in families.items():
                family.add_metric(list(key), getattr(counts, field))
        yield from families.values()
        change = GaugeMetricFamily(
            "specdec_route_acceptance_change_ratio",
            f"The route's exact acceptance over the last {acc.change.window.label} less over "
            f"the {acc.change.baseline.label} before it (what it has seen of it), per dimension "
            "split into part=mix (its traffic moved between the dimension's bands) and "
            "part=within (the bands' own acceptance moved); the two add up to the change.",
            labels=[*ROUTE_LABELS, "dimension", "part"],
        )
        window = _by_dimension(acc.change.in_window)
        base = _by_dimension(acc.change.in_baseline)
        for series, bands in sorted(window.items()):
            parts = change_parts(bands, base.get(series, {}))
            for part, value in (parts or {}).items():
                change.add_metric([*series, part], value)
        yield change


def _no_batch(_: Window) -> Mapping[str, float]:
    return {}


_SLICE_COUNTERS = (
    ("draft_tokens", "draft_tokens", "Draft tokens of the route's exact requests in the band."),
    (
        "accepted",
        "accepted_tokens",
        "Accepted draft tokens of the route's exact requests in the band.",
    ),
    (
        "requests",
        "requests",
        "The route's exact requests in the band (each in one band a dimension).",
    ),
    (
        "completion_tokens",
        "completion_tokens",
        "Completion tokens of the route's exact requests in the band: over them, the band's draft "
        "tokens are how much of its output speculation drafted (0: it drafted none).",
    ),
)


def _by_dimension(
    counts: Mapping[tuple[str, str, str, str], SliceCounts],
) -> dict[tuple[str, str, str], dict[str, SliceCounts]]:
    """(route, model_name, dimension) -> band -> counts."""
    out: dict[tuple[str, str, str], dict[str, SliceCounts]] = {}
    for (route, model, dimension, band), c in counts.items():
        out.setdefault((route, model, dimension), {})[band] = c
    return out


class _WindowFamilies(NamedTuple):
    acceptance: GaugeMetricFamily
    length: GaugeMetricFamily
    speedup_est: GaugeMetricFamily
    speedup: GaugeMetricFamily
    at_length: GaugeMetricFamily
    at_length_half: GaugeMetricFamily
    best: GaugeMetricFamily
    coverage: GaugeMetricFamily
    drift: GaugeMetricFamily
    drift_tolerance: GaugeMetricFamily


def _drift_window(windows: list[Window]) -> Window | None:
    """The window the curve's drift is exported over: the shortest of at least DRIFT_WINDOW
    (one long enough to hold many requests' steps), else the longest."""
    long_enough = [w for w in windows if w.seconds >= DRIFT_WINDOW]
    if long_enough:
        return min(long_enough, key=lambda w: w.seconds)
    return max(windows, key=lambda w: w.seconds, default=None)


def _window_families() -> _WindowFamilies:
    """The per-window gauges, empty: filled per route and window by RouteCollector."""
    labels = [*ROUTE_LABELS, "window"]
    acceptance = GaugeMetricFamily(
        "specdec_route_acceptance_ratio",
        "Accepted / proposed draft tokens of the route over the window.",
        labels=labels,
    )
    length = GaugeMetricFamily(
        "specdec_route_mean_acceptance_length",
        "Tokens per verify step of the route over the window.",
        labels=labels,
    )
    speedup_est = GaugeMetricFamily(
        "specdec_route_estimated_speedup_ratio",
        "The route's tokens per decode step (its exact streamed requests; else per verify "
        "step) / the cost ratio at the load: a step at the drafts per step the engine ran / a "
        "plain step, on the model's step-time curve at the engine's mean batch and the context "
        "its decoding requests held over the window (1 where the steps drafted nothing): > 1 "
        "means speculation pays at the load it runs.",
        labels=labels,
    )
    speedup = GaugeMetricFamily(
        "specdec_route_speedup_ratio",
        "Measured: the route's decode rate x the plain step now (its exact requests' seconds "
        "per decode step / the same cost ratio; without them, the curve's plain step).",
        labels=labels,
    )
    at_length = GaugeMetricFamily(
        "specdec_route_speedup_at_draft_length_ratio",
        "What the route would get with draft_length drafts per step at the load it runs: "
        "1 + the per-position acceptance summed below draft_length, / the cost ratio of a step "
        "of that many drafts (the curve's steps by draft length at the batch and context).",
        labels=[*labels, "draft_length"],
    )
    at_length_half = GaugeMetricFamily(
        "specdec_route_speedup_at_draft_length_ci_halfwidth",
        "95 % half-width of specdec_route_speedup_at_draft_length_ratio, from the "
        "acceptance's (the positions taken to move together), widened by the engine's drift "
        "from its curve (specdec_model_curve_drift_ratio) where the model has one.",
        labels=[*labels, "draft_length"],
    )
    best = GaugeMetricFamily(
        "specdec_route_best_draft_length",
        "The draft length (0: speculation off) with the highest speedup at the load, when "
        "it beats the runner-up by more than their half-widths; absent otherwise.",
        labels=labels,
    )
    coverage = GaugeMetricFamily(
        "specdec_attribution_coverage_ratio",
        "Drafts accounted to routes / the engine's drafts over the window "
        "(< 1: traffic bypasses the proxy).",
        labels=["target", "window"],
    )
    drift = GaugeMetricFamily(
        "specdec_model_curve_drift_ratio",
        "The engine's drift from its step-time curve: its decode step now (every route's "
        "counted requests over the window) / the curve's at the same batch, context and draft "
        "tokens per step (a schedule's k = 0: the plain step, observed); 1 while it runs as "
        "measure found it. Outside specdec_model_curve_drift_tolerance_ratio: re-measure.",
        labels=["model_name"],
    )
    drift_tolerance = GaugeMetricFamily(
        "specdec_model_curve_drift_tolerance_ratio",
        "How far specdec_model_curve_drift_ratio may stray from 1 within measure's own error: "
        "the curve's spread over its run at the batch (its farthest replicate), at least 0.03.",
        labels=["model_name"],
    )
    return _WindowFamilies(
        acceptance,
        length,
        speedup_est,
        speedup,
        at_length,
        at_length_half,
        best,
        coverage,
        drift,
        drift_tolerance,
    )


def _add_payoff(f: _WindowFamilies, series: list[str], reading: RouteReading) -> None:
    """One route's speedups at the load, by draft length, and the best draft length."""
    payoff = reading.payoff
    if payoff.estimated is not None:
        f.speedup_est.add_metric(series, payoff.estimated)
    if payoff.measured is not None:
        f.speedup.add_metric(series, payoff.measured)
    for option in reading.options:
        length_series = [*series, str(option.draft_length)]
        f.at_length.add_metric(length_series, option.speedup)
        if option.halfwidth is not None:
            f.at_length_half.add_metric(length_series, option.halfwidth)
    if reading.best is not None:
        f.best.add_metric(series, float(reading.best.draft_length))
