"""The engine view: speculation per model_name and engine from vLLM's own counters (through the
sidecar), the draft token flow, latency and load, and decode against the bandwidth roofline."""

from __future__ import annotations

from typing import Any

from dashboards.boards import variables as V
from dashboards.boards.panels import (
    BLUE,
    COUNT,
    GREEN,
    ORANGE,
    PERCENT,
    RED,
    SECONDS,
    SPEEDUP,
    TIMES,
    TOKENS_PER_SECOND,
    TOKENS_PER_STEP,
    TRANSPARENT,
    YELLOW,
    bargauge,
    by_ref,
    dashboard,
    dashed,
    fixed,
    reference_line,
    stat,
    steps,
    timeseries,
    tokens_per_step,
)
from dashboards.config import Mixin
from dashboards.queries import panel_queries as Q

NAME = "engine"  # its uid: the mixin's prefix, then this
LEGEND = "{{model_name}} engine {{engine}}"

ACCEPTANCE_5M = Q.engine_rule("acceptance", "ratio_rate5m")
TOKENS_PER_STEP_5M = Q.engine_rule("tokens_per_step", "ratio_rate5m")
SPEEDUP_5M = Q.engine_rule("estimated_speedup", "ratio_rate5m")
POSITION_5M = Q.engine_rule("position_acceptance", "ratio_rate5m", per_position=True)
REJECTED_5M = Q.engine_rule("rejected_draft_tokens", "rate5m")


def stats() -> list[Any]:
    return [
        stat(
            "Acceptance now",
            "Accepted / proposed draft tokens per model and engine over the last 5 minutes, all "
            "traffic (through the proxy or not). Rule model_name_engine:specdec_acceptance:ratio_rate5m.",
            [(LEGEND, ACCEPTANCE_5M)],
            PERCENT,
            decimals=1,
        ),
        stat(
            "Tokens per step now",
            "1 + accepted drafts per verify step over the last 5 minutes (vLLM's mean acceptance "
            "length). Rule model_name_engine:specdec_tokens_per_step:ratio_rate5m.",
            [(LEGEND, TOKENS_PER_STEP_5M)],
            TOKENS_PER_STEP,
            decimals=2,
        ),
        stat(
            "Estimated speedup now",
            "Tokens per step / the model's step_cost_ratio: red below 1x, where speculation costs "
            "more than it saves. Rule model_name_engine:specdec_estimated_speedup:ratio_rate5m.",
            [(LEGEND, SPEEDUP_5M)],
            TIMES,
            thresholds=SPEEDUP,
            decimals=2,
        ),
        stat(
            "Requests running / waiting",
            "vLLM's scheduler now: requests in the running batch and queued. Waiting above 0 for "
            "long means the engine is saturated; speculation then competes with batching.",
            [
                ("running " + LEGEND, Q.vllm_gauge("num_requests_running")),
                ("waiting " + LEGEND, Q.vllm_gauge("num_requests_waiting")),
            ],
            COUNT,
            thresholds=steps(BLUE),
            decimals=0,
        ),
    ]


