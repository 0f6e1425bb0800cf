"""The headline dashboard: is speculation paying off for each route (voice chat, agent, ...),
and since when did that change?"""

from __future__ import annotations

from typing import Any

from dashboards.boards import variables as V
from dashboards.boards.panels import (
    COUNT,
    DRAFTS_PER_TOKEN,
    GREEN,
    ORANGE,
    PERCENT,
    PERCENTAGE_POINTS,
    RED,
    REQUESTS_PER_SECOND,
    SECONDS,
    SPEEDUP,
    TIMES,
    TOKENS_PER_SECOND,
    TOKENS_PER_STEP,
    by_name,
    by_ref,
    dashboard,
    dashed,
    fixed,
    prop,
    reference_line,
    stat,
    steps,
    table,
    timeseries,
    tokens_per_step,
)
from dashboards.config import Mixin
from dashboards.queries import panel_queries as Q
from dashboards.queries import slices

NAME = "payoff"  # its uid: the mixin's prefix, then this
ROUTE_LEGEND = "{{route}} ({{model_name}})"

# the parts of a change that moved (none on steady traffic: tests/integration/test_demo_drop.py
# draws them on a drop)
SPLIT_TITLE = "Acceptance change: traffic mix (dashed) and within bands"
ACCEPTANCE_5M = Q.route_rule("acceptance", "ratio_rate5m")
TOKENS_PER_STEP_5M = Q.route_rule("tokens_per_step", "ratio_rate5m")
SPEEDUP_5M = Q.route_rule("estimated_speedup", "ratio_rate5m")
MEASURED_5M = Q.route_rule("speedup", "ratio_rate5m")
DECODE_5M = Q.route_rule("decode_tokens_per_second", "ratio_rate5m")


def headline_stats(mix: Mixin) -> list[Any]:
    alert_window = mix.acceptance_drop.windows[0]
    return [
        stat(
            "Estimated speedup now",
            "The speedup at the load the engine runs, over the last 5 minutes: tokens per step x a "
            "plain step's seconds at the batch the requests saw (the model's step-time curve, "
            "specdec measure --concurrency) / the route's seconds per step. Without a curve: "
            "tokens per step / step_cost_ratio (batch 1). Red below 1x: speculation costs more "
            "than it saves. Rule route_model_name:specdec_route_estimated_speedup:ratio_rate5m.",
            [("{{route}}", SPEEDUP_5M)],
            TIMES,
            thresholds=SPEEDUP,
            decimals=2,
        ),
        stat(
            f"Draft acceptance now ({alert_window})",
            "Share of proposed draft tokens the target model accepted over the last minute, per "
            "route: the window SpecDecodeAcceptanceDrop reads for busy routes (exact per-request "
            "counts where the route has them). Compare with the break-even line in 'Draft "
            "acceptance by route' below: under it speculation loses. Rule "
            f"route_model_name:specdec_route_exact_acceptance:ratio_rate{alert_window}.",
            [("{{route}}", Q.acceptance_now(alert_window))],
            PERCENT,
            decimals=1,
        ),
        stat(
            "Tokens per step now",
            "Tokens each verify step produced over the last 5 minutes: 1 + accepted drafts per "
            "step (the bonus token included). 1 means no draft was ever accepted; k + 1 is the "
            "ceiling. Rule route_model_name:specdec_route_tokens_per_step:ratio_rate5m.",
            [("{{route}}", TOKENS_PER_STEP_5M)],
            TOKENS_PER_STEP,
            decimals=2,
        ),
        stat(
            "Measured decode rate now",
            "Completion tokens per second of a streamed request after its first token, per route, "
            "over the last 5 minutes: what a user of the route sees. Rule "
            "route_model_name:specdec_route_decode_tokens_per_second:ratio_rate5m.",
            [("{{route}}", DECODE_5M)],
            TOKENS_PER_SECOND,
            decimals=0,
        ),
    ]


