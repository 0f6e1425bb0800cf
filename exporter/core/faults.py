"""Internal errors of the work beside the byte path: routing a request, the stream tap's
observations, accounting a finished request, building the collectors' families.

A bug there must cost a figure, never a user's byte: the caller catches the exception, goes on
relaying, and records it here, where it is counted per stage and logged once per kind (stage
and exception type) with its traceback, so a bug that fires on every request cannot flood the
log either.
"""

from __future__ import annotations

import traceback
from collections import Counter

from exporter import logs

STAGES = ("routing", "tap", "accounting", "collector")


class Faults:
    def __init__(self) -> None:
        self.counts: Counter[str] = Counter({stage: 0 for stage in STAGES})
        self._logged: set[tuple[str, str]] = set()
        self._log = logs.get("faults")

    def record(self, stage: str, error: BaseException) -> None:
        self.counts[stage] += 1
        kind = (stage, type(error).__name__)
        if kind not in self._logged:
            self._logged.add(kind)
            self._log.error(
                "internal error; the bytes went on unchanged (logged once per kind)",
                stage=stage,
                error=type(error).__name__,
                detail=str(error)[:200],
                traceback="".join(traceback.format_exception(error))[-4000:],
            )
