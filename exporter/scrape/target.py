"""The scrape loop: fetch a target's /metrics every interval, feed the sums and the windows.

A target that is down, slow, answers an HTTP error or serves garbage is counted by reason
and reported through `specdec_target_up`; it never stops the loop or the other targets.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable, Mapping
from types import MappingProxyType

import aiohttp

from exporter import logs
from exporter.config import Target, redact
from exporter.core.counts import Counts, total
from exporter.core.payoff import Batch, StepCurve
from exporter.core.windows import History, Window
from exporter.engines import engine
from exporter.engines.base import RUNNING, EngineFamilies, ScrapeHooks
from exporter.scrape.families import SeriesKey, read_page
from exporter.scrape.figures import NO_WORK, read_span
from exporter.scrape.snapshot import SeriesSums, TargetSnapshot, TargetWindow
from exporter.scrape.totals import RunningTotals

MAX_PAGE_BYTES = 16 * 1024 * 1024
Clock = Callable[[], float]


class ScrapeError(Exception):
    """A failed scrape; `reason` is the bounded label value it is counted under."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


class TargetState:
    """Everything the exporter knows about one target: sums, windows and health."""

    def __init__(
        self,
        target: Target,
        windows: tuple[Window, ...],
        model: str = "",
        curves: Mapping[str, StepCurve] | None = None,
    ) -> None:
        self.target = target
        self.model = target.model_name or model  # for series the engine leaves unlabelled
        self.curves = curves or {}  # per model_name: its batch is also read on the curve
        self.engine: ScrapeHooks = engine(target.kind)
        self.families: EngineFamilies = self.engine.families(target.prefix)
        self.store = RunningTotals()
        self.history: History[SeriesKey, Counts] = History(windows)
        self.status: str | None = None  # None until the first scrape ends
        self.last_duration: float | None = None
        self.errors: Counter[str] = Counter()
        self.bad_lines = 0
        self.gauges: dict[tuple[str, str], dict[str, float]] = {}  # the engine's own, last page
        self.batch: dict[SeriesKey, Batch] = {}  # running requests integrated over time
        self.batch_history: History[SeriesKey, Batch] = History(windows, born_at_zero=True)
        self._last_page_at: float | None = None

    def carried(
        self,
        target: Target,
        windows: tuple[Window, ...],
        model: str = "",
        curves: Mapping[str, StepCurve] | None = None,
    ) -> TargetState:
        """A new state for the same target (by name) under a reloaded config: its running
        totals, health and batch go on, its windows are `windows` over the same history. This
        state is left as it was (the reload swaps whole, then drops it)."""
        new = TargetState(target, windows, model, curves)
        new.store, new.errors, new.bad_lines = self.store, self.errors, self.bad_lines
        new.status, new.last_duration, new.gauges = self.status, self.last_duration, self.gauges
        new.history = self.history.with_windows(windows)
        new.batch = self.batch
        new.batch_history = self.batch_history.with_windows(windows)
        new._last_page_at = self._last_page_at
        return new

    def _mean_running(self, window: Window, now: float, partial: bool = False) -> dict[str, float]:
        """Per model_name, the batch its running requests saw over the window (each page's
        running requests held until the next page; weighed by requests, so idle time does not
        count), the mean over its ranks."""
        per_rank: dict[str, list[float]] = {}
        for (model, _), batch in self.batch_history.increase(window, now, partial).items():
            if batch.seen is not None:
                per_rank.setdefault(model, []).append(batch.seen)
        return {model: sum(seen) / len(seen) for model, seen in per_rank.items()}

    def read(self, now: float, partial: bool = False, work: bool = True) -> TargetSnapshot:
        """Everything a scrape shows of the target at `now`, as one immutable reading
        (`partial`: windows the history does not cover yet read over what it covers, as the
        demo shows them; a scrape's never are). `work=False`: a reader that takes only the
        batch (the route collector), whose windows then hold no work (`Span()`)."""
        windows = tuple(
            TargetWindow(
                window,
                self.history.covered(window, now),
                read_span(self.history.increase(window, now, partial)) if work else NO_WORK,
                MappingProxyType(self._mean_running(window, now, partial)),
            )
            for window in self.history.windows
        )
        return TargetSnapshot(
            name=self.target.name,
            up=self.up,
            last_duration=self.last_duration,
            errors=MappingProxyType(dict(self.errors)),
            bad_lines=self.bad_lines,
            series=MappingProxyType(
                {
                    key: SeriesSums(totals.counts, totals.rejected, totals.restarts)
                    for key, totals in self.store.series.items()
                }
            ),
            batch=MappingProxyType(dict(self.batch)),
            gauges=MappingProxyType(
                {key: MappingProxyType(dict(values)) for key, values in self.gauges.items()}
            ),
            curved=frozenset(self.curves),
            windows=windows,
        )

    def work_by_model(self) -> dict[str, Counts]:
        """The engine's work per model_name since the sidecar first saw it, summed over its
        ranks: what the proxy's accounting apportions to routes."""
        by_model: dict[str, list[Counts]] = {}
        for (model, _), totals in self.store.series.items():
            by_model.setdefault(model, []).append(totals.since_first_sight)
        return {model: total(items) for model, items in by_model.items()}

    @property
    def up(self) -> bool | None:
        return None if self.status is None else self.status != "down"

    def ingest(self, text: str, now: float) -> list[tuple[str, str]]:
        """Feed one page; returns the series that restarted. Raises ScrapeError for a page
        without any spec-decode series (speculation off, wrong prefix or garbage)."""
        page = read_page(text, self.families, self.model)
        self.bad_lines += page.bad_lines
        restarted = self.store.feed(page)
        self._integrate(page.gauges, now)
        self.gauges = page.gauges
        self.history.record(now, self.store.snapshot())
        if not page.series:
            raise ScrapeError("no_spec_metrics", f"no {self.families.lead}* counters on the page")
        return restarted

    def _integrate(self, gauges: dict[SeriesKey, dict[str, float]], now: float) -> None:
        """Add the last page's batch over the time since it was read."""
        if self._last_page_at is not None and now > self._last_page_at:
            elapsed = now - self._last_page_at
            for key, values in self.gauges.items():
                if RUNNING in values and key in gauges:
                    step = Batch.held(values[RUNNING], elapsed, self.curves.get(key[0]))
                    self.batch[key] = self.batch.get(key, Batch()) + step
        self._last_page_at = now
        self.batch_history.record(now, dict(self.batch))