def route_table() -> Any:
    columns = {
        "route": "Route",
        "model_name": "Model",
        "Value #A": "Acceptance now (5m)",
        "Value #B": "Same hour yesterday",
        "Value #C": "Change",
        "Value #D": "Last 24 h",
        "Value #E": "Est. speedup now",
        "Value #F": "Requests/s",
    }
    percent = ("Acceptance now (5m)", "Same hour yesterday", "Last 24 h")
    return table(
        "Routes: acceptance now vs one day ago",
        "One row per route and model. 'Same hour yesterday' is the 1-hour acceptance one day ago "
        "(empty until the route has a day of history); 'Change' is now minus that, in "
        "percentage points (red: dropped by more than 5 points). 'Last 24 h' is the day-long "
        "level the SpecDecodeAcceptanceDrop alert compares against. All from recording rules.",
        [
            ("", ACCEPTANCE_5M),
            ("", Q.route_acceptance_yesterday()),
            ("", Q.route_acceptance_change()),
            ("", Q.route_rule("acceptance", "ratio_rate1d")),
            ("", SPEEDUP_5M),
            ("", Q.route_rule("requests", "rate5m")),
        ],
        columns=columns,
        sort_by="route",
        overrides=[
            *(by_name(name, prop("unit", PERCENT), prop("decimals", 1)) for name in percent),
            by_name(
                "Change",
                prop("unit", PERCENT),
                prop("decimals", 1),
                prop("custom.displayMode", "color-text"),
                prop("thresholds", {"mode": "absolute", "steps": steps(RED, (-0.05, GREEN))}),
            ),
            by_name(
                "Est. speedup now",
                prop("unit", TIMES),
                prop("decimals", 2),
                prop("custom.displayMode", "color-text"),
                prop("thresholds", {"mode": "absolute", "steps": SPEEDUP}),
            ),
            by_name("Requests/s", prop("unit", REQUESTS_PER_SECOND), prop("decimals", 2)),
        ],
    )


def trends(mix: Mixin) -> list[tuple[int, list[Any]]]:
    acceptance = timeseries(
        "Draft acceptance by route",
        "Accepted / proposed draft tokens per route over 5-minute windows, side by side. The "
        "dashed red line is the model's break-even acceptance, (step_cost_ratio - 1) / k: a route "
        "below it loses time to speculation. A step down marks when a workload changed (new "
        "prompts, language, model or drafter); alerts show as red regions.",
        [
            (ROUTE_LEGEND, ACCEPTANCE_5M),
            ("break-even ({{model_name}})", Q.breakeven()),
        ],
        PERCENT,
        min_value=0,
        max_value=1,
        overrides=[reference_line("B")],
    )
    tokens = tokens_per_step(
        "Tokens produced per verify step (1 + accepted drafts per step) per route, 5-minute "
        "windows. The dashed line is the ceiling k + 1, reached only when every draft is "
        "accepted. The gap to it is what the drafter leaves on the table for that workload.",
        (ROUTE_LEGEND, TOKENS_PER_STEP_5M),
        ("ceiling k+1 ({{model_name}})", Q.tokens_per_step_ceiling()),
    )
    speedup = timeseries(
        "Speedup: estimated and measured",
        "Both at the load the engine runs (a plain step's seconds at the batch the requests saw, "
        "from the model's step-time curve). Solid: estimated, tokens per step x plain / the "
        "route's seconds per step, over its requests with exact counts. Dashed: measured, the "
        "decode rate of all its streamed requests x the plain step. Over the same requests the "
        "two are one number; they part when the route also has requests without exact counts. "
        "Below the red 1x line speculation costs more than it saves; SpecDecodeCostlyAtLoad "
        "fires when even the interval's upper end stays below 1x for 10 minutes.",
        [
            ("estimated " + ROUTE_LEGEND, SPEEDUP_5M),
            ("measured " + ROUTE_LEGEND, MEASURED_5M),
            ("break-even 1x ({{model_name}})", Q.speedup_breakeven()),
        ],
        TIMES,
        decimals=2,
        overrides=[by_ref("B", dashed()), reference_line("C")],
    )
    decode = timeseries(
        "Measured decode rate by route",
        "Completion tokens per second after the first token, per streamed request, per route "
        "(5-minute windows): the speed a user of the route sees. Falls with acceptance, and "
        "with load on the shared engine.",
        [(ROUTE_LEGEND, DECODE_5M)],
        TOKENS_PER_SECOND,
        min_value=0,
        decimals=0,
    )
    ttft = timeseries(
        "Time to first token by route",
        "Request in to first content token out, streamed requests, p50 (solid) and p95 "
        "(dashed). Speculation does not speed up the first token; a rise here with steady "
        "acceptance points at queueing on the engine.",
        [
            ("p50 " + ROUTE_LEGEND, Q.route_ttft(0.5)),
            ("p95 " + ROUTE_LEGEND, Q.route_ttft(0.95)),
        ],
        SECONDS,
        min_value=0,
        overrides=[by_ref("B", dashed())],
    )
    requests = timeseries(
        "Requests by route and status",
        "Completion requests per second through the proxy by route and HTTP status. 499: the "
        "client hung up; 502/504: vLLM unreachable or timed out. Low traffic makes the ratios "
        f"above noisy; the alerts ignore routes with fewer than {mix.min_requests_5m} requests in 5 "
        "minutes.",
        [("{{route}} {{status}}", Q.route_requests_by_status())],
        REQUESTS_PER_SECOND,
        min_value=0,
        overrides=[
            {
                "matcher": {"id": "byRegexp", "options": ".* (499|5..)$"},
                "properties": [fixed(RED)],
            }
        ],
    )
    lengths = table(
        "Speedup by draft length at this load",
        "What each draft length k' would pay the route at the batch it runs now (5 minutes): "
        "1 + its per-position acceptance summed below k', x a plain step / a step linear in k' "
        "between plain (k' = 0: speculation off, 1x) and the observed one at the configured k. "
        "'±' is the 95 % half-width from the acceptance interval. The highest row is the best "
        "draft length; specdec_route_best_draft_length states it once it beats the runner-up "
        "by more than their half-widths. `specdec advise` prints a batch-size schedule from it.",
        [
            ("", Q.route_speedup_at_draft_length()),
            ("", Q.route_speedup_at_draft_length("ci_halfwidth")),
        ],
        columns={
            "route": "Route",
            "model_name": "Model",
            "draft_length": "Draft length",
            "Value #A": "Speedup at this load",
            "Value #B": "± (95 %)",
        },
        hide=("Time", "window", "job", "instance", "__name__"),
        sort_by="route",
        overrides=[
            by_name(
                "Speedup at this load",
                prop("unit", TIMES),
                prop("decimals", 2),
                prop("custom.displayMode", "color-text"),
                prop("thresholds", {"mode": "absolute", "steps": SPEEDUP}),
            ),
            by_name("± (95 %)", prop("unit", TIMES), prop("decimals", 2)),
        ],
    )
    in_effect = timeseries(
        "Draft length in effect",
        "Draft tokens per decode step per route (a step without drafts counts 0), from "
        "specdec_route_steps_total: under a dynamic schedule (vLLM's "
        "num_speculative_tokens_per_batch_size, as specdec advise prints it) it moves with the "
        "batch. Dashed: the k the model's configured draft_length_schedule gives at the "
        "engine's batch now. Where the two part, the engine is not running the schedule the "
        "config says (SpecDecodeScheduleNotInEffect fires where the schedule says 0).",
        [
            (ROUTE_LEGEND, Q.route_draft_length_in_effect()),
            ("schedule's k ({{model_name}})", Q.scheduled_draft_length()),
        ],
        COUNT,
        min_value=0,
        decimals=2,
        overrides=[by_ref("B", dashed())],
    )
    return [
        (9, [acceptance, tokens]),
        (9, [speedup, decode]),
        (9, [lengths, speedup_by_batch()]),
        (8, [in_effect, ttft]),
        (8, [requests]),
    ]


