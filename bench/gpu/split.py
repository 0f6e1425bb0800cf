"""Why two routes decode at different rates on one plain server: the steps each route spans.

On the H200 the voice route's plain decode ran 7-13 % over the agent's at c = 16 in the same
phases (docs/BENCHMARKS.md §11, runs 19-21), though both share every step. The hypothesis this
reads: a closed-loop client between two requests (from its last event to its next request's
first: the round trip and the prefill) leaves its slot out of the decode batch, and on a
llama-server with a KV stream per slot a batch whose busy slots are not consecutive takes a
pass over the weights per run of them; so steps during another client's gap are slower, and a
route whose own clients are in a gap more often (shorter requests) is absent from more of them.
With every request of a route at one length (`--length-spread 0`, runs 15-21) its clients stay
in step and leave together: the other route then decodes alone in every other slot (clients
alternate the routes), a pass per request.

From the clients' timelines of a phase (`traffic.Span`, written by `gpu_payoff.py` under
OUT/timelines/), per route: its decode rate, the other clients in a gap that its decode time
saw on average, and the rate a least-squares line of each request's seconds per token against
the gaps it saw predicts for the route. If the line's split matches the observed one, the gaps
explain it.

    python -m bench.gpu.split OUT/timelines/*plain*.jsonl
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.gpu.traffic import Span


@dataclass(frozen=True)
class RouteSplit:
    """A route in one phase: its decode rate (tokens / seconds, pooled), the other clients in
    a gap per second of its decode (time-weighted), and the rate the phase's line predicts at
    that many gaps (None: too few requests to fit)."""

    route: str
    rate: float | None
    gaps: float | None
    predicted: float | None


def gap_intervals(spans: Sequence[Span]) -> list[tuple[int, float, float]]:
    """(worker, from, to): each client's time out of the batch, from its previous request's
    last event (its first request: when it was sent) to the next request's first event."""
    found: list[tuple[int, float, float]] = []
    by_worker: dict[int, list[Span]] = {}
    for s in spans:
        by_worker.setdefault(s.worker, []).append(s)
    for worker, mine in by_worker.items():
        previous: Span | None = None
        for s in sorted(mine, key=lambda x: x.sent):
            begin = s.sent if previous is None else previous.last
            if s.first > begin:
                found.append((worker, begin, s.first))
            previous = s
    return found


def gaps_seen(span: Span, gaps: Sequence[tuple[int, float, float]]) -> float:
    """Other clients' gap seconds inside the span's decode (first to last event), per second."""
    length = span.last - span.first
    if length <= 0:
        return 0.0
    inside = sum(
        max(0.0, min(span.last, to) - max(span.first, begin))
        for worker, begin, to in gaps
        if worker != span.worker
    )
    return inside / length


def split(spans: Sequence[Span]) -> list[RouteSplit]:
    """Per route (in order of first appearance), its rate, the gaps it saw and the rate the
    phase's line (seconds per token = a + b x gaps seen, weighted by tokens) predicts."""
    gaps = gap_intervals(spans)
    decoding = [s for s in spans if s.decoded > 0 and s.last > s.first]
    seen = [(s, gaps_seen(s, gaps)) for s in decoding]
    line = _fit([(g, (s.last - s.first) / s.decoded, s.decoded) for s, g in seen])
    found: list[RouteSplit] = []
    for route in dict.fromkeys(s.route for s in spans):
        mine = [(s, g) for s, g in seen if s.route == route]
        tokens = sum(s.decoded for s, _ in mine)
        seconds = sum(s.last - s.first for s, _ in mine)
        if seconds <= 0:
            found.append(RouteSplit(route, None, None, None))
            continue
        g = sum(x * (s.last - s.first) for s, x in mine) / seconds
        predicted = None if line is None else 1.0 / (line[0] + line[1] * g)
        found.append(RouteSplit(route, tokens / seconds, g, predicted))
    return found


def _fit(points: Sequence[tuple[float, float, float]]) -> tuple[float, float] | None:
    """Weighted least squares y = a + b x through (x, y, weight); None below 3 points or
    without spread in x."""
    total = sum(w for _, _, w in points)
    if len(points) < 3 or total <= 0:
        return None
    mx = sum(x * w for x, _, w in points) / total
    my = sum(y * w for _, y, w in points) / total
    sxx = sum(w * (x - mx) ** 2 for x, _, w in points)
    if sxx <= 0:
        return None
    slope = sum(w * (x - mx) * (y - my) for x, y, w in points) / sxx
    return my - slope * mx, slope


def read(path: Path) -> list[Span]:
    """A timeline file: one JSON object per line, a `Span`'s fields."""
    with path.open(encoding="utf-8") as f:
        return [Span(**json.loads(line)) for line in f if line.strip()]


def write(path: Path, spans: Sequence[Span]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for s in spans:
            f.write(json.dumps(s.__dict__) + "\n")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("timelines", nargs="+", type=Path, help="OUT/timelines/*.jsonl")
    args = ap.parse_args(argv)
    for path in args.timelines:
        try:
            spans = read(path)
        except (OSError, ValueError, TypeError) as e:
            print(f"split: {path}: {e}", file=sys.stderr)
            return 2
        rows = split(spans)
        cells = []
        for r in rows:
            if r.rate is None:
                cells.append(f"{r.route} -")
                continue
            guess = "" if r.predicted is None else f" (line {r.predicted:.1f})"
            cells.append(f"{r.route} {r.rate:.1f} tok/s, {r.gaps:.2f} gaps{guess}")
        print(f"{path.name}: " + "; ".join(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
