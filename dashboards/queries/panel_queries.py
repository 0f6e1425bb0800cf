"""PromQL for dashboard panels: recording rules where they exist, raw counters over
`$__rate_interval` where they do not, filtered by the dashboards' template variables.

Recording rules aggregate by their level's labels (route, model_name / model_name, engine)
and so carry no `job`: panels reading them cover every sidecar of the selected routes or
engines. Raw-counter panels also honour `$job`.
"""

from __future__ import annotations

import re

from dashboards.queries import moments, slices, spec
from dashboards.queries.labels import ENGINE
from dashboards.queries.promql import by, ratio, sum_rate
from exporter.core.stats import LOW_CONFIDENCE_REQUESTS

RATE = "$__rate_interval"

# selectors over the template variables (all multi-value with "All" = .*)
JOB = 'job=~"$job"'
MODEL = 'model_name=~"$model_name"'
ROUTE_SEL = f'{MODEL}, route=~"$route"'
ENGINE_SEL = f'{MODEL}, engine=~"$engine"'
RAW_ROUTE = f"{JOB}, {ROUTE_SEL}"
RAW_ENGINE = f"{JOB}, {ENGINE_SEL}"
RAW_MODEL = f"{JOB}, {MODEL}"


# A figure over a window is drawn once its route or engine has that window of history (its
# marker counter existed a window ago). A young series' window holds only its first minutes: its
# 5m rate reads low, its ratios swing with the first few requests, and either looks like a trend
# on the graph and like a fact on a "now" panel. A new route or a new sidecar shows once its
# window is full; a sidecar restart at the same address keeps its series and shows throughout.
HISTORY = {
    spec.ROUTES: "specdec_route_requests_total",  # every route with a request
    spec.ENGINES: "specdec_engine_restarts_total",  # every engine the sidecar tracks
}
WINDOW_SUFFIX = re.compile(r"(\d+[smhdw])$")


def full_window(
    expr: str, scope: spec.Scope, window: str, on: tuple[str, ...] | None = None
) -> str:
    """`expr` (a figure over `window`) where its series are at least `window` old; `on`: the
    scope's labels that `expr` keeps (default all of them)."""
    labels = ", ".join(on or scope.labels)
    sel = ROUTE_SEL if scope is spec.ROUTES else ENGINE_SEL
    history = f"{HISTORY[scope]}{{{sel}}} offset {window}"
    return f"(\n{expr}\nand on ({labels}) group by ({labels}) ({history})\n)"


def recorded(
    scope: spec.Scope, figure: str, suffix: str, per_position: bool = False, offset: str = ""
) -> str:
    """A recording rule's series (dashboards/rules.py) for the dashboards' variables, e.g.
    recorded(ROUTES, "acceptance", "ratio_rate5m"), over a full window (`full_window`); or as it
    was `offset` ago (a past, full window)."""
    sel = ROUTE_SEL if scope is spec.ROUTES else ENGINE_SEL
    series = f"{scope.rule_name(figure, suffix, per_position)}{{{sel}}}"
    if offset:
        return f"{series} offset {offset}"
    window = WINDOW_SUFFIX.search(suffix)
    assert window is not None, suffix
    return full_window(series, scope, window.group(1))


def route_rule(figure: str, suffix: str, offset: str = "") -> str:
    return recorded(spec.ROUTES, figure, suffix, offset=offset)


def engine_rule(figure: str, suffix: str, per_position: bool = False) -> str:
    return recorded(spec.ENGINES, figure, suffix, per_position)


# --- model config gauges (from the sidecar's `models:` section) --------------------------


def breakeven() -> str:
    """Acceptance below which speculation costs more than it saves, per model."""
    return f"max by (model_name) (specdec_breakeven_acceptance_ratio{{{RAW_MODEL}}})"


def speedup_breakeven() -> str:
    """1x, per model the sidecar can estimate a speedup for: a series of its own, so the
    line has a legend entry (a threshold line has none)."""
    return f"clamp(max by (model_name) (specdec_breakeven_acceptance_ratio{{{RAW_MODEL}}}), 1, 1)"


def tokens_per_step_ceiling() -> str:
    """k + 1: every draft accepted plus the bonus token."""
    return f"max by (model_name) (specdec_model_num_speculative_tokens{{{RAW_MODEL}}}) + 1"


def decode_ceiling() -> str:
    return f"max by (model_name) (specdec_decode_ceiling_tokens_per_second{{{RAW_MODEL}}})"


# --- per route -------------------------------------------------------------------------