BATCHES = (1, 4, 8, 16, 32, 64)


def speedup_by_batch() -> Any:
    """The speedup-vs-batch view: one row per route, a column per running-request count."""
    columns = {
        "route": "Route",
        "model_name": "Model",
        "Value #A": "Running now",
        **{f"Value #{chr(ord('B') + i)}": f"at {b}" for i, b in enumerate(BATCHES)},
    }
    at = tuple(f"at {b}" for b in BATCHES)
    return table(
        "Speedup by running requests (the step-time curve)",
        "Each route's load-aware speedup now (5 minutes), moved along the model's step-time "
        "line (its `models:` step_time, from specdec measure --concurrency) to other batch "
        "sizes: x (plain / verify step at that batch) / (plain / verify step at the batch now). "
        "'Running now' is the batch the engine's requests saw: the current operating point; "
        "its column equals the estimate. A column past the largest batch the curve was measured "
        "at stays empty (measure --concurrency higher to fill it). Assumes the route's steps "
        "grow with the batch as the model's verify steps do and its acceptance stays as it is.",
        [
            ("", Q.route_batch_now()),
            *(("", Q.route_speedup_at_batch(b)) for b in BATCHES),
        ],
        columns=columns,
        sort_by="route",
        overrides=[
            by_name("Running now", prop("decimals", 1)),
            *(
                by_name(
                    name,
                    prop("unit", TIMES),
                    prop("decimals", 2),
                    prop("custom.displayMode", "color-text"),
                    prop("thresholds", {"mode": "absolute", "steps": SPEEDUP}),
                )
                for name in at
            ),
        ],
    )


