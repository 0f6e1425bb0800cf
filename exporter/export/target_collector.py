"""The targets' families, built fresh on each scrape of the sidecar from one reading of each
target (`TargetState.read`: an immutable `TargetSnapshot`), so series of a vanished target or
series disappear with it."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from exporter import __version__
from exporter.config import ModelConfig
from exporter.engines.base import RUNNING
from exporter.export.collector import FamiliesCollector
from exporter.scrape.snapshot import TargetSnapshot
from exporter.scrape.target import TargetState

ERROR_REASONS = ("timeout", "connection", "http_status", "protocol", "too_large", "no_spec_metrics")

SERIES = ["target", "model_name", "engine"]  # `engine`: the series' rank, as the engine labels it


class TargetCollector(FamiliesCollector):
    def __init__(
        self,
        targets: Sequence[TargetState],
        clock: Callable[[], float],
        models: Mapping[str, ModelConfig] | None = None,
    ) -> None:
        self.targets = targets
        self.clock = clock
        self.models = models or {}  # by model_name: a schedule gives the scheduled draft length

    def collect(self) -> Iterator[Metric]:
        now = self.clock()
        targets = [state.read(now) for state in self.targets]
        yield from self._health(targets)
        yield from self._counters(targets)
        yield from self._windows(targets)
        yield from self._reported(targets)

    def _health(self, targets: list[TargetSnapshot]) -> Iterator[Metric]:
        info = GaugeMetricFamily("specdec_build_info", "specdec version.", labels=["version"])
        info.add_metric([__version__], 1.0)
        up = GaugeMetricFamily(
            "specdec_target_up",
            "1 when the last scrape of the target succeeded.",
            labels=["target"],
        )
        duration = GaugeMetricFamily(
            "specdec_scrape_duration_seconds",
            "Duration of the last scrape of the target (fetch and parse).",
            labels=["target"],
        )
        errors = CounterMetricFamily(
            "specdec_scrape_errors",
            "Failed scrapes by reason (no_spec_metrics: the page has no spec-decode counters).",
            labels=["target", "reason"],
        )
        bad = CounterMetricFamily(
            "specdec_malformed_lines",
            "Spec-decode sample lines that did not parse and were skipped.",
            labels=["target"],
        )
        for target in targets:
            name = target.name
            if target.up is not None:
                up.add_metric([name], 1.0 if target.up else 0.0)
            if target.last_duration is not None:
                duration.add_metric([name], target.last_duration)
            for reason in ERROR_REASONS:
                errors.add_metric([name, reason], float(target.errors.get(reason, 0)))
            bad.add_metric([name], float(target.bad_lines))
        yield from (info, up, duration, errors, bad)

    def _counters(self, targets: list[TargetSnapshot]) -> Iterator[Metric]:
        def family(name: str, doc: str, position: bool = False) -> CounterMetricFamily:
            return CounterMetricFamily(
                name, doc, labels=SERIES + (["position"] if position else [])
            )

        drafts = family("specdec_drafts", "Speculative verify steps (vLLM: num_drafts).")
        proposed = family("specdec_draft_tokens", "Draft tokens proposed.")
        accepted = family(
            "specdec_accepted_tokens", "Draft tokens accepted (bonus token excluded)."
        )
        rejected = family(
            "specdec_rejected_draft_tokens", "Draft tokens rejected (proposed - accepted)."
        )
        per_pos = family(
            "specdec_accepted_tokens_per_position",
            "Verify steps that accepted more than `position` drafts.",
            position=True,
        )
        restarts = family("specdec_engine_restarts", "Engine restarts detected by the sidecar.")
        generated = family(
            "specdec_engine_generation_tokens",
            "Tokens generated, for an engine that counts no draft or accepted tokens (SGLang): "
            "its tokens per verify step are rate(this) / rate(specdec_drafts_total).",
        )
        for target in targets:
            for (model_name, rank), totals in target.series.items():
                labels = [target.name, model_name, rank]
                counts = totals.counts
                if counts.drafts is not None:
                    drafts.add_metric(labels, counts.drafts)
                restarts.add_metric(labels, float(totals.restarts))
                if counts.generated is not None:
                    generated.add_metric(labels, counts.generated)
                if counts.draft_tokens is None or counts.accepted is None:
                    continue  # an engine that counts none (SGLang): nothing to export
                proposed.add_metric(labels, counts.draft_tokens)
                accepted.add_metric(labels, counts.accepted)
                if totals.rejected is not None:
                    rejected.add_metric(labels, totals.rejected)
                for i, value in enumerate(counts.per_position):
                    per_pos.add_metric([*labels, str(i)], value)
        yield from (drafts, proposed, accepted, rejected, per_pos, restarts)
        if generated.samples:
            yield generated

    def _reported(self, targets: list[TargetSnapshot]) -> Iterator[Metric]:
        """The engines' own gauges, as they report them (only families some engine fills)."""
        length = GaugeMetricFamily(
            "specdec_engine_reported_acceptance_length",
            "The engine's own acceptance-length gauge, as it reports it (TensorRT-LLM's "
            "trtllm_spec_decode_acceptance_length, SGLang's sglang:spec_accept_length: recent "
            "iterations, bonus token included); not windowed, not restart-safe: a figure to "
            "compare, not to aggregate.",
            labels=SERIES,
        )
        rate = GaugeMetricFamily(
            "specdec_engine_reported_acceptance_ratio",
            "The engine's own acceptance-rate gauge, as it reports it (SGLang's "
            "sglang:spec_accept_rate: accepted / proposed drafts of its last logging interval).",
            labels=SERIES,
        )
        running = GaugeMetricFamily(
            "specdec_engine_running_requests",
            "The engine's batch at the last scrape: requests in model execution (vLLM's "
            "vllm:num_requests_running, SGLang's sglang:num_running_reqs, llama.cpp's "
            "llamacpp:requests_processing; TensorRT-LLM has none). The step cost depends on it.",
            labels=SERIES,
        )
        busy = CounterMetricFamily(
            "specdec_engine_running_request_seconds",
            "Running requests integrated over time (b dt), as the sidecar saw them scrape to "
            "scrape: rate(batch_seconds) / rate(this) is the batch its requests saw.",
            labels=SERIES,
        )
        crowded = CounterMetricFamily(
            "specdec_engine_running_request_batch_seconds",
            "Running requests squared integrated over time (b^2 dt).",
            labels=SERIES,
        )
        plain = CounterMetricFamily(
            "specdec_engine_running_request_plain_step_seconds",
            "Running requests x the model's plain step seconds at the batch (its step-time "
            "curve, `models:`), integrated over time (b plain(b) dt): / running_request_seconds "
            "is the plain step a running request saw. Only for a model with a curve.",
            labels=SERIES,
        )
        verify = CounterMetricFamily(
            "specdec_engine_running_request_verify_step_seconds",
            "The same with the curve's verify step (b verify(b) dt).",
            labels=SERIES,
        )
        scheduled = GaugeMetricFamily(
            "specdec_engine_scheduled_draft_length",
            "The draft length the model's dynamic speculative decoding schedule "
            "(`models: draft_length_schedule`, vLLM's num_speculative_tokens_per_batch_size) "
            "gives at the engine's batch at the last scrape; 0: no speculation at this batch. "
            "Only for a model with a schedule.",
            labels=SERIES,
        )
        for target in targets:
            for (model_name, rank), batch in sorted(target.batch.items()):
                labels = [target.name, model_name, rank]
                busy.add_metric(labels, batch.request_seconds)
                crowded.add_metric(labels, batch.batch_request_seconds)
                if model_name in target.curved:
                    plain.add_metric(labels, batch.plain_step_seconds)
                    verify.add_metric(labels, batch.verify_step_seconds)
            for (model_name, rank), values in target.gauges.items():
                labels = [target.name, model_name, rank]
                if "acceptance_length" in values:
                    length.add_metric(labels, values["acceptance_length"])
                if "acceptance_rate" in values:
                    rate.add_metric(labels, values["acceptance_rate"])
                if RUNNING in values:
                    running.add_metric(labels, values[RUNNING])
                    model = self.models.get(model_name)
                    if model is not None and model.draft_length_schedule is not None:
                        draft_length = model.scheduled_draft_length(values[RUNNING])
                        scheduled.add_metric(labels, float(draft_length))
        families = (length, rate, running, busy, crowded, plain, verify, scheduled)
        yield from (f for f in families if f.samples)

    def _windows(self, targets: list[TargetSnapshot]) -> Iterator[Metric]:
        labels = [*SERIES, "window"]
        acceptance = GaugeMetricFamily(
            "specdec_acceptance_ratio",
            "Accepted / proposed draft tokens over the window; absent without drafts. "
            'engine="all" sums the model\'s engines.',
            labels=labels,
        )
        length = GaugeMetricFamily(
            "specdec_mean_acceptance_length",
            "Tokens per verify step over the window: 1 + accepted / drafts (vLLM's definition; "
            "SGLang: generated tokens / verify calls, its own).",
            labels=labels,
        )
        position = GaugeMetricFamily(
            "specdec_position_acceptance_ratio",
            "Share of verify steps that accepted more than `position` drafts over the window.",
            labels=[*labels, "position"],
        )
        for target in targets:
            for per_window in target.windows:
                span, label = per_window.work, per_window.window.label
                for figures in (*span.series, *span.by_model):
                    series = [target.name, figures.model_name, figures.rank, label]
                    if figures.acceptance is not None:
                        acceptance.add_metric(series, figures.acceptance)
                    if figures.mean_acceptance_length is not None:
                        length.add_metric(series, figures.mean_acceptance_length)
                    for i, ratio in enumerate(figures.per_position or ()):
                        position.add_metric([*series, str(i)], ratio)
        yield from (acceptance, length, position)
