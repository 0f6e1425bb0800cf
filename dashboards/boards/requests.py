"""The request-level view: how sure each route's acceptance is, how it is spread over the
route's requests, which requests speculation made slower, how they ended; and "now" on the
windows SpecDecodeAcceptanceDrop reads, so a panel and the alert never disagree."""

from __future__ import annotations

from typing import Any

from dashboards.boards import variables as V
from dashboards.boards.panels import (
    COUNT,
    GREEN,
    ORANGE,
    PERCENT,
    RED,
    REQUESTS_PER_SECOND,
    by_name,
    by_ref,
    dashboard,
    dashed,
    fixed,
    heatmap,
    prop,
    stat,
    steps,
    table,
    timeseries,
)
from dashboards.config import Mixin
from dashboards.queries import panel_queries as Q
from exporter.core.stats import LOW_CONFIDENCE_REQUESTS

NAME = "requests"  # its uid: the mixin's prefix, then this


def now_stats(mix: Mixin) -> list[Any]:
    drop = mix.acceptance_drop
    (short, long), z = drop.windows, drop.z
    return [
        stat(
            f"Acceptance now ({short}, the alert's short window)",
            f"Exact acceptance (routes with vLLM's per-request objects) over the last {short}: "
            "the figure SpecDecodeAcceptanceDrop compares with the route's own day. Routes "
            "without per-request objects show their overall acceptance. Rule "
            f"route_model_name:specdec_route_exact_acceptance:ratio_rate{short}.",
            [("{{route}}", Q.acceptance_now(short))],
            PERCENT,
            decimals=1,
        ),
        stat(
            f"Acceptance over {long} (the alert's long window)",
            f"Exact acceptance over the last {long}, the window the alert uses for quiet routes. "
            f"Rule route_model_name:specdec_route_exact_acceptance:ratio_rate{long}.",
            [("{{route}}", Q.acceptance_now(long))],
            PERCENT,
            decimals=1,
        ),
        stat(
            f"Requests in the last {short} / {long}",
            f"Requests with drafts that ended in each window. Below {drop.min_requests} the alert "
            "does not judge that window: a few requests say little about a route.",
            [
                (f"{{{{route}}}} {short}", Q.exact_rule("spec_requests", "increase", short)),
                (f"{{{{route}}}} {long}", Q.exact_rule("spec_requests", "increase", long)),
            ],
            COUNT,
            decimals=0,
            graph=False,
        ),
        stat(
            "Drop against the day, in standard errors",
            f"(1-day acceptance - now) / the request-level standard error, {short} and {long}. "
            f"The alert fires above {z} (and at least {drop.fraction:.0%} below the day, "
            f"over at least {drop.min_requests} requests); negative: above the usual level.",
            [
                (f"{{{{route}}}} {w}", Q.exact_rule("acceptance_drop", "zscore_rate", w))
                for w in drop.windows
            ],
            COUNT,
            thresholds=steps(GREEN, (z / 2, ORANGE), (z, RED)),
            decimals=1,
            graph=False,
        ),
    ]


CONFIDENCE = [
    {
        "type": "value",
        "options": {
            "0": {"index": 0, "text": "ok"},
            "1": {"color": "orange", "index": 1, "text": "low confidence"},
        },
    }
]


def interval_table(mix: Mixin) -> Any:
    long = mix.acceptance_drop.windows[-1]
    columns = {
        "route": "Route",
        "model_name": "Model",
        "Value #A": f"Acceptance ({long})",
        "Value #B": "95 % low",
        "Value #C": "95 % high",
        "Value #D": "Requests",
        "Value #F": "Confidence",
        "Value #E": "Last 24 h",
    }
    percent = (f"Acceptance ({long})", "95 % low", "95 % high", "Last 24 h")
    return table(
        "Routes: acceptance with its 95 % interval",
        f"Per route over the last {long}: exact acceptance and its 95 % interval, Student's t "
        "of the window's effective requests times the request-level standard error (requests, "
        "not tokens, are the independent units, so a window of a few long requests gets the "
        "wide interval it deserves; no interval below 3 effective requests, 'low confidence' "
        f"below {LOW_CONFIDENCE_REQUESTS} requests). Two routes differ when their intervals do "
        "not overlap; the PromQL cookbook has the difference with its own standard error.",
        [
            ("", Q.exact_rule("exact_acceptance", "ratio_rate", long)),
            ("", Q.acceptance_band(long, "-")),
            ("", Q.acceptance_band(long, "+")),
            ("", Q.exact_rule("spec_requests", "increase", long)),
            ("", Q.exact_rule("exact_acceptance", "ratio_rate", "1d")),
            ("", Q.low_confidence(long)),
        ],
        columns=columns,
        sort_by="route",
        overrides=[
            *(by_name(name, prop("unit", PERCENT), prop("decimals", 1)) for name in percent),
            by_name("Requests", prop("unit", COUNT), prop("decimals", 0)),
            by_name("Confidence", prop("mappings", CONFIDENCE)),
        ],
    )