def why_it_moved(mix: Mixin) -> list[tuple[int, list[Any]]]:
    """Why acceptance moved: first which route moved, and whether its traffic or its engine did
    (along which dimension), then the parts over time (only those that moved), and each band's
    share of draft tokens, acceptance and draft rate. Every panel from the route's first full
    window on, as the rest of the board."""
    w, b, least = mix.breakdown.window, mix.breakdown.baseline, mix.breakdown.min_part
    band = "{{route}} {{dimension}}={{band}}"
    points = f"{100 * least:g} pp"
    cause = stat(
        f"Why acceptance moved: the last {w} against the $baseline ${{baseline:text}} before it",
        f"Per route, what moved its exact acceptance over the last {w} against the baseline "
        f"that ends where the window begins (up to {b}; the title says how much history it "
        "holds), in percentage points: 'traffic mix along DIMENSION' where the requests moved "
        "between that dimension's bands (a client began sending temperature 1, tools or long "
        "prompts: find the client), 'the engine (within bands)' where requests like the "
        "baseline's accept less (the engine, model or drafter changed: roll back or check the "
        f"drafter), 'steady' where the larger part is under {points}. The dimension is the one "
        "whose traffic move explains the most; SpecDecodeAcceptanceDrop's labels `cause` and "
        f"`dimension` name the same. Rule {slices.cause_rule(w, b)}.",
        [("{{route}}: {{cause}}", Q.acceptance_cause(w, b, least))],
        PERCENTAGE_POINTS,
        thresholds=steps(RED, (-5.0, ORANGE), (-100 * least, GREEN)),
        decimals=1,
        instant=True,
    )
    split = timeseries(
        SPLIT_TITLE,
        f"The change of the route's exact acceptance over the last {w} against the {b} "
        "before it, in percentage points, split in two that add up to it: mix (dashed), per "
        "dimension the route's traffic moved along, the move between the dimension's bands "
        "with each band accepting as in the baseline; within (solid), the bands' own acceptance "
        "moved, along the dimension whose traffic move explains the most (on any other it also "
        f"holds that move). Parts under {points} are not drawn: a dimension of one band moves "
        "no traffic.",
        [
            ("{{route}} mix along {{dimension}}", Q.acceptance_mix(w, b, least)),
            ("{{route}} within bands", Q.acceptance_within(w, b, least)),
        ],
        PERCENTAGE_POINTS,
        decimals=1,
        overrides=[by_ref("A", dashed())],
        no_value=f"No part of {points} or more yet",
    )
    share = timeseries(
        "Share of draft tokens by band",
        f"Each band's share of its dimension's draft tokens over {w} windows: where a route's "
        "traffic moved. The axis ends above 100 %, so a band that holds all of it is a line "
        "below the panel's edge. Only requests with exact counts are sliced (the proxy read the "
        "engine's own per-request figures).",
        [(band, Q.band_figure("share", w))],
        PERCENT,
        min_value=0,
        defaults={"max": 1.1},
    )
    acceptance = timeseries(
        "Acceptance by band",
        f"Accepted / proposed draft tokens per band over {w} windows: a band whose line "
        "falls while its share holds is the engine's doing. A band that drafted nothing has "
        "no line here (no acceptance to show): its draft rate says so.",
        [(band, Q.band_figure("acceptance", w))],
        PERCENT,
        min_value=0,
        max_value=1,
    )
    draft_rate = timeseries(
        "Draft rate by band",
        "Draft tokens per completion token per band (not per step): 0 is a band that drafts "
        "nothing, speculation off for that traffic (an n-gram drafter with sampled requests, "
        "say), not zero acceptance.",
        [(band, Q.band_draft_rate())],
        DRAFTS_PER_TOKEN,
        min_value=0,
        decimals=2,
    )
    return [(5, [cause]), (9, [split, share]), (8, [acceptance, draft_rate])]


def build(mix: Mixin) -> Any:
    return dashboard(
        mix.uid(NAME),
        "specdec / Payoff by route",
        "Is speculative decoding paying off for each workload? Per-route acceptance, tokens per "
        "step, speedup against break-even, what users see (decode rate, TTFT), and why "
        "acceptance moved (traffic mix or the engine).",
        [
            V.datasource(mix.dashboards.datasource),
            V.job(),
            V.route_model(),
            V.route(),
            V.baseline_span(Q.baseline_span()),
        ],
        [
            (5, headline_stats(mix)),
            (7, [route_table()]),
            *trends(mix),
            *why_it_moved(mix),
        ],
        mix.dashboards.tags,
    )
