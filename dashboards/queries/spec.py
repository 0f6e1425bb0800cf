"""Speculative-decoding figures as PromQL, for a scope (per route or per model x engine).

Every ratio sums the rates of its counters first and divides after, so it stays right across
replicas and sidecars; a `> 0` guard leaves no sample where nothing happened.
"""

from __future__ import annotations

from dataclasses import dataclass

from dashboards.labels import ENGINE, ROUTE
from dashboards.promql import by, ratio, sum_rate


@dataclass(frozen=True)
class Scope:
    """Which counters and labels: the proxy's per-route ones, or the engine's per model x engine."""

    level: str  # the recording rule level, e.g. route_model_name
    prefix: str  # counter family prefix
    labels: tuple[str, ...]

    def counter(self, name: str) -> str:
        return f"{self.prefix}{name}_total"

    def rule_name(self, figure: str, suffix: str, per_position: bool = False) -> str:
        """A recording rule's name, built here only: e.g. rule_name("acceptance",
        "ratio_rate5m") -> route_model_name:specdec_route_acceptance:ratio_rate5m."""
        level = f"{self.level}_position" if per_position else self.level
        return f"{level}:{self.prefix}{figure}:{suffix}"


ROUTES = Scope("route_model_name", "specdec_route_", ROUTE)
ENGINES = Scope("model_name_engine", "specdec_", ENGINE)


def acceptance(s: Scope, window: str, sel: str = "") -> str:
    """Accepted / proposed draft tokens."""
    return ratio(
        sum_rate(s.counter("accepted_tokens"), window, s.labels, sel),
        sum_rate(s.counter("draft_tokens"), window, s.labels, sel),
    )


def tokens_per_step(s: Scope, window: str, sel: str = "") -> str:
    """Mean acceptance length: 1 + accepted / drafts (the bonus token included)."""
    accepted = sum_rate(s.counter("accepted_tokens"), window, s.labels, sel)
    drafts = sum_rate(s.counter("drafts"), window, s.labels, sel)
    return f"1 + (\n{ratio(accepted, drafts)}\n)"


def position_acceptance(s: Scope, window: str, sel: str = "") -> str:
    """Share of verify steps that accepted more than `position` drafts."""
    per_pos = sum_rate(
        s.counter("accepted_tokens_per_position"), window, (*s.labels, "position"), sel
    )
    drafts = sum_rate(s.counter("drafts"), window, s.labels, sel)
    return f"{per_pos}\n/ on ({', '.join(s.labels)}) group_left ()\n({drafts} > 0)"


def batch(window: str, sel: str = "") -> str:
    """The batch the engine's running requests saw, per model: rate(b^2 dt) / rate(b dt)."""
    return ratio(
        sum_rate(
            "specdec_engine_running_request_batch_seconds_total", window, ("model_name",), sel
        ),
        sum_rate("specdec_engine_running_request_seconds_total", window, ("model_name",), sel),
    )


def step_seconds(kind: str, window: str, sel: str = "") -> str:
    """A plain (or verify) step's seconds at the batches the engine ran at: the model's
    step-time curve read by the sidecar at each batch and integrated with it (b step(b) dt),
    over b dt. A line through the curve's points would be wrong where the curve bends (on a
    GPU llama-server it fell from batch 16 to 32: a line read +39 % at 31)."""
    found = ratio(
        sum_rate(
            f"specdec_engine_running_request_{kind}_step_seconds_total",
            window,
            ("model_name",),
            sel,
        ),
        sum_rate("specdec_engine_running_request_seconds_total", window, ("model_name",), sel),
    )
    return f"({found})"


def _single_stream(s: Scope, window: str, sel: str) -> str:
    """Tokens per step / the model's step cost ratio: the payoff at batch 1."""
    cost = "max by (model_name) (specdec_model_step_cost_ratio)"
    return f"(\n{tokens_per_step(s, window, sel)}\n)\n/ on (model_name) group_left ()\n{cost}"


def estimated_speedup(s: Scope, window: str, sel: str = "") -> str:
    """The payoff at the load it runs, as the sidecar states it: per route, the exact streamed
    requests' tokens per second x a plain step's seconds at the batch (tokens per step x plain
    / seconds per step); else tokens per verify step x plain / verify step at the batch (the
    model's step-time line); else, without a line or a batch, at batch 1 (tokens per step /
    step cost ratio)."""
    plain = step_seconds("plain", window)
    cost = f"({plain}\n/ on (model_name)\n{step_seconds('verify', window)})"
    on_line = f"(\n{tokens_per_step(s, window, sel)}\n)\n* on (model_name) group_left ()\n{cost}"
    fallback = f"(\n{on_line}\n)\nor\n(\n{_single_stream(s, window, sel)}\n)"
    if s is not ROUTES:
        return fallback
    exact = 'source="exact"' + (f", {sel}" if sel else "")
    observed = (
        f"(\n{decode_tokens_per_second(window, exact)}\n)\n* on (model_name) group_left ()\n{plain}"
    )
    return f"(\n{observed}\n)\nor\n{fallback}"


def measured_speedup(window: str, sel: str = "") -> str:
    """Per route: the decode rate of its streamed requests x a plain step's seconds at the batch
    (what a plain engine would decode at the same load)."""
    plain = step_seconds("plain", window)
    return (
        f"(\n{decode_tokens_per_second(window, sel)}\n)\n* on (model_name) group_left ()\n{plain}"
    )


def rejected_per_second(s: Scope, window: str, sel: str = "") -> str:
    """Draft tokens proposed and thrown away, per second: the waste."""
    proposed = sum_rate(s.counter("draft_tokens"), window, s.labels, sel)
    accepted = sum_rate(s.counter("accepted_tokens"), window, s.labels, sel)
    return f"{proposed}\n-\n{accepted}"


def draft_tokens_per_second(s: Scope, window: str, sel: str = "") -> str:
    return sum_rate(s.counter("draft_tokens"), window, s.labels, sel)


def requests_per_second(window: str, sel: str = "") -> str:
    return sum_rate("specdec_route_requests_total", window, ROUTE, sel)


def decode_tokens_per_second(window: str, sel: str = "") -> str:
    """Measured decode rate per route: streamed completion tokens / seconds after first token."""
    return ratio(
        sum_rate("specdec_route_decode_tokens_total", window, ROUTE, sel),
        sum_rate("specdec_route_decode_seconds_total", window, ROUTE, sel),
    )


def ttft_quantile(q: float, window: str, sel: str = "") -> str:
    return (
        f"histogram_quantile({q}, sum {by((*ROUTE, 'le'))} "
        f"(rate(specdec_route_ttft_seconds_bucket{{{sel}}}[{window}])))"
    )