def route_draft_length_in_effect() -> str:
    """Drafts per decode step per route (a plain step counts 0): the draft length in effect,
    which under a schedule moves with the batch (`specdec_route_steps_total`, issue 37)."""
    labels = ("route", "model_name")
    return ratio(
        sum_rate("specdec_route_draft_tokens_total", RATE, labels, RAW_ROUTE),
        sum_rate("specdec_route_steps_total", RATE, labels, RAW_ROUTE),
    )


def scheduled_draft_length() -> str:
    """The k the model's configured schedule gives at the engine's batch now."""
    return f"max by (model_name) (specdec_engine_scheduled_draft_length{{{RAW_MODEL}}})"


def route_speedup_at_draft_length(figure: str = "ratio") -> str:
    """The sidecar's speedup at each draft length 0..k (or its half-width), 5m window."""
    return full_window(
        f'specdec_route_speedup_at_draft_length_{figure}{{{RAW_ROUTE}, window="5m"}}',
        spec.ROUTES,
        "5m",
    )


def _cost_on_the_line(batch: str) -> str:
    """A plain step's seconds / a verify step's at `batch` running requests (the model's
    step-time line, from its `models:` config)."""

    def line(kind: str) -> str:
        base = f"max by (model_name) (specdec_model_{kind}_step_base_seconds{{{RAW_MODEL}}})"
        slope = (
            f"max by (model_name) (specdec_model_{kind}_step_seconds_per_running_request"
            f"{{{RAW_MODEL}}})"
        )
        return f"({base} + {slope} * {batch})"

    return f"({line('plain')}\n/ on (model_name)\n{line('verify')})"


def route_speedup_at_batch(running: int) -> str:
    """The route's load-aware speedup now, moved along the model's step-time line to `running`
    requests: x cost(running) / cost(the batch now). At the batch now it is the estimate; past
    the batch the curve was measured at (rounded, as `specdec advise` reads it), nothing."""
    now = spec.batch(RATE, RAW_MODEL)
    cost_now = _cost_on_the_line(f"on (model_name) ({now})")
    moved = f"({_cost_on_the_line(str(running))}\n/ on (model_name)\n{cost_now})"
    measured = (
        f"max by (model_name) (specdec_model_step_curve_max_running_requests{{{RAW_MODEL}}})"
        f" >= {running - 0.5}"
    )
    return (
        f"{route_rule('estimated_speedup', 'ratio_rate5m')}\n* on (model_name) group_left ()\n"
        f"{moved}\nand on (model_name)\n({measured})"
    )


def route_batch_now() -> str:
    """The batch the route's engine runs now, on the route's rows."""
    speedup = route_rule("estimated_speedup", "ratio_rate5m")
    return f"0 * {speedup}\n+ on (model_name) group_left ()\n{spec.batch(RATE, RAW_MODEL)}"


def route_ttft(q: float) -> str:
    return full_window(spec.ttft_quantile(q, RATE, RAW_ROUTE), spec.ROUTES, RATE)


def route_requests_by_status() -> str:
    rate = sum_rate("specdec_route_requests_total", RATE, ("route", "status"), RAW_ROUTE)
    return full_window(rate, spec.ROUTES, RATE, on=("route",))


def route_acceptance_change() -> str:
    """Acceptance now (5m) minus the same hour yesterday, in ratio points."""
    return (
        f"{route_rule('acceptance', 'ratio_rate5m')}\n- on (route, model_name)\n"
        f"{route_rule('acceptance', 'ratio_rate1h', offset='1d')}"
    )


def route_acceptance_yesterday() -> str:
    return route_rule("acceptance", "ratio_rate1h", offset="1d")


# --- per model x engine ------------------------------------------------------------------


def engine_flow(counter: str) -> str:
    """Draft tokens per second of one engine counter (proposed, accepted, rejected), from the
    engine's first full rate window on."""
    return full_window(
        sum_rate(f"specdec_{counter}_total", RATE, ENGINE, RAW_ENGINE), spec.ENGINES, RATE
    )


def engine_restarts() -> str:
    return f"sum {by(ENGINE)} (increase(specdec_engine_restarts_total{{{RAW_ENGINE}}}[$__range]))"


def vllm_quantile(q: float, histogram: str) -> str:
    """A quantile of one of vLLM's own histograms (the engine's job, not the sidecar's)."""
    return (
        f"histogram_quantile({q}, sum {by((*ENGINE, 'le'))} "
        f"(rate(vllm:{histogram}_bucket{{{ENGINE_SEL}}}[{RATE}])))"
    )