def per_route() -> list[tuple[int, list[Any]]]:
    band = timeseries(
        "Acceptance and its 95 % interval: $route",
        "Exact acceptance over 5-minute windows (solid) and its 95 % interval (shaded): "
        "Student's t of the window's effective requests times the request-level standard error. "
        "A narrow band: many requests, alike. A wide one: few requests, or requests that differ "
        "(a route mixing kinds of prompts). No band below 3 effective requests.",
        [
            ("{{route}}", Q.exact_rule("exact_acceptance", "ratio_rate", "5m")),
            ("95 % high", Q.acceptance_band("5m", "+")),
            ("95 % low", Q.acceptance_band("5m", "-")),
        ],
        PERCENT,
        min_value=0,
        max_value=1,
        repeat="route",
        overrides=[
            by_ref(
                "B",
                prop("custom.fillBelowTo", "95 % low"),
                prop("custom.fillOpacity", 20),
                prop("custom.lineWidth", 0),
            ),
            by_ref("C", prop("custom.lineWidth", 0)),
        ],
    )
    spread = heatmap(
        "Per-request acceptance: $route",
        "How acceptance is spread over the route's requests, over time: each column counts the "
        "requests that ended in that slice by their own acceptance. A band near 0 on a route "
        "that is normally high: garbled output or a draft/target mismatch; a band at 1 with "
        "requests cut by max_tokens: repetition loops. Each dot is one request of its bucket "
        "(the lowest and slowest of its minute): click it for its trace or its request log "
        "line (docs/operations.md).",
        Q.acceptance_heatmap(),
        PERCENT,
        repeat="route",
        exemplar=True,
    )
    return [(9, [band]), (9, [spread])]


def outcomes(mix: Mixin) -> list[Any]:
    window = mix.runaway.window
    slower = timeseries(
        "Requests speculation made slower",
        "Share of each route's requests whose own tokens per step were below the model's "
        "step_cost_ratio: for them a verify step cost more than it produced (models with a "
        "config only). A route can pay on average and still slow down a share of its requests.",
        [("{{route}}", Q.below_breakeven_share())],
        PERCENT,
        min_value=0,
        max_value=1,
    )
    finish = timeseries(
        "How requests ended, by route",
        "Completion requests per second by finish_reason: stop, length (cut by max_tokens), "
        "tool_calls, abort (the client hung up) and other. A rise of `length` with acceptance "
        "near 1 is the signature of repetition loops.",
        [("{{route}} {{finish_reason}}", Q.finish_reasons())],
        REQUESTS_PER_SECOND,
        min_value=0,
        stack=True,
    )
    anomalies = timeseries(
        f"Runaway and collapsed requests ({window})",
        f"Per route over {window}: the share of requests cut by max_tokens at "
        "acceptance near 1 (repetition loops, solid) and of requests with acceptance <= 5 % "
        "(dashed). Alerts SpecDecodeRunawayGenerations and SpecDecodeAcceptanceCollapsed.",
        [
            ("runaway {{route}}", Q.exact_rule("runaway_requests", "share_rate", window)),
            (
                "collapsed {{route}}",
                Q.exact_rule("collapsed_requests", "share_rate", window),
            ),
        ],
        PERCENT,
        min_value=0,
        max_value=1,
        overrides=[by_ref("B", dashed(), fixed(RED))],
    )
    return [slower, finish, anomalies]


def build(mix: Mixin) -> Any:
    return dashboard(
        mix.uid(NAME),
        "specdec / Requests",
        "Per route, from the requests themselves: how sure the acceptance figure is, how it is "
        "spread over requests, which requests speculation made slower and how they ended.",
        [V.datasource(mix.dashboards.datasource), V.job(), V.route_model(), V.route()],
        [(5, now_stats(mix)), (7, [interval_table(mix)]), *per_route(), (8, outcomes(mix))],
        mix.dashboards.tags,
    )
