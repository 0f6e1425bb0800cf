"""Exporter health: can the figures on the other dashboards be trusted right now?"""

from __future__ import annotations

from typing import Any

from dashboards.boards import variables as V
from dashboards.boards.panels import (
    BLUE,
    BYTES,
    COUNT,
    GREEN,
    ORANGE,
    PER_SECOND,
    PERCENT,
    RED,
    REQUESTS_PER_SECOND,
    SECONDS,
    TRANSPARENT,
    UP_DOWN,
    by_ref,
    dashboard,
    dashed,
    fixed,
    stat,
    steps,
    timeseries,
    up_mappings,
)
from dashboards.config import Mixin
from dashboards.queries import panel_queries as Q

NAME = "health"  # its uid: the mixin's prefix, then this
NO_SIDECAR = "No sidecar scraped"


def stats(mix: Mixin) -> list[Any]:
    coverage_min = mix.coverage_min
    return [
        stat(
            "Sidecars up (Prometheus)",
            "Prometheus' own `up` for each sidecar it scrapes: DOWN means no specdec metric and no "
            "alert works for it (SpecDecodeExporterDown).",
            [("{{instance}}", Q.sidecar_up())],
            COUNT,
            thresholds=UP_DOWN,
            mappings=up_mappings(),
            graph=False,
            no_value=NO_SIDECAR,
        ),
        stat(
            "vLLM targets up (sidecar)",
            "Whether each sidecar's last scrape of its vLLM target got a page "
            "(specdec_target_up). DOWN: down, slow or an HTTP error; see 'Scrape errors'.",
            [("{{target}}", Q.target_up())],
            COUNT,
            thresholds=UP_DOWN,
            mappings=up_mappings(),
            graph=False,
            no_value=NO_SIDECAR,
        ),
        stat(
            "Attribution coverage (15m)",
            "Drafts the proxy accounted to routes / the engine's drafts over 15 minutes. Below "
            f"{coverage_min:.0%} (red) some clients bypass the proxy and per-route figures miss "
            "their traffic (SpecDecodeAttributionCoverageLow).",
            [("{{target}}", Q.coverage("15m"))],
            PERCENT,
            thresholds=steps(RED, (coverage_min, GREEN)),
            decimals=1,
        ),
        stat(
            "Sidecar versions",
            "Running specdec versions and how many sidecars run each (specdec_build_info).",
            [("{{version}}", Q.build_versions())],
            COUNT,
            thresholds=steps(BLUE),
            decimals=0,
            graph=False,
            no_value=NO_SIDECAR,
        ),
    ]


def panels(mix: Mixin) -> list[tuple[int, list[Any]]]:
    coverage_min = mix.coverage_min
    durations = timeseries(
        "Scrape durations",
        "Solid: the sidecar's last scrape of each vLLM target (fetch + parse; the target timeout "
        "defaults to 2 s). Dashed: Prometheus' scrape of the sidecar. Rising durations come "
        "before timeouts.",
        [
            ("sidecar -> {{target}}", Q.sidecar_scrape_duration()),
            ("Prometheus -> {{instance}}", Q.prometheus_scrape_duration()),
        ],
        SECONDS,
        min_value=0,
        overrides=[by_ref("B", dashed())],
        no_value=NO_SIDECAR,
    )
    errors = timeseries(
        "Scrape errors",
        "Failed scrapes of vLLM per second by target and reason (timeout, connection, "
        "http_status, protocol, too_large, no_spec_metrics), and malformed spec-decode lines "
        "skipped (dashed). Flat at 0 is healthy; no_spec_metrics means vLLM runs without "
        "--speculative-config or the engine/prefix setting is wrong.",
        [
            ("{{target}} {{reason}}", Q.scrape_errors()),
            ("{{target}} malformed lines", Q.malformed_lines()),
        ],
        PER_SECOND,
        min_value=0,
        overrides=[by_ref("B", dashed())],
        no_value=NO_SIDECAR,
    )
    coverage = timeseries(
        "Attribution coverage",
        "Drafts accounted to routes / the engine's drafts, over 1 minute (solid) and 15 "
        f"minutes (dashed). The red line is the alert threshold ({coverage_min:.0%}); short "
        "dips happen while long requests are still running, and short peaks a little above "
        "100 % after them: the proxy counts a request's drafts when it ends, the engine as its "
        "steps run, so a window can hold drafts the engine counted before it began.",
        [
            ("{{target}} 1m", Q.coverage("1m")),
            ("{{target}} 15m", Q.coverage("15m")),
        ],
        PERCENT,
        min_value=0,
        thresholds=steps(TRANSPARENT, (coverage_min, RED)),
        threshold_style="dashed",
        overrides=[by_ref("B", dashed())],
    )
    proxy = timeseries(
        "Proxy errors",
        "Upstream failures per second by reason: connection (clients got 502), timeout (504), "
        "broken (the response was cut mid-way); and requests the proxy refused (absolute URI, "
        "CONNECT, too large; dashed). Flat at 0 is healthy.",
        [
            ("upstream {{reason}}", Q.proxy_upstream_errors()),
            ("refused", Q.proxy_refused()),
        ],
        PER_SECOND,
        min_value=0,
        overrides=[by_ref("B", dashed(), fixed(ORANGE))],
        no_value=NO_SIDECAR,
    )
    statuses = timeseries(
        "Proxy responses by status",
        "Completion requests per second through the proxy by HTTP status, all routes. 499: "
        "clients hanging up (the proxy cancels upstream); 502/504: vLLM unreachable or slow.",
        [("{{status}}", Q.proxy_responses_by_status())],
        REQUESTS_PER_SECOND,
        min_value=0,
        overrides=[
            {"matcher": {"id": "byRegexp", "options": "^(499|5..)$"}, "properties": [fixed(RED)]}
        ],
    )
    cpu = timeseries(
        "Sidecar CPU",
        "CPU of each sidecar process in cores (100 % = one core). The scrape path costs well "
        "under 1 % of a core at a 1 s interval; the proxy adds with traffic.",
        [("{{instance}}", Q.sidecar_cpu())],
        PERCENT,
        min_value=0,
        no_value=NO_SIDECAR,
    )
    memory = timeseries(
        "Sidecar memory",
        "Resident memory of each sidecar process. Steady growth under steady traffic points "
        "at a leak.",
        [("{{instance}}", Q.sidecar_memory())],
        BYTES,
        min_value=0,
        no_value=NO_SIDECAR,
    )
    fds = timeseries(
        "Sidecar file descriptors",
        "Open file descriptors of each sidecar process: about two per connection in flight "
        "through the proxy, plus its listeners and the scrape clients. Growth without traffic "
        "points at leaked connections.",
        [("{{instance}}", Q.sidecar_fds())],
        COUNT,
        min_value=0,
        decimals=0,
        no_value=NO_SIDECAR,
    )
    return [
        (8, [durations, errors]),
        (8, [coverage, proxy]),
        (8, [statuses, cpu, memory, fds]),
    ]


def build(mix: Mixin) -> Any:
    return dashboard(
        mix.uid(NAME),
        "specdec / Exporter health",
        "Is the specdec sidecar scraping vLLM, is the proxy seeing the traffic, and is the "
        "sidecar itself healthy? Check here before trusting the payoff figures.",
        [V.datasource(mix.dashboards.datasource), V.job()],
        [(5, stats(mix)), *panels(mix)],
        mix.dashboards.tags,
    )
