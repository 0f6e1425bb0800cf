"""Alerts on speculative decoding, with guards so a quiet route never cries wolf.

Each alert links to its section of docs/runbooks.md. Thresholds live here, once.
"""

from __future__ import annotations

from typing import Any

RUNBOOK = "https://github.com/specdec/specdec/blob/main/docs/runbooks.md#"
DROP_FRACTION = 0.2  # acceptance must fall below 80 % of the route's own day-long level ...
DROP_SIGMAS = 6  # ... and by more than 6 binomial standard deviations of the last minute
MIN_DRAFT_TOKENS_1M = 300  # at least this many draft tokens in the last minute
MIN_REQUESTS_5M = 6  # and more than one request a minute over 5 minutes: a route below
# 1/min has at most 5 in any 5 minutes (5.26 after rate()'s extrapolation), so it never qualifies
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
    now = f"{ROUTE}:specdec_route_acceptance:ratio_rate1m"
    base = f"{ROUTE}:specdec_route_acceptance:ratio_rate1d"
    tokens = f"({ROUTE}:specdec_route_draft_tokens:rate1m * 60)"
    noise = f"{DROP_SIGMAS} * sqrt({base} * (1 - {base}) / {tokens})"
    expr = (
        f"({base} - {now})\n  > {DROP_FRACTION} * {base}\n  > {noise}\n"
        f"and on (route, model_name) {tokens} >= {MIN_DRAFT_TOKENS_1M}\n"
        f"and on (route, model_name) ({ROUTE}:specdec_route_requests:rate5m * 300) >= {MIN_REQUESTS_5M}"
    )
    return _alert(
        "SpecDecodeAcceptanceDrop",
        expr,
        "1m",
        "warning",
        "Draft acceptance of route {{ $labels.route }} dropped well below its usual level",
        "Acceptance of {{ $labels.route }} ({{ $labels.model_name }}) fell by {{ $value | humanizePercentage }} "
        "(absolute) against its 1-day level over the last minute. Tokens per step and the speedup "
        "fall with it; below break-even speculation costs more than it saves.",
    )


def alert_groups() -> list[dict[str, Any]]:
    rules = [  # SpecDecodeAcceptanceDrop lives with its recording rules (dashboards/rules.py)
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
