"""What one scrape of a vLLM page costs the sidecar, against prometheus_client's parser.

Ours: `read_page` + `RunningTotals.feed` + `History.record` + the increase and figures of
every window (1m, 5m, 15m, per rank and summed over ranks: `scrape.figures.read_span`) --
everything the sidecar does with a page, done per scrape here (the sidecar itself derives the
figures when it is scraped). The history is first filled with 15 minutes of 1 s scrapes, so the
windows run in their steady state. The reference: `list(text_string_to_metric_families(page))`,
a parse only.

Both run in the same process on the same pages (the fixture with its spec-decode counters
advancing between scrapes, cycling through --pages variants), in interleaved rounds of timeit
repeats. Reported: the median time per page and the ratio reference / ours (higher is better;
the goal is >= 10 on the 4-engine page).

    python bench/bench_parse.py [--rounds 7] [--repeat 3] [--check-ratio 10] [--record]
"""

from __future__ import annotations

import argparse
import gc
import itertools
import statistics
import sys
import timeit
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from _pages import PAGE_1ENGINE, PAGE_4ENGINE, CounterPage
from _run import add_outputs, keep
from prometheus_client.parser import text_string_to_metric_families

from exporter.core.windows import DEFAULT_WINDOWS, History
from exporter.scrape.families import families, read_page
from exporter.scrape.figures import read_span
from exporter.scrape.totals import RunningTotals

GOAL_PAGE = PAGE_4ENGINE.name
SAMPLE_SECONDS = 0.05  # each timeit sample runs the call this long, at least


def reference(text: str) -> object:
    return list(text_string_to_metric_families(text))


def parse_only() -> Callable[[str], object]:
    fams = families("vllm")
    return lambda text: read_page(text, fams)


def one_scrape() -> Callable[[str], object]:
    """A fresh target: its sums and history, and a clock advancing one second per scrape."""
    fams = families("vllm")
    store = RunningTotals()
    history = History(DEFAULT_WINDOWS)
    clock = itertools.count()

    def scrape(text: str) -> object:
        now = float(next(clock))
        store.feed(read_page(text, fams))
        history.record(now, store.snapshot())
        return [read_span(history.increase(window, now)) for window in history.windows]

    return scrape


@dataclass
class Contender:
    name: str
    fn: Callable[[str], object]
    number: int = 1
    samples: list[float] | None = None

    def timer(self, pages: Iterator[str]) -> timeit.Timer:
        return timeit.Timer("fn(page())", globals={"fn": self.fn, "page": pages.__next__})


def calibrate(contender: Contender, pages: Iterator[str]) -> None:
    """timeit's autorange, with a longer floor: calls per sample so a sample takes >= 50 ms."""
    timer = contender.timer(pages)
    number = 1
    while True:
        if timer.timeit(number) >= SAMPLE_SECONDS:
            contender.number = number
            return
        number *= 2


def bench_page(path: Path, variants: int, rounds: int, repeat: int) -> dict[str, object]:
    template = CounterPage(path.read_text(encoding="utf-8"))
    pages = [template.render(step) for step in range(variants)]
    found = read_page(pages[0], families("vllm"))
    ours = Contender("ours", one_scrape())
    contenders = [ours, Contender("parse", parse_only()), Contender("reference", reference)]
    cycles = {c.name: itertools.cycle(pages) for c in contenders}
    for _ in range(15 * 60 + 1):  # steady state: the 15m window's ring is full
        ours.fn(next(cycles["ours"]))
    for c in contenders:
        calibrate(c, cycles[c.name])
        c.samples = []
    for r in range(rounds):  # interleaved, and the order alternates between rounds
        for c in contenders if r % 2 == 0 else contenders[::-1]:
            times = c.timer(cycles[c.name]).repeat(repeat, c.number)
            assert c.samples is not None
            c.samples.extend(t / c.number for t in times)
    med = {c.name: statistics.median(c.samples or [0.0]) for c in contenders}
    spread = {c.name: (min(c.samples or [0.0]), max(c.samples or [0.0])) for c in contenders}
    return {
        "page": path.name,
        "bytes": len(pages[0].encode()),
        "lines": pages[0].count("\n"),
        "series": len(found.series),
        "median": med,
        "spread": spread,
        "ratio": med["reference"] / med["ours"],
    }


def figures(res: dict[str, object]) -> dict[str, object]:
    """One page's row as kept: microseconds per page, medians."""
    med = res["median"]
    assert isinstance(med, dict)
    return {
        "page": res["page"],
        "series": res["series"],
        "ours_us": round(med["ours"] * 1e6, 1),
        "read_page_us": round(med["parse"] * 1e6, 1),
        "reference_us": round(med["reference"] * 1e6, 1),
        "ratio": res["ratio"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds (default 7)")
    parser.add_argument(
        "--repeat", type=int, default=3, help="timeit repeats per round and contender (default 3)"
    )
    parser.add_argument(
        "--pages",
        type=int,
        default=60,
        help="page variants cycled through, counters advancing (default 60)",
    )
    parser.add_argument(
        "--check-ratio",
        type=float,
        metavar="X",
        help=f"exit 1 when the ratio on {GOAL_PAGE} is below X (for humans; CI does not time)",
    )
    add_outputs(parser)
    args = parser.parse_args(argv)
    print(
        f"python {sys.version.split()[0]}, gc {'on' if gc.isenabled() else 'off'} "
        f"outside samples (timeit turns it off inside); {args.rounds} rounds x {args.repeat} "
        "repeats, medians per page (min-max of the samples)"
    )
    results = [
        bench_page(path, args.pages, args.rounds, args.repeat)
        for path in (PAGE_1ENGINE, PAGE_4ENGINE)
    ]
    header = (
        f"{'page':<28} {'lines':>5} {'series':>6}  {'ours: scrape+derive':>22}  "
        f"{'of it read_page':>15}  {'reference':>22}  {'ratio':>6}"
    )
    print(header)
    print("-" * len(header))
    for res in results:
        med, spread = res["median"], res["spread"]
        assert isinstance(med, dict) and isinstance(spread, dict)

        def cell(name: str, med: dict[str, float] = med, spread: dict = spread) -> str:
            lo, hi = spread[name]
            return f"{med[name] * 1e6:7.1f} us ({lo * 1e6:.0f}-{hi * 1e6:.0f})"

        print(
            f"{res['page']:<28} {res['lines']:>5} {res['series']:>6}  {cell('ours'):>22}  "
            f"{med['parse'] * 1e6:>12.1f} us  {cell('reference'):>22}  {res['ratio']:>5.1f}x"
        )
    goal = next(r for r in results if r["page"] == GOAL_PAGE)
    ratio = goal["ratio"]
    assert isinstance(ratio, float)
    print(f"ratio = reference / ours; the goal is >= 10x on {GOAL_PAGE}: {ratio:.1f}x")
    keep(args, "bench_parse", {"pages": [figures(r) for r in results], "goal_ratio": ratio})
    if args.check_ratio is not None and ratio < args.check_ratio:
        print(f"FAIL: {ratio:.1f}x is below --check-ratio {args.check_ratio:g}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
