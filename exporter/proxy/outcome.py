"""What a finished completion tells accounting: the engine's own per-request counts (vLLM's
object, SGLang's spec details) or why there are none, llama.cpp's per-request draft counts,
tokens, times and how it ended. Read from the decoded response (or the stream's usage event)
and the SSE tap."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from exporter.accounting.ledger import RequestOutcome, finish_label
from exporter.core import reasons
from exporter.core.counts import Counts, fits
from exporter.core.slices import slices
from exporter.engines import DEFAULT
from exporter.engines.base import ProxyHooks, Response
from exporter.proxy.labels import ModelLabels
from exporter.proxy.sse import StreamTap

# the engine's request id as an exemplar label and a log field: a safe charset, and at most 64
# characters, so that with the trace id the exemplar's labels fit OpenMetrics' 128
REQUEST_ID_CHARS = 64
_UNSAFE = re.compile(r"[^A-Za-z0-9._:-]")


def request_outcome(
    labels: ModelLabels,
    draft_length: Callable[[str], int],
    route: str,
    started: float,
    single: bool,
    status: str,
    tap: StreamTap | None,
    doc: dict[str, Any] | None,
    engine: ProxyHooks = DEFAULT,
    bands: tuple[str, str] = ("unset", "text"),
    trace_id: str = "",
    at: float = 0.0,
    seconds: float = 0.0,
) -> RequestOutcome:
    """`labels`: the model_name label values given so far; `draft_length`: the most draft
    tokens a step of a model can have (the accounting's configured k); `doc`: the decoded
    response (or a stream's usage event); None when the proxy had to relay it unread (larger
    than its budget); `bands`: its request's temperature and output
    bands (`core.slices.request_bands`); `trace_id`, `at`, `seconds`: its trace id, when it
    ended (wall clock) and how long it took, for exemplars and the request log."""
    unread = doc is None
    doc = doc or {}
    usage = doc.get("usage")
    usage = usage if isinstance(usage, dict) else {}
    timings, predicted = engine.timings(doc, tap.timings if tap is not None else None)
    model = labels.label(_model(doc, tap) if status == "200" else None)
    tokens = _count(usage.get("completion_tokens")) or predicted
    exact = without = drafted = spec_steps = None
    choices = 1
    if status == "200" and unread:
        without = reasons.UNREAD
    elif status == "200":
        streamed = tap.spec_details if tap is not None else None
        figures = engine.request_figures(Response(doc, tap is not None, streamed, single))
        exact, without, choices = figures.exact, figures.without, figures.choices
        spec_steps = figures.spec_steps
    k = draft_length(model)
    if exact is not None and not fits(exact, k, tokens, choices):
        exact, without = None, reasons.IMPLAUSIBLE  # left to the estimate
    if exact is None and not unread:
        drafted = engine.drafted(timings, k)
    if without == reasons.NOT_SENT and drafted is not None:
        without = reasons.TOKENS_ONLY  # partly exact: its tokens, not its steps
    ttft = decode = None
    if tap is not None and tap.first_content_at is not None:
        ttft = tap.first_content_at - started
        decode = (tap.last_content_at or tap.first_content_at) - tap.first_content_at
    finish: object = "abort" if status == "499" else None
    if status == "200":
        finish = tap.finish_reason if tap is not None else _first_finish(doc)
    prompt_tokens = engine.prompt_tokens(usage, timings)
    return RequestOutcome(
        route=route,
        model_name=model,
        status=status,
        completion_tokens=tokens,
        prompt_tokens=prompt_tokens,
        ttft=ttft,
        decode_seconds=decode,
        exact=exact,
        drafted=drafted,
        without_exact=without,
        increments=tuple(tap.increments) if tap is not None else (),
        steps_by_length=_steps_by_length(exact, spec_steps, tokens),
        slices=slices(bands, prompt_tokens),
        finish_reason=finish_label(finish),
        trace_id=trace_id,
        request_id=request_id(doc.get("id")),
        at=at,
        seconds=seconds,
    )


def request_id(value: object) -> str:
    """The engine's id of a request (vLLM's `chatcmpl-...`), as a label value may carry a
    peer's string: characters outside [A-Za-z0-9._:-] dropped, at most 64 kept."""
    if not isinstance(value, str):
        return ""
    value = value[: REQUEST_ID_CHARS * 2]  # a hostile id costs no more than this
    return _UNSAFE.sub("", value)[:REQUEST_ID_CHARS]


def _steps_by_length(
    exact: Counts | None, spec_steps: Mapping[int, int] | None, tokens: int
) -> tuple[tuple[int, int], ...]:
    """Its verify steps by draft length and its plain steps (k = 0): each verify step makes
    1 + its accepted drafts, each plain one 1 token, after the prefill's first; so the plain
    ones are the tokens less 1, the verify steps and the accepted drafts. Nothing when the
    engine did not state its steps by draft length, or the tokens are not known."""
    if exact is None or spec_steps is None or not tokens or exact.accepted is None:
        return ()
    plain = tokens - 1 - sum(spec_steps.values()) - int(exact.accepted)
    found = {**spec_steps, 0: max(plain, 0)}
    return tuple(sorted((k, n) for k, n in found.items() if n))


def _count(value: object) -> int:
    """A token count from a peer: a non-negative int, else 0 (unknown)."""
    return value if type(value) is int and value >= 0 else 0


def _model(doc: dict[str, Any], tap: StreamTap | None) -> str | None:
    """The served model: the response's, the usage event's, else the finish event's."""
    model = doc.get("model") or (tap.model if tap is not None else None)
    return model if isinstance(model, str) else None


def _first_finish(doc: dict[str, Any]) -> object:
    """The finish_reason of a whole response's first choice."""
    choices = doc.get("choices")
    first = choices[0] if isinstance(choices, list) and choices else None
    return first.get("finish_reason") if isinstance(first, dict) else None