def vllm_gauge(name: str) -> str:
    return f"sum {by(ENGINE)} (vllm:{name}{{{ENGINE_SEL}}})"


def model_decode_rate() -> str:
    """Per-request decode rate of the model's streamed requests through the proxy."""
    return ratio(
        sum_rate("specdec_route_decode_tokens_total", RATE, ("model_name",), RAW_MODEL),
        sum_rate("specdec_route_decode_seconds_total", RATE, ("model_name",), RAW_MODEL),
    )


def ceiling_utilization() -> str:
    """Per-request decode rate / the plain-decode bandwidth roofline (> 1: beyond the roofline)."""
    return f"(\n{model_decode_rate()}\n)\n/ on (model_name)\n({decode_ceiling()} > 0)"


# --- exporter health ------------------------------------------------------------------------


def sidecar_up() -> str:
    return f"up{{{JOB}}}"


def target_up() -> str:
    return f"specdec_target_up{{{JOB}}}"


def build_versions() -> str:
    return f"count by (version) (specdec_build_info{{{JOB}}})"


def sidecar_scrape_duration() -> str:
    return f"specdec_scrape_duration_seconds{{{JOB}}}"


def prometheus_scrape_duration() -> str:
    return f"scrape_duration_seconds{{{JOB}}}"


def scrape_errors() -> str:
    return sum_rate("specdec_scrape_errors_total", RATE, ("target", "reason"), JOB)


def malformed_lines() -> str:
    return sum_rate("specdec_malformed_lines_total", RATE, ("target",), JOB)


def coverage(window: str) -> str:
    return f'specdec_attribution_coverage_ratio{{{JOB}, window="{window}"}}'


def proxy_upstream_errors() -> str:
    return sum_rate("specdec_proxy_upstream_errors_total", RATE, ("reason",), JOB)


def proxy_refused() -> str:
    return sum_rate("specdec_proxy_refused_requests_total", RATE, (), JOB)


def proxy_responses_by_status() -> str:
    return sum_rate("specdec_route_requests_total", RATE, ("status",), JOB)


def sidecar_cpu() -> str:
    return f"rate(specdec_process_cpu_seconds_total{{{JOB}}}[{RATE}])"


def sidecar_memory() -> str:
    return f"specdec_process_resident_memory_bytes{{{JOB}}}"


def sidecar_fds() -> str:
    return f"specdec_process_open_fds{{{JOB}}}"


# --- the request-level view (per route, exact requests) ------------------------------------


def exact_rule(figure: str, op: str, window: str) -> str:
    """A request-level recording rule (dashboards/queries/moments.py), filtered by route, over
    a full window."""
    return full_window(
        f"{moments.rule_name(figure, op, window)}{{{ROUTE_SEL}}}", spec.ROUTES, window
    )


def acceptance_now(window: str) -> str:
    """The exact acceptance the drop alert reads over `window`, else the route's overall one
    (a route without per-request objects has no exact figures)."""
    overall = route_rule("acceptance", f"ratio_rate{window}") if window in ("1m", "5m") else None
    exact = exact_rule("exact_acceptance", "ratio_rate", window)
    return f"{exact}\nor\n{overall}" if overall else exact


def acceptance_band(window: str, sign: str) -> str:
    """The exact acceptance plus or minus its 95 % half-width (Student's t of the window's
    effective requests times the request-level SE; none below 3 effective requests)."""
    p = exact_rule("exact_acceptance", "ratio_rate", window)
    halfwidth = exact_rule("acceptance_ci_halfwidth", "rate", window)
    return f"{p} {sign} on (route, model_name) {halfwidth}"


def low_confidence(window: str) -> str:
    """1 where the window holds fewer than LOW_CONFIDENCE_REQUESTS requests, else 0."""
    requests = exact_rule("spec_requests", "increase", window)
    return f"{requests} < bool {LOW_CONFIDENCE_REQUESTS}"


def acceptance_heatmap() -> str:
    """Requests per per-request acceptance bucket and time slice (a Grafana heatmap)."""
    return (
        f"sum by (le) (increase(specdec_route_request_acceptance_ratio_bucket{{{RAW_ROUTE}}}"
        f"[{RATE}]))"
    )


def below_breakeven_share() -> str:
    """Requests that speculation made slower / requests with drafts."""
    share = moments.share("specdec_route_requests_below_breakeven_total", RATE, RAW_ROUTE)
    return full_window(share, spec.ROUTES, RATE)


