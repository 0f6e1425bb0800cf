"""Alerts on speculative decoding, judged on request-level evidence so a quiet route or a
few unusual requests never cry wolf.

Each alert links to its section of docs/runbooks.md. Thresholds live here, once.
"""

from __future__ import annotations

from typing import Any

from dashboards.queries.moments import rule

RUNBOOK = "https://github.com/specdec/specdec/blob/main/docs/runbooks.md#"
# SpecDecodeAcceptanceDrop: on a short window (busy routes) or a long one (quiet routes), the
# route's exact acceptance is at least DROP_FRACTION below its own 1-day level, by more than
# DROP_Z standard errors (request-level, at least the day's spread predicts), over at least
# MIN_REQUESTS requests. bench/alert_quality.py measures detection time and false firings.
DROP_WINDOWS = ("1m", "10m")
DROP_FRACTION = 0.3
DROP_Z = 4.5
MIN_REQUESTS = 5
# SpecDecodeRunawayGenerations: repetition loops (cut by max_tokens at acceptance near 1)
RUNAWAY_WINDOW = "10m"
RUNAWAY_SHARE = 0.05  # of the route's requests over the window ...
RUNAWAY_OVER_BASELINE = 3  # ... and this many times its 1-day share
RUNAWAY_MIN = 3  # loops in the window
# SpecDecodeAcceptanceCollapsed: many requests near 0 on a route normally well above it
COLLAPSED_SHARE = 0.3  # of the route's requests with acceptance <= 0.05 over the window
COLLAPSED_BASELINE = 0.1  # ... where on a normal day at most this share is
COLLAPSED_NORMAL_ACCEPTANCE = 0.3  # ... and the route's 1-day acceptance is at least this
MIN_REQUESTS_5M = 6  # SpecDecodeBelowBreakEven: more than one request a minute over 5 minutes
COVERAGE_MIN = 0.9

ROUTE = "route_model_name"


def _alert(
    name: str, expr: str, for_: str, severity: str, summary: str, description: str
) -> dict[str, Any]:
    return {
        "alert": name,
        "expr": expr,
        "for": for_,
        "labels": {"severity": severity},
        "annotations": {
            "summary": summary,
            "description": description,
            "runbook_url": RUNBOOK + name.lower(),
        },
    }


def acceptance_drop() -> dict[str, Any]:
    p0 = rule("exact_acceptance", "ratio_rate", "1d")
    windows = []
    for w in DROP_WINDOWS:
        p = rule("exact_acceptance", "ratio_rate", w)
        windows.append(
            f"(\n  ({p0} - on (route, model_name) {p}) / on (route, model_name) {p0} > {DROP_FRACTION}\n"
            f"  and on (route, model_name) {rule('acceptance_drop', 'zscore_rate', w)} > {DROP_Z}\n"
            f"  and on (route, model_name) {rule('spec_requests', 'increase', w)} >= {MIN_REQUESTS}\n)"
        )
    return _alert(
        "SpecDecodeAcceptanceDrop",
        "\nor\n".join(windows),
        "0s",
        "warning",
        "Draft acceptance of route {{ $labels.route }} dropped well below its usual level",
        "Acceptance of {{ $labels.route }} ({{ $labels.model_name }}) is {{ $value | humanizePercentage }} "
        f"below its 1-day level over the last {' or '.join(DROP_WINDOWS)}, by more than {DROP_Z} "
        f"request-level standard errors over at least {MIN_REQUESTS} requests. Tokens per step and the "
        "speedup fall with it; below break-even speculation costs more than it saves.",
    )


def runaway_generations() -> dict[str, Any]:
    w = RUNAWAY_WINDOW
    share = rule("runaway_requests", "share_rate", w)
    base = rule("runaway_requests", "share_rate", "1d")
    expr = (
        f"{share} > {RUNAWAY_SHARE}\n"
        f"and on (route, model_name) {share} > on (route, model_name) {RUNAWAY_OVER_BASELINE} * {base}\n"
        f"and on (route, model_name) sum by (route, model_name) (increase(specdec_route_runaway_requests_total[{w}])) >= {RUNAWAY_MIN}"
    )
    return _alert(
        "SpecDecodeRunawayGenerations",
        expr,
        "0s",
        "warning",
        "Route {{ $labels.route }} has many runaway generations (repetition loops)",
        "{{ $value | humanizePercentage }} of {{ $labels.route }}'s requests ({{ $labels.model_name }}) over "
        f"the last {w} ran to max_tokens with acceptance near 1 (>= 0.95), well above the route's own day: "
        "the model is repeating itself, and the drafter predicts the loop perfectly.",
    )


