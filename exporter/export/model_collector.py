"""Per-model payoff constants from config, exported so PromQL can use them (estimated speedup
= tokens per step / step cost; tokens per step against its k + 1 ceiling; break-even; roofline),
whether or not the proxy runs."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric

from exporter.config import ModelConfig
from exporter.core.payoff import breakeven_acceptance, decode_ceiling
from exporter.export.collector import FamiliesCollector


class ModelCollector(FamiliesCollector):
    def __init__(self, models: dict[str, ModelConfig]) -> None:
        self.models = models

    def collect(self) -> Iterator[Metric]:
        breakeven = GaugeMetricFamily(
            "specdec_breakeven_acceptance_ratio",
            "Acceptance at which speculation breaks even: (step_cost_ratio - 1) / k (from config).",
            labels=["model_name"],
        )
        ceiling = GaugeMetricFamily(
            "specdec_decode_ceiling_tokens_per_second",
            "Bandwidth roofline of plain decode: memory bandwidth / bytes per token (from config).",
            labels=["model_name"],
        )
        step_cost = GaugeMetricFamily(
            "specdec_model_step_cost_ratio",
            "Cost of one verify step with k drafts over a plain decode step (from config).",
            labels=["model_name"],
        )
        drafts_per_step = GaugeMetricFamily(
            "specdec_model_num_speculative_tokens",
            "Draft tokens per verify step, k (from config): tokens per step is at most k + 1.",
            labels=["model_name"],
        )
        fits = {
            kind: (
                GaugeMetricFamily(
                    f"specdec_model_{kind}_step_base_seconds",
                    f"The {kind} step-time line's seconds at no running request: a {kind} step "
                    "takes base + per_running_request x running (a least-squares line through the "
                    "configured step_time curve, flat for the single-stream point).",
                    labels=["model_name"],
                ),
                GaugeMetricFamily(
                    f"specdec_model_{kind}_step_seconds_per_running_request",
                    f"The {kind} step-time line's slope: seconds added per running request.",
                    labels=["model_name"],
                ),
            )
            for kind in ("plain", "verify")
        }
        measured = GaugeMetricFamily(
            "specdec_model_step_curve_max_running_requests",
            "The largest batch (running requests) the model's step_time curve was measured at: "
            "the curve is flat beyond it, and `specdec advise` advises nothing there.",
            labels=["model_name"],
        )
        schedule = GaugeMetricFamily(
            "specdec_model_schedule_range_draft_length",
            "The draft length the model's configured draft_length_schedule (vLLM's "
            "num_speculative_tokens_per_batch_size) gives for batches first_batch..last_batch: "
            "what `specdec advise` compares its advice with.",
            labels=["model_name", "first_batch", "last_batch"],
        )
        for name, m in sorted(self.models.items()):
            if m.draft_length_schedule is not None:
                for first, last, k in m.draft_length_schedule.ranges:
                    schedule.add_metric([name, str(first), str(last)], float(k))
            curve = m.curve
            if curve is not None:
                measured.add_metric([name], max(p.running for p in curve.points))
            for kind, (base, slope) in fits.items():
                line = None if curve is None else curve.fit(verify=kind == "verify")
                if line is not None:
                    base.add_metric([name], line[0])
                    slope.add_metric([name], line[1])
            step_cost.add_metric([name], m.step_cost_ratio)
            drafts_per_step.add_metric([name], float(m.num_speculative_tokens))
            breakeven.add_metric(
                [name], breakeven_acceptance(m.step_cost_ratio, m.num_speculative_tokens)
            )
            if m.bytes_per_token and m.memory_bandwidth_bytes_per_second:
                ceiling.add_metric(
                    [name], decode_ceiling(m.memory_bandwidth_bytes_per_second, m.bytes_per_token)
                )
        yield from (step_cost, drafts_per_step, breakeven, ceiling, schedule, measured)
        for base, slope in fits.values():
            yield from (base, slope)