class Scraper:
    """Runs the scrape loop of one target."""

    def __init__(self, state: TargetState, session: aiohttp.ClientSession, clock: Clock) -> None:
        self.state = state
        self.session = session
        self.clock = clock
        self.log = logs.get("scrape").bind(target=state.target.name)

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        while True:
            await self.scrape_once()
            next_at = max(next_at + self.state.target.interval, loop.time())
            await asyncio.sleep(next_at - loop.time())

    async def scrape_once(self) -> None:
        state = self.state
        started = time.perf_counter()
        try:
            restarted = state.ingest(await self.fetch(), self.clock())
        except ScrapeError as exc:
            state.errors[exc.reason] += 1
            self._status("up_without_spec" if exc.reason == "no_spec_metrics" else "down", exc)
            return
        finally:
            state.last_duration = time.perf_counter() - started
        self._status("up", None)
        for model_name, rank in restarted:
            self.log.warning("engine restart detected", model_name=model_name, engine=rank)

    async def fetch(self) -> str:
        target = self.state.target
        try:
            async with self.session.get(
                target.url, timeout=aiohttp.ClientTimeout(total=target.timeout)
            ) as resp:
                if resp.status != 200:
                    raise ScrapeError("http_status", f"HTTP {resp.status}")
                body = bytearray()
                async for chunk in resp.content.iter_chunked(1 << 16):
                    body += chunk
                    if len(body) > MAX_PAGE_BYTES:
                        raise ScrapeError("too_large", f"page larger than {MAX_PAGE_BYTES} bytes")
        except TimeoutError as exc:
            raise ScrapeError("timeout", f"no complete answer within {target.timeout}s") from exc
        except aiohttp.ClientConnectorError as exc:
            raise ScrapeError("connection", str(exc)) from exc
        except aiohttp.ClientError as exc:
            raise ScrapeError("protocol", f"{type(exc).__name__}: {exc}") from exc
        return body.decode("utf-8", errors="replace")

    def _status(self, status: str, error: ScrapeError | None) -> None:
        """Log state changes only (up, up without spec counters, down), never per scrape."""
        was, self.state.status = self.state.status, status
        if was == status:
            return
        if error is None:
            self.log.info("target up", url=redact(self.state.target.url))
        else:
            self.log.warning(
                f"target {status.replace('_', ' ')}", reason=error.reason, detail=str(error)
            )