def finish_reasons() -> str:
    rate = sum_rate("specdec_route_requests_total", RATE, ("route", "finish_reason"), RAW_ROUTE)
    return full_window(rate, spec.ROUTES, RATE, on=("route",))


# --- why acceptance moved (the slice counters' split) -------------------------------------
# Each figure from the route's first full window on (the split also needs a baseline: it ends
# where the window begins), in percentage points (x 100: the unit says pp), and only the parts
# of at least `min_part` (a dimension with one band moves no traffic: its mix part is 0).


def _points(expr: str) -> str:
    return f"100 * (\n{expr}\n)"


def _at_least(expr: str, min_part: float) -> str:
    """`expr`'s series where they are `min_part` or more from 0."""
    return f"(\n{expr}\n) >= {min_part}\nor\n(\n{expr}\n) <= -{min_part}"


def acceptance_cause(window: str, baseline: str, min_part: float) -> str:
    """Per route, the part that explains its change (slices.cause), named in a label `cause`:
    "traffic mix along DIMENSION", "the engine (within bands)", or "steady" when that part is
    under `min_part`; in percentage points."""
    rule = slices.cause_rule(window, baseline)
    mix = _at_least(f'{rule}{{{ROUTE_SEL}, part="mix"}}', min_part)
    within = _at_least(f'{rule}{{{ROUTE_SEL}, part="within"}}', min_part)
    on = "on (route, model_name)"
    named = (
        f'label_replace(\n{mix},\n"cause", "traffic mix along $1", "dimension", "(.+)"\n)\n'
        f"or {on}\n"
        f'label_replace(\n{within},\n"cause", "the engine (within bands)", "", ""\n)\n'
        f"or {on}\n"
        f'label_replace({rule}{{{ROUTE_SEL}}}, "cause", "steady", "", "")'
    )
    return full_window(_points(named), spec.ROUTES, window)


def acceptance_mix(window: str, baseline: str, min_part: float) -> str:
    """The mix part along each dimension the route's traffic moved along (`min_part` or more)."""
    rule = f'{slices.change_rule(window, baseline)}{{{ROUTE_SEL}, part="mix"}}'
    return full_window(_points(_at_least(rule, min_part)), spec.ROUTES, window)


def acceptance_within(window: str, baseline: str, min_part: float) -> str:
    """The within part along the dimension that explains the change most (where the traffic
    moved most; slices.cause), one series a route: on every other dimension it also holds the
    traffic's move."""
    change = f'{slices.change_rule(window, baseline)}{{{ROUTE_SEL}, part="within"}}'
    cause = f"{slices.cause_rule(window, baseline)}{{{ROUTE_SEL}}}"
    within = (
        f"sum by (route, model_name) (\n{change}\nand on (route, model_name, dimension)\n{cause}\n)"
    )
    return full_window(_points(_at_least(within, min_part)), spec.ROUTES, window)


def band_figure(figure: str, window: str) -> str:
    """A band's recorded share of draft tokens (a band that drafted nothing has none to show)
    or acceptance over `window`."""
    found = f"{slices.band_rule(figure, window)}{{{ROUTE_SEL}}}"
    return full_window(f"{found} > 0" if figure == "share" else found, spec.ROUTES, window)


def band_draft_rate() -> str:
    """A band's draft tokens per completion token: 0 where that traffic drafts nothing
    (speculation off for it), which its acceptance cannot show."""
    rate = ratio(
        sum_rate("specdec_route_slice_draft_tokens_total", RATE, slices.BAND, RAW_ROUTE),
        sum_rate("specdec_route_slice_completion_tokens_total", RATE, slices.BAND, RAW_ROUTE),
    )
    return full_window(rate, spec.ROUTES, RATE)


# the baseline's real span (the longest of the selected routes'), in the largest unit it
# fills: (at least seconds, seconds a unit, the unit)
SPAN_UNITS = ((0.95 * 86400, 86400, "d"), (7200, 3600, "h"), (0, 60, "min"))


def baseline_span() -> str:
    """One series, value the span in its unit, label `unit` (0 min before any baseline): a
    dashboard variable's value and text."""
    span = f"max({slices.SPAN}{{{ROUTE_SEL}}})"
    picks = [
        f'label_replace(round({span} / {size}, 0.1), "unit", "{unit}", "", "")'
        + (f" and on () {span} >= {least:g}" if least else "")
        for least, size, unit in SPAN_UNITS
    ]
    picks.append('label_replace(vector(0), "unit", "min", "", "")')
    return "\nor on ()\n".join(f"({p})" for p in picks)
