"""A quiet day of the demo's routes for its Prometheus, as OpenMetrics that `promtool tsdb
create-blocks-from openmetrics` turns into blocks before Prometheus starts: the 1-day levels
and the breakdown's baseline (the day before its 10-minute window) then exist from the first
evaluation, as in production, so `specdec demo --scenario drop` can drop within minutes rather
than after eleven, and the drop is judged against a day, not against its own start."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

SPREAD = 0.115  # sd of a request's acceptance the simulator draws, as a share of its drafts
DRAFT_LENGTH = 3
# the bands every demo request falls in: no temperature, text output, a short prompt
SLICES = (("temperature", "unset"), ("output", "text"), ("prompt_tokens", "le512"))
BACKFILL_SECONDS = 120.0


class BackfillFailed(Exception):
    """promtool could not write the blocks: `str()` names the command's end of output."""


@dataclass(frozen=True)
class RouteDay:
    """One route's quiet day: its acceptance counted by token, requests a minute, and each
    request's draft and completion tokens."""

    route: str
    acceptance: float
    requests_per_minute: int
    draft_tokens: int
    completion_tokens: int

    def per_minute(self) -> dict[str, float]:
        """Each route counter's increase a minute: m requests of t draft tokens, accepting
        p t +- SPREAD t in turn."""
        m, t, p = self.requests_per_minute, self.draft_tokens, self.acceptance
        return {
            "specdec_route_draft_tokens": m * t,
            "specdec_route_accepted_tokens": m * p * t,
            "specdec_route_drafts": m * t / DRAFT_LENGTH,
            "specdec_route_spec_requests": m,
            "specdec_route_request_draft_tokens_squared": m * t * t,
            "specdec_route_request_accepted_tokens_squared": m * ((p * t) ** 2 + (SPREAD * t) ** 2),
            "specdec_route_request_accepted_times_draft_tokens": m * p * t * t,
            "specdec_route_request_draft_tokens_cubed": m * t**3,
            "specdec_route_runaway_requests": 0,
            "specdec_route_requests_below_breakeven": 0,
            "specdec_route_requests": m,
        }

    def slice_per_minute(self, name: str) -> float:
        """A slice counter's increase a minute (its one band per dimension holds them all)."""
        if name == "completion_tokens":
            return self.requests_per_minute * self.completion_tokens
        return self.per_minute()[f"specdec_route_{name}"]


EXACT = ("specdec_route_draft_tokens", "specdec_route_accepted_tokens", "specdec_route_drafts")


def history(now: float, model: str, days: Sequence[RouteDay], job: str = "specdec") -> str:
    """A day of each route's counters ending a minute before `now` (one sample a minute), its
    requests' slices, the engine's restart counter (so routes and engine have a day of
    history) and yesterday's hourly acceptance (the dashboards' "same hour yesterday")."""
    start, end, step = int(now) - 25 * 3600, int(now) - 60, 60
    stamps = range(start, end, step)
    lines = []
    for name in days[0].per_minute():
        lines.append(f"# TYPE {name} counter")
        for day in days:
            labels = f'job="{job}",instance="backfill",model_name="{model}",route="{day.route}"'
            if name in EXACT:
                labels += ',source="exact"'
            if name == "specdec_route_requests":
                labels += ',status="200",finish_reason="stop"'
            increase = day.per_minute()[name]
            lines += [
                f"{name}_total{{{labels}}} {increase * n:.1f} {ts}" for n, ts in enumerate(stamps)
            ]
    for name in ("draft_tokens", "accepted_tokens", "requests", "completion_tokens"):
        family = f"specdec_route_slice_{name}"
        lines.append(f"# TYPE {family} counter")
        for day in days:
            for dimension, band in SLICES:
                labels = (
                    f'job="{job}",instance="backfill",model_name="{model}",route="{day.route}",'
                    f'dimension="{dimension}",band="{band}"'
                )
                increase = day.slice_per_minute(name)
                lines += [
                    f"{family}_total{{{labels}}} {increase * n:.1f} {ts}"
                    for n, ts in enumerate(stamps)
                ]
    lines.append("# TYPE specdec_engine_restarts counter")
    labels = f'job="{job}",instance="backfill",target="sim",model_name="{model}",engine="0"'
    lines += [f"specdec_engine_restarts_total{{{labels}}} 0 {ts}" for ts in stamps]
    rule = "route_model_name:specdec_route_acceptance:ratio_rate1h"
    lines.append(f"# TYPE {rule} gauge")
    for day in days:
        for ts in range(int(now) - 86400 - 5400, int(now) - 86400 + 1800, 15):
            lines.append(
                f'{rule}{{model_name="{model}",route="{day.route}"}} {day.acceptance} {ts}'
            )
    lines.append("# EOF")
    return "\n".join(lines) + "\n"


async def backfill(text: str, tsdb: Path, promtool: str) -> None:
    """Write `text` (OpenMetrics) as blocks into `tsdb`; the promtool child ends with us."""
    tsdb.mkdir(parents=True, exist_ok=True)
    source = tsdb.parent / "history.om"
    source.write_text(text, encoding="utf-8")
    proc = await asyncio.create_subprocess_exec(
        promtool, "tsdb", "create-blocks-from", "openmetrics", str(source), str(tsdb),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), BACKFILL_SECONDS)
    except TimeoutError:
        raise BackfillFailed(
            f"promtool tsdb create-blocks-from openmetrics took over {BACKFILL_SECONDS:.0f} s"
        ) from None
    finally:  # done, timed out or our own stop: the child goes with us
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        source.unlink(missing_ok=True)
    if proc.returncode != 0:
        tail = out.decode(errors="replace").strip().splitlines()[-3:]
        raise BackfillFailed(
            f"promtool tsdb create-blocks-from openmetrics exited {proc.returncode}: "
            + " / ".join(tail)
        )