def panels() -> list[tuple[int, list[Any]]]:
    acceptance = timeseries(
        "Draft acceptance per model and engine",
        "Accepted / proposed draft tokens over 5-minute windows, per model_name and engine "
        "(data-parallel rank). The dashed red line is the model's break-even acceptance: below "
        "it speculation loses. Engines of one model should track each other; one that does not "
        "serves a different traffic mix.",
        [(LEGEND, ACCEPTANCE_5M), ("break-even ({{model_name}})", Q.breakeven())],
        PERCENT,
        min_value=0,
        max_value=1,
        overrides=[reference_line("B")],
    )
    positions = bargauge(
        "Acceptance by draft position",
        "Share of verify steps that accepted more than `position` drafts, last 5 minutes "
        "(P(accepted > position), not conditional). Falls with position; a steep drop after "
        "position 0 says a smaller k would waste less verify work.",
        [("{{model_name}} engine {{engine}}, position {{position}}", POSITION_5M)],
        PERCENT,
        max_value=1,
        thresholds=steps(RED, (0.25, ORANGE), (0.5, YELLOW), (0.75, GREEN)),
    )
    flow = timeseries(
        "Draft token flow",
        "Draft tokens per second: proposed (blue) = accepted (green) + rejected (red). Raw "
        "counters over $__rate_interval. The rejected part is verify work thrown away.",
        [
            ("proposed " + LEGEND, Q.engine_flow("draft_tokens")),
            ("accepted " + LEGEND, Q.engine_flow("accepted_tokens")),
            ("rejected " + LEGEND, Q.engine_flow("rejected_draft_tokens")),
        ],
        TOKENS_PER_SECOND,
        min_value=0,
        overrides=[by_ref("A", fixed(BLUE)), by_ref("B", fixed(GREEN)), by_ref("C", fixed(RED))],
    )
    waste = timeseries(
        "Waste: rejected draft tokens",
        "Draft tokens per second the target model verified and threw away (5-minute windows): "
        "the compute speculation costs without a return. Compare with 'Draft token flow'. "
        "Rule model_name_engine:specdec_rejected_draft_tokens:rate5m.",
        [(LEGEND, REJECTED_5M)],
        TOKENS_PER_SECOND,
        min_value=0,
        overrides=[by_ref("A", fixed(RED))],
    )
    itl = timeseries(
        "Inter-token latency",
        "vLLM's inter-token latency, p50 (solid) and p95 (dashed), from the engine's own "
        "histogram. With speculation tokens arrive in bursts of up to k+1 per step, so p50 can "
        "be far below p95.",
        [
            ("p50 " + LEGEND, Q.vllm_quantile(0.5, "inter_token_latency_seconds")),
            ("p95 " + LEGEND, Q.vllm_quantile(0.95, "inter_token_latency_seconds")),
        ],
        SECONDS,
        min_value=0,
        overrides=[by_ref("B", dashed())],
    )
    load = timeseries(
        "Requests running and waiting",
        "vLLM's running batch (solid) and queue (dashed). A growing queue means the engine is "
        "saturated: per-request decode slows whatever the acceptance.",
        [
            ("running " + LEGEND, Q.vllm_gauge("num_requests_running")),
            ("waiting " + LEGEND, Q.vllm_gauge("num_requests_waiting")),
        ],
        COUNT,
        min_value=0,
        decimals=0,
        overrides=[by_ref("B", dashed())],
    )
    ceiling = timeseries(
        "Decode vs the bandwidth ceiling",
        "Per-request decode rate through the proxy / the model's plain-decode roofline "
        "(memory bandwidth / bytes per token, from the sidecar's models config). Plain decoding "
        "cannot pass 100 %; speculation can, by the tokens each step adds. Empty without "
        "bytes_per_token and memory_bandwidth_bytes_per_second in the config.",
        [("{{model_name}}", Q.ceiling_utilization())],
        PERCENT,
        min_value=0,
        thresholds=steps(TRANSPARENT, (1.0, BLUE)),
        threshold_style="dashed",
        no_value="No roofline in the models config, or no traffic",
    )
    tokens = tokens_per_step(
        "1 + accepted drafts per verify step per engine (5-minute windows); the dashed line is "
        "k + 1, every draft accepted. Restarts of the engine (counters reset) are absorbed by "
        "the sidecar's restart-safe counters.",
        (LEGEND, TOKENS_PER_STEP_5M),
        ("ceiling k+1 ({{model_name}})", Q.tokens_per_step_ceiling()),
    )
    restarts = stat(
        "Engine restarts in range",
        "Engine restarts the sidecar detected (a counter went down or its _created stamp "
        "changed) over the dashboard's time range. Acceptance figures stay right across them.",
        [(LEGEND, Q.engine_restarts())],
        COUNT,
        thresholds=steps(GREEN, (1, ORANGE)),
        decimals=0,
        graph=False,
        no_value="No engine",
    )
    return [
        (9, [acceptance, positions]),
        (9, [flow, waste]),
        (8, [itl, load]),
        (8, [(ceiling, 10), (tokens, 10), (restarts, 4)]),
    ]


def build(mix: Mixin) -> Any:
    return dashboard(
        mix.uid(NAME),
        "specdec / Engine",
        "Speculative decoding per model and engine from vLLM's counters: acceptance by "
        "position, draft token flow and waste, latency, load and the decode roofline.",
        [V.datasource(mix.dashboards.datasource), V.job(), V.engine_model(), V.engine()],
        [(5, stats()), *panels()],
        mix.dashboards.tags,
    )
