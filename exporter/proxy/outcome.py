"""What a finished completion tells accounting: the engine's own per-request counts (vLLM's
object, SGLang's spec details) or why there are none, llama.cpp's per-request draft counts,
tokens, times and how it ended. Read from the decoded response (or the stream's usage event)
and the SSE tap."""

from __future__ import annotations

from typing import Any

from exporter.core.counts import BadSpecObject, Counts, from_spec_object
from exporter.proxy import accounting, sglext
from exporter.proxy.accounting import Accounting, RequestOutcome
from exporter.proxy.sse import StreamTap


def spec_object(doc: dict[str, Any]) -> object:
    """vLLM's `metrics.speculative_decoding`, or None."""
    metrics = doc.get("metrics")
    return metrics.get("speculative_decoding") if isinstance(metrics, dict) else None


def request_outcome(
    acc: Accounting,
    route: str,
    started: float,
    single: bool,
    status: str,
    tap: StreamTap | None,
    doc: dict[str, Any],
    engine: str = "vllm",
) -> RequestOutcome:
    usage = doc.get("usage")
    usage = usage if isinstance(usage, dict) else {}
    exact = without = None
    if status == "200" and engine == "sglang":
        exact, without = _exact_sglang(tap.spec_details if tap is not None else sglext.details(doc))
    elif status == "200":
        exact, without = _exact(spec_object(doc), single)
    # llama.cpp: on the finish event, or on the usage event when the stream asked for usage
    timings = (tap.timings if tap is not None else None) or doc.get("timings")
    timings = timings if isinstance(timings, dict) else {}
    drafted = _drafted(timings) if exact is None else None
    if without == accounting.NOT_SENT and drafted is not None:
        without = accounting.TOKENS_ONLY  # partly exact: its tokens, not its steps
    elif without == accounting.NOT_SENT and engine == "trtllm":
        without = accounting.ENGINE_SENDS_NONE
    ttft = decode = None
    if tap is not None and tap.first_content_at is not None:
        ttft = tap.first_content_at - started
        decode = (tap.last_content_at or tap.first_content_at) - tap.first_content_at
    finish: object = "abort" if status == "499" else None
    if status == "200":
        finish = tap.finish_reason if tap is not None else _first_finish(doc)
    return RequestOutcome(
        route=route,
        model_name=acc.label_model(_model(doc, tap) if status == "200" else None),
        status=status,
        completion_tokens=int(usage.get("completion_tokens") or timings.get("predicted_n") or 0),
        ttft=ttft,
        decode_seconds=decode,
        exact=exact,
        drafted=drafted,
        without_exact=without,
        increments=tuple(tap.increments) if tap is not None else (),
        finish_reason=accounting.finish_label(finish),
    )


def _model(doc: dict[str, Any], tap: StreamTap | None) -> str | None:
    """The served model: the response's, the usage event's, else the finish event's."""
    model = doc.get("model") or (tap.model if tap is not None else None)
    return model if isinstance(model, str) else None


def _drafted(timings: dict[str, Any]) -> tuple[int, int] | None:
    """llama.cpp's per-request draft and accepted tokens, when its timings carry them."""
    if "predicted_n" not in timings:
        return None
    # a request that drafted nothing has no draft_n: it did no verify step
    tokens, accepted = timings.get("draft_n", 0), timings.get("draft_n_accepted", 0)
    if type(tokens) is int and type(accepted) is int and 0 <= accepted <= tokens:
        return tokens, accepted
    return None


def _exact(spec: object, single: bool) -> tuple[Counts | None, str | None]:
    """A 200's own counts, or why there are none (then it is left to estimates)."""
    if not single:
        return None, accounting.N_ABOVE_1
    if spec is None:
        return None, accounting.NOT_SENT
    if not isinstance(spec, dict):
        return None, accounting.UNKNOWN_SHAPE
    try:
        return from_spec_object(spec), None
    except BadSpecObject:
        return None, accounting.UNKNOWN_SHAPE


def _exact_sglang(spec: object) -> tuple[Counts | None, str | None]:
    """SGLang's details (a list for n > 1: its choices' sum, exact too), or why there are none:
    none comes when no verify step ran (speculation off, max_tokens 1) or when it was stripped."""
    if spec is None:
        return None, accounting.NOT_SENT
    try:
        return sglext.counts(spec), None
    except BadSpecObject:
        return None, accounting.UNKNOWN_SHAPE


def _first_finish(doc: dict[str, Any]) -> object:
    """The finish_reason of a whole response's first choice."""
    choices = doc.get("choices")
    first = choices[0] if isinstance(choices, list) and choices else None
    return first.get("finish_reason") if isinstance(first, dict) else None
