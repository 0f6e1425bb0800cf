"""What a finished completion tells accounting: the engine's own per-request counts (vLLM's
object, SGLang's spec details) or why there are none, llama.cpp's per-request draft counts,
tokens, times and how it ended. Read from the decoded response (or the stream's usage event)
and the SSE tap."""

from __future__ import annotations

from typing import Any

from exporter.core.counts import BadSpecObject, Counts, fits, from_spec_object
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
    doc: dict[str, Any] | None,
    engine: str = "vllm",
) -> RequestOutcome:
    """`doc`: the decoded response (or a stream's usage event); None when the proxy had to
    relay it unread (larger than its budget)."""
    unread = doc is None
    doc = doc or {}
    usage = doc.get("usage")
    usage = usage if isinstance(usage, dict) else {}
    # llama.cpp: on the finish event, or on the usage event when the stream asked for usage
    timings = (tap.timings if tap is not None else None) or doc.get("timings")
    timings = timings if isinstance(timings, dict) else {}
    model = acc.label_model(_model(doc, tap) if status == "200" else None)
    tokens = _count(usage.get("completion_tokens")) or _count(timings.get("predicted_n"))
    exact = without = drafted = None
    choices = 1
    if status == "200" and unread:
        without = accounting.UNREAD
    elif status == "200" and engine == "sglang":
        details = tap.spec_details if tap is not None else sglext.details(doc)
        exact, without = _exact_sglang(details)
        choices = len(details) if isinstance(details, list) else 1
    elif status == "200":
        exact, without = _exact(spec_object(doc), single)
    draft_length = acc.draft_length(model)
    if exact is not None and not fits(exact, draft_length, tokens, choices):
        exact, without = None, accounting.IMPLAUSIBLE  # left to the estimate
    if exact is None and not unread:
        drafted = _drafted(timings, draft_length)
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
        model_name=model,
        status=status,
        completion_tokens=tokens,
        ttft=ttft,
        decode_seconds=decode,
        exact=exact,
        drafted=drafted,
        without_exact=without,
        increments=tuple(tap.increments) if tap is not None else (),
        finish_reason=accounting.finish_label(finish),
    )


def _count(value: object) -> int:
    """A token count from a peer: a non-negative int, else 0 (unknown)."""
    return value if type(value) is int and value >= 0 else 0


def _model(doc: dict[str, Any], tap: StreamTap | None) -> str | None:
    """The served model: the response's, the usage event's, else the finish event's."""
    model = doc.get("model") or (tap.model if tap is not None else None)
    return model if isinstance(model, str) else None


def _drafted(timings: dict[str, Any], draft_length: int) -> tuple[int, int] | None:
    """llama.cpp's per-request draft and accepted tokens, when its timings carry them and they
    can be true: at most `draft_length` drafts per generated token, none accepted beyond them."""
    predicted = timings.get("predicted_n")
    if type(predicted) is not int or predicted < 0:
        return None
    # a request that drafted nothing has no draft_n: it did no verify step
    tokens, accepted = timings.get("draft_n", 0), timings.get("draft_n_accepted", 0)
    if (
        type(tokens) is int
        and type(accepted) is int
        and 0 <= accepted <= min(tokens, predicted)
        and tokens <= draft_length * predicted
    ):
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