def acceptance_collapsed() -> dict[str, Any]:
    w = RUNAWAY_WINDOW
    share = rule("collapsed_requests", "share_rate", w)
    expr = (
        f"{share} >= {COLLAPSED_SHARE}\n"
        f"and on (route, model_name) {rule('collapsed_requests', 'share_rate', '1d')} < {COLLAPSED_BASELINE}\n"
        f"and on (route, model_name) {rule('exact_acceptance', 'ratio_rate', '1d')} >= {COLLAPSED_NORMAL_ACCEPTANCE}\n"
        f"and on (route, model_name) {rule('spec_requests', 'increase', w)} >= {MIN_REQUESTS}"
    )
    return _alert(
        "SpecDecodeAcceptanceCollapsed",
        expr,
        "0s",
        "warning",
        "Draft acceptance of route {{ $labels.route }} collapsed to near zero",
        "{{ $value | humanizePercentage }} of {{ $labels.route }}'s requests ({{ $labels.model_name }}) over "
        f"the last {w} accepted almost no drafts (<= 5 %), on a route whose day is normally well above: "
        "garbled output, or a draft model that no longer matches the target.",
    )


def alert_groups() -> list[dict[str, Any]]:
    rules = [  # SpecDecodeAcceptanceDrop lives with its recording rules (dashboards/rules.py)
        runaway_generations(),
        acceptance_collapsed(),
        _alert(
            "SpecDecodeBelowBreakEven",
            f"{ROUTE}:specdec_route_estimated_speedup:ratio_rate1h < 1\n"
            f"and on (route, model_name) ({ROUTE}:specdec_route_requests:rate5m * 300) >= {MIN_REQUESTS_5M}",
            "15m",
            "warning",
            "Speculation costs more than it saves on route {{ $labels.route }}",
            "Estimated speedup of {{ $labels.route }} ({{ $labels.model_name }}) over the last hour is "
            '{{ $value | printf "%.2f" }}x: tokens per step no longer cover the cost of a verify step.',
        ),
        _alert(
            "SpecDecodeSilentlyOff",
            "(sum by (route, model_name) (rate(specdec_route_generation_tokens_total[10m])) > 0\n"
            " unless on (route, model_name) sum by (route, model_name) (rate(specdec_route_drafts_total[10m])) > 0)\n"
            "or\n"
            "(sum by (model_name) (rate(vllm:generation_tokens_total[10m])) > 0\n"
            " unless on (model_name) sum by (model_name) (rate(vllm:spec_decode_num_drafts_total[10m])) > 0)",
            "10m",
            "warning",
            "Tokens are generated but no drafts are made ({{ $labels.model_name }})",
            "{{ $labels.model_name }} generates {{ $value | humanize }} tokens/s and proposes no draft "
            "tokens: speculative decoding is off or its drafter finds nothing to propose.",
        ),
        _alert(
            "SpecDecodeCountersMissing",
            'rate(specdec_scrape_errors_total{reason="no_spec_metrics"}[5m]) > 0',
            "10m",
            "warning",
            "vLLM target {{ $labels.target }} exposes no speculative-decoding counters",
            "The sidecar reads {{ $labels.target }} but finds no spec_decode counters: vLLM runs "
            "without --speculative-config, or the target's engine/prefix setting is wrong.",
        ),
        _alert(
            "SpecDecodeTargetDown",
            "specdec_target_up == 0",
            "2m",
            "critical",
            "The sidecar cannot scrape vLLM target {{ $labels.target }}",
            "specdec_target_up is 0 for {{ $labels.target }} ({{ $labels.instance }}): see "
            "specdec_scrape_errors_total by reason. Derived gauges of the target are gone.",
        ),
        _alert(
            "SpecDecodeExporterDown",
            'up{job="specdec"} == 0 or absent(up{job="specdec"})',
            "2m",
            "critical",
            "Prometheus cannot scrape the specdec sidecar",
            # absent() has no instance label: name the job then, not an empty string
            "No specdec metrics from {{ with $labels.instance }}{{ . }}{{ else }}any target of "
            'job="specdec"{{ end }}: acceptance, routes and these alerts are blind.',
        ),
        _alert(
            "SpecDecodeAttributionCoverageLow",
            f'specdec_attribution_coverage_ratio{{window="15m"}} < {COVERAGE_MIN}',
            "15m",
            "info",
            "Traffic bypasses the route-tagging proxy on {{ $labels.target }}",
            "Only {{ $value | humanizePercentage }} of the engine's drafts over 15m were accounted to "
            "routes: some clients talk to vLLM directly, so per-route figures miss that traffic.",
        ),
    ]
    return [{"name": "specdec-alerts", "rules": rules}]
