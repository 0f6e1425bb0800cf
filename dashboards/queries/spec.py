"""Speculative-decoding figures as PromQL, for a scope (per route or per model x engine).

Every ratio sums the rates of its counters first and divides after, so it stays right across
replicas and sidecars; a `> 0` guard leaves no sample where nothing happened.
"""

from __future__ import annotations

from dataclasses import dataclass

from dashboards.queries.labels import ENGINE, ROUTE
from dashboards.queries.promql import by, ratio, sum_rate


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
    requests' tokens per decode step / the cost ratio at the batch (the model's step-time
    curve, verify / plain, as the sidecar reads it at every batch the engine ran at: the
    plain step now is the observed one over it, docs/metrics.md); else tokens per verify step
    / the same ratio; else, without a curve or a batch, at batch 1 (tokens per step / step
    cost ratio). The sidecar's gauge reads the curve at the live context too; this, at
    measure's."""
    on_line = (
        f"(\n{tokens_per_step(s, window, sel)}\n)\n* on (model_name) group_left ()\n{_cost(window)}"
    )
    fallback = f"(\n{on_line}\n)\nor\n(\n{_single_stream(s, window, sel)}\n)"
    if s is not ROUTES:
        return fallback
    exact = _exact(sel)
    observed = (
        f"(\n{_per_decode_step('decode_tokens', window, exact)}\n)\n"
        f"* on (model_name) group_left ()\n{_cost(window)}"
    )
    return f"(\n{observed}\n)\nor\n{fallback}"


def measured_speedup(window: str, sel: str = "") -> str:
    """Per route: the decode rate of its streamed requests x the plain step now: its exact
    requests' seconds per decode step / the cost ratio at the batch; without such requests,
    the curve's plain step at the batch (what a plain engine would decode at the same load)."""
    rate = decode_tokens_per_second(window, sel)
    now = f"(\n{_per_decode_step('decode_seconds', window, _exact(sel))}\n)\n* on (model_name) group_left ()\n{_cost(window)}"
    at_curve = f"(\n{rate}\n)\n* on (model_name) group_left ()\n{step_seconds('plain', window)}"
    return f"(\n(\n{rate}\n)\n*\n(\n{now}\n)\n)\nor\n(\n{at_curve}\n)"


def _exact(sel: str) -> str:
    return 'source="exact"' + (f", {sel}" if sel else "")


def _per_decode_step(counter: str, window: str, sel: str) -> str:
    """A route's decode tokens (or seconds) per decode step, over its counted requests."""
    return ratio(
        sum_rate(f"specdec_route_{counter}_total", window, ROUTE, sel),
        sum_rate("specdec_route_decode_steps_total", window, ROUTE, sel),
    )


def _cost(window: str) -> str:
    """plain / verify step at the batches the engine ran at: 1 / the cost ratio (the verify
    step the engine ran there: under a schedule's k = 0, a plain step, so 1)."""
    return f"({step_seconds('plain', window)}\n/ on (model_name)\n{step_seconds('verify', window)})"


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
