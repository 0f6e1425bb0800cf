"""The request log: one JSON line per completion through the proxy (structlog, the sidecar's
own log stream), so an on-call can go from an exemplar's trace id or request id to what the
request was: its route, model, status, tokens, draft and accepted tokens, bands and times.

Never a prompt's or a completion's text, never a header's value: every field is a figure the
proxy already counts or a label value that is allow-listed (route, model_name's bounded set,
the bands), plus the trace id (validated hex) and the engine's id (a safe charset, cut).

Off by default (`proxy.request_log.enabled`). Sampled where it is decided, at the end of a
request: every failed, low-acceptance and slow request is kept, a `sample` share of the rest.
Never in the relay's way: the relay's side is a dice roll and a `put_nowait` on a bounded queue
(a full queue drops the line and counts it); a thread formats and writes, so a stdout that
blocks (a full pipe, a slow log shipper) stalls only that thread.
"""

from __future__ import annotations

import queue
import random
import threading
from collections import Counter
from typing import Any, Final

from exporter import logs
from exporter.accounting.ledger import RequestOutcome
from exporter.config import RequestLogConfig

CAPACITY: Final = 4096  # lines waiting for the writer; past it a line is dropped, and counted
REASONS: Final = ("failed", "low_acceptance", "slow", "sampled")  # why a line was kept


def kept(outcome: RequestOutcome, config: RequestLogConfig, dice: float) -> str | None:
    """Why `outcome` is logged (one of REASONS), or None: it is not."""
    if outcome.status != "200":
        return "failed"
    draft, accepted = _drafted(outcome)
    if draft and accepted / draft < config.low_acceptance:
        return "low_acceptance"
    waited = outcome.ttft if outcome.ttft is not None else outcome.seconds
    if waited > config.slow_ttft:
        return "slow"
    return "sampled" if dice < config.sample else None


def line(outcome: RequestOutcome, reason: str, sample: float) -> dict[str, Any]:
    """The fields of its line: figures and allow-listed values only."""
    draft, accepted = _drafted(outcome)
    return {
        "route": outcome.route,
        "model": outcome.model_name,
        "trace_id": outcome.trace_id,
        "request_id": outcome.request_id,
        "status": outcome.status,
        "finish_reason": outcome.finish_reason,
        "prompt_tokens": outcome.prompt_tokens,
        "completion_tokens": outcome.completion_tokens,
        "draft_tokens": draft,
        "accepted_tokens": accepted,
        "acceptance": round(accepted / draft, 4) if draft else None,
        "bands": dict(outcome.slices),
        "ttft_s": None if outcome.ttft is None else round(outcome.ttft, 6),
        "decode_s": None if outcome.decode_seconds is None else round(outcome.decode_seconds, 6),
        "seconds": round(outcome.seconds, 6),
        "ended": round(outcome.at, 3),  # when it ended (the line's timestamp: when written)
        "kept": reason,
        "sample": sample,  # the share of the unremarkable ones logged: a count scales by 1/it
    }


def _drafted(outcome: RequestOutcome) -> tuple[int, int]:
    """Its draft and accepted tokens as the engine stated them (0, 0: not stated)."""
    exact = outcome.exact
    if exact is not None and exact.draft_tokens is not None and exact.accepted is not None:
        return int(exact.draft_tokens), int(exact.accepted)
    if outcome.drafted is not None:
        return outcome.drafted
    return 0, 0


class RequestLog:
    """The proxy's request log: `offer` on the relay's side, a writer thread started with the
    first kept line."""

    def __init__(self, capacity: int = CAPACITY) -> None:
        self._queue: queue.Queue[tuple[RequestOutcome, str, float] | None] = queue.Queue(capacity)
        self._thread: threading.Thread | None = None
        self._log = logs.get("requests")
        self.lines: Counter[str] = Counter({reason: 0 for reason in REASONS})  # queued, by why
        self.dropped = 0  # lines lost to a full queue (the writer fell behind); the loop's
        self.unwritten = 0  # lines the writer thread failed to format or write; its own

    def offer(self, outcome: RequestOutcome, config: RequestLogConfig) -> None:
        reason = kept(outcome, config, random.random())
        if reason is None:
            return
        try:
            self._queue.put_nowait((outcome, reason, config.sample))
        except queue.Full:
            self.dropped += 1
            return
        self.lines[reason] += 1
        if self._thread is None:
            self._thread = threading.Thread(target=self._write, name="request-log", daemon=True)
            self._thread.start()

    def flush(self) -> None:
        """Until every line queued so far is written (tests, a stop)."""
        if self._thread is not None:
            self._queue.join()

    def close(self) -> None:
        """The lines queued are written, then the thread ends."""
        if self._thread is not None:
            self._queue.put(None)  # the writer's end
            self._thread.join(timeout=5.0)
            self._thread = None

    def _write(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                outcome, reason, sample = item
                self._log.info("request", **line(outcome, reason, sample))
            except Exception:  # a line lost, never the thread: the next one is written
                self.unwritten += 1
            finally:
                self._queue.task_done()
