"""A route's acceptance change split into traffic mix and within-band parts, as PromQL from
the slice counters (exporter/core/slices.py has the same split in Python: the sidecar's
`specdec_route_acceptance_change_ratio`).

Per band b of a dimension, over a window: acc_b = accepted / draft tokens (none where the band
drafted nothing) and share_b = its draft tokens / the dimension's. Then, W the window and B the
baseline:

    mix    = sum_b (share_W,b - share_B,b) * acc_B,b     (acc_B,b := acc_W,b for a band new in W)
    within = sum_b share_W,b * (acc_W,b - acc_B,b)

Rates summed over replicas first, then divided, as every ratio here.
"""

from __future__ import annotations

from dashboards.queries.labels import ROUTE
from dashboards.queries.promql import ratio, sum_rate

DIMENSION = (*ROUTE, "dimension")
BAND = (*DIMENSION, "band")
LEVEL = "route_model_name_dimension_band"
PART_LEVEL = "route_model_name_dimension_part"


def band_rule(figure: str, window: str) -> str:
    """A band's recorded figure, e.g. band_rule("acceptance", "10m")."""
    return f"{LEVEL}:specdec_route_slice_{figure}:ratio_rate{window}"


def change_rule(window: str, baseline: str) -> str:
    """The recorded change parts (label `part`: mix, within)."""
    return f"{PART_LEVEL}:specdec_route_acceptance_change:ratio_{window}_{baseline}"


def band_acceptance(window: str) -> str:
    return ratio(
        sum_rate("specdec_route_slice_accepted_tokens_total", window, BAND),
        sum_rate("specdec_route_slice_draft_tokens_total", window, BAND),
    )


def band_share(window: str) -> str:
    """The band's share of its dimension's draft tokens (0 for a band that drafted nothing)."""
    drafted = sum_rate("specdec_route_slice_draft_tokens_total", window, BAND)
    whole = sum_rate("specdec_route_slice_draft_tokens_total", window, DIMENSION)
    return f"{drafted}\n/ on ({', '.join(DIMENSION)}) group_left ()\n({whole} > 0)"


def mix(window: str, baseline: str) -> str:
    share_w, share_b = band_rule("share", window), band_rule("share", baseline)
    acc_w, acc_b = band_rule("acceptance", window), band_rule("acceptance", baseline)
    moved = f"(({share_w} - {share_b}) or {share_w} or (-1 * {share_b}))"
    return f"sum by ({', '.join(DIMENSION)}) (\n  {moved}\n  * ({acc_b} or {acc_w})\n)"


def within(window: str, baseline: str) -> str:
    """0 where no band drafted in both windows (every change is then mix)."""
    share_w = band_rule("share", window)
    acc_w, acc_b = band_rule("acceptance", window), band_rule("acceptance", baseline)
    found = f"sum by ({', '.join(DIMENSION)}) (\n  {share_w} * ({acc_w} - {acc_b})\n)"
    return f"{found}\nor\n0 * ({mix(window, baseline)})"
