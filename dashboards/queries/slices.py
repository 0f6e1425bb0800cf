"""A route's acceptance change split into traffic mix and within-band parts, as PromQL from
the slice counters (exporter/core/slices.py has the same split in Python: the sidecar's
`specdec_route_acceptance_change_ratio`).

Per band b of a dimension, over a window: acc_b = accepted / draft tokens (none where the band
drafted nothing) and share_b = its draft tokens / the dimension's. Then, W the window and B the
baseline, the B that ends where W begins (a drop inside W is not also in what it is compared
with; until the counters are B + W old, what they hold of it):

    mix    = sum_b (share_W,b - share_B,b) * acc_B,b     (acc_B,b := acc_W,b for a band new in W)
    within = sum_b share_W,b * (acc_W,b - acc_B,b)

Rates summed over replicas first, then divided, as every ratio here. `cause` picks each route's
largest part, the one the dashboards' first panel and the drop alert's labels name.
"""

from __future__ import annotations

from dashboards.queries.labels import ROUTE
from dashboards.queries.promql import ratio
from exporter.core.durations import parse_duration

DIMENSION = (*ROUTE, "dimension")
BAND = (*DIMENSION, "band")
LEVEL = "route_model_name_dimension_band"
PART_LEVEL = "route_model_name_dimension_part"
SPAN = "route_model_name:specdec_route_slice_baseline:span_seconds"


def band_rule(figure: str, window: str) -> str:
    """A band's recorded figure, e.g. band_rule("acceptance", "10m")."""
    return f"{LEVEL}:specdec_route_slice_{figure}:ratio_rate{window}"


def baseline_rule(figure: str, window: str, baseline: str) -> str:
    """A band's recorded figure over the baseline that ends where `window` begins."""
    return band_rule(figure, f"{baseline}_offset{window}")


def change_rule(window: str, baseline: str) -> str:
    """The recorded change parts (label `part`: mix, within)."""
    return f"{PART_LEVEL}:specdec_route_acceptance_change:ratio_{window}_{baseline}"


def _sum_rate(metric: str, window: str, labels: tuple[str, ...], offset: str) -> str:
    shifted = f" offset {offset}" if offset else ""
    return f"sum by ({', '.join(labels)}) (rate({metric}[{window}]{shifted}))"


def band_acceptance(window: str, offset: str = "") -> str:
    """Over `window`, ending `offset` ago (the baseline's: ending where the window begins)."""
    return ratio(
        _sum_rate("specdec_route_slice_accepted_tokens_total", window, BAND, offset),
        _sum_rate("specdec_route_slice_draft_tokens_total", window, BAND, offset),
    )


def band_share(window: str, offset: str = "") -> str:
    """The band's share of its dimension's draft tokens (0 for a band that drafted nothing)."""
    drafted = _sum_rate("specdec_route_slice_draft_tokens_total", window, BAND, offset)
    whole = _sum_rate("specdec_route_slice_draft_tokens_total", window, DIMENSION, offset)
    return f"{drafted}\n/ on ({', '.join(DIMENSION)}) group_left ()\n({whole} > 0)"


def baseline_span(window: str, baseline: str) -> str:
    """Seconds of the baseline the route's slice counters cover: `baseline` once they are
    `baseline` + `window` old, less before (the dashboards' title says which; 1-minute steps)."""
    first = (
        "min_over_time(timestamp(sum by (route, model_name) "
        f'(specdec_route_slice_draft_tokens_total{{dimension="output"}}))[{baseline}:1m] '
        f"offset {window})"
    )
    return f"(time() - {int(parse_duration(window))}) - {first}"


def mix(window: str, baseline: str) -> str:
    """None where the baseline has no bands of the dimension (no acceptance to compare with:
    not the window's whole acceptance as mix)."""
    share_w, share_b = band_rule("share", window), baseline_rule("share", window, baseline)
    acc_w, acc_b = band_rule("acceptance", window), baseline_rule("acceptance", window, baseline)
    moved = f"(({share_w} - {share_b}) or {share_w} or (-1 * {share_b}))"
    on = ", ".join(DIMENSION)
    return (
        f"sum by ({on}) (\n  {moved}\n  * ({acc_b} or {acc_w})\n)\n"
        f"and on ({on})\ngroup by ({on}) ({share_b})"
    )


def within(window: str, baseline: str) -> str:
    """0 where no band drafted in both windows (every change is then mix)."""
    share_w = band_rule("share", window)
    acc_w = band_rule("acceptance", window)
    acc_b = baseline_rule("acceptance", window, baseline)
    found = f"sum by ({', '.join(DIMENSION)}) (\n  {share_w} * ({acc_w} - {acc_b})\n)"
    return f"{found}\nor\n0 * ({mix(window, baseline)})"


def cause_rule(window: str, baseline: str) -> str:
    """The recorded cause: one series a route, labels `dimension` and `part` (`cause`)."""
    return f"{PART_LEVEL}:specdec_route_acceptance_change_cause:ratio_{window}_{baseline}"


def cause(window: str, baseline: str) -> str:
    """Per route, the part that explains its change: along the dimension whose traffic moved
    acceptance most (the largest |mix|), its mix part if that is at least its within part,
    else its within part (the bands' own acceptance moved: the engine, model or drafter)."""
    change = change_rule(window, baseline)
    on = f"on ({', '.join(DIMENSION)})"
    moved, inside = f'{change}{{part="mix"}}', f'{change}{{part="within"}}'
    top = f"({moved} and {on} topk by (route, model_name) (1, abs({moved})))"
    return (
        f"(\n  {top}\n  and {on}\n  (abs({top}) >= {on} abs({inside}))\n)\nor\n"
        f"(\n  {inside}\n  and {on}\n  (abs({inside}) > {on} abs({top}))\n)"
    )
