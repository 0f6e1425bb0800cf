"""What a llama-server's own clock says of each phase it served: per request, the prompt's and
the decode's milliseconds and tokens (its `print_timing` lines), grouped into phases (runs of
requests with no idle second between them), and per phase the decode milliseconds a token over
all its requests and over those sent in each sixth of the phase.

Where measure's plain step and the A/B's plain phases disagree at one batch (docs/
BENCHMARKS.md §11), the clients' clocks cannot say whether the engine ran slower or measure
read its clock wrong; the server's can, and the sixths show where in a phase the time went (a
closed loop that drains at its end, as measure's does, leaves its last requests decoding
beside idle slots). `--slices S` prints, per phase, the batch and a step's milliseconds in
each S seconds (each request's tokens spread evenly over its decode): a phase whose steps slow
at a full batch (the engine's state moved) reads apart from one that slows only as it drains.

    python -m bench.gpu.server_timings OUT/logs/plain.log OUT/logs/spec.log
    python -m bench.gpu.server_timings --slices 0.5 --phases 5,6,16 OUT/logs/plain.log
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

# llama.cpp's log stamp (minutes.seconds.milliseconds.microseconds since start), then the line
TIMING = re.compile(
    r"(\d+)\.(\d+)\.(\d+)\.(\d+) I slot print_timing: id +\d+ \| task (\d+) \|\s+"
    r"(prompt eval|eval) time =\s+([\d.]+) ms /\s+(\d+) tokens"
)
IDLE = 1.0  # seconds without a request in flight that end a phase
PARTS = 6


@dataclass(frozen=True)
class Served:
    """One request as the server timed it: when its prompt began and its decode ended (seconds
    since the server started), and the two parts' milliseconds and tokens."""

    start: float
    end: float
    prompt_ms: float
    prompt_tokens: int
    decode_ms: float
    decoded: int


def served(lines: Iterable[str]) -> list[Served]:
    """The requests a log's timing lines describe, by the time each ended (a prompt's line
    comes before its decode's, with the same task)."""
    prompts: dict[int, tuple[float, int]] = {}
    found = []
    for line in lines:
        m = TIMING.match(line)
        if m is None:
            continue
        minutes, seconds, ms, us = (int(g) for g in m.groups()[:4])
        at = 60 * minutes + seconds + ms / 1e3 + us / 1e6
        task, part, took, tokens = int(m[5]), m[6], float(m[7]), int(m[8])
        if part == "prompt eval":
            prompts[task] = (took, tokens)
            continue
        prompt_ms, prompt_tokens = prompts.pop(task, (0.0, 0))
        start = at - (prompt_ms + took) / 1e3
        found.append(Served(start, at, prompt_ms, prompt_tokens, took, tokens))
    return sorted(found, key=lambda s: s.end)


def phases(requests: Sequence[Served], idle: float = IDLE) -> list[list[Served]]:
    """Runs of requests with no `idle` seconds between one's end and the next one's start."""
    out: list[list[Served]] = []
    last_end = -float("inf")
    for r in sorted(requests, key=lambda s: s.start):
        if not out or r.start > last_end + idle:
            out.append([])
        out[-1].append(r)
        last_end = max(last_end, r.end)
    return out


def ms_per_token(requests: Sequence[Served]) -> float | None:
    decoded = sum(r.decoded for r in requests)
    return sum(r.decode_ms for r in requests) / decoded if decoded else None


def by_part(phase: Sequence[Served], parts: int = PARTS) -> list[tuple[int, float | None]]:
    """(requests, decode ms a token) of the requests sent in each equal part of the phase."""
    t0 = phase[0].start
    length = max(r.end for r in phase) - t0
    out = []
    for k in range(parts):
        sent = [r for r in phase if k * length / parts <= r.start - t0 < (k + 1) * length / parts]
        out.append((len(sent), ms_per_token(sent)))
    return out


def slices(phase: Sequence[Served], width: float) -> list[tuple[float, float | None]]:
    """(requests decoding, milliseconds a step) in each `width` seconds of the phase: the
    running requests' mean count over the slice and that count over their tokens a second
    (a plain server makes one token a request a step; None: nothing decoded)."""
    t0, t1 = phase[0].start, max(r.end for r in phase)
    out = []
    at = t0
    while at < t1:
        tokens = busy = 0.0
        for r in phase:
            begin, seconds = r.end - r.decode_ms / 1e3, r.decode_ms / 1e3
            inside = min(at + width, r.end) - max(at, begin)
            if inside > 0 and seconds > 0:
                tokens += r.decoded * inside / seconds
                busy += inside / width
        out.append((busy, busy / (tokens / width) * 1e3 if tokens else None))
        at += width
    return out


def read(path: Path) -> list[list[Served]]:
    """A log's phases."""
    with path.open(encoding="utf-8", errors="replace") as f:
        return phases(served(f))


def slice_report(path: Path, width: float, which: set[int] | None) -> list[str]:
    found = read(path)
    lines = [f"{path}: batch:step ms in each {width:g} s"]
    for i, phase in enumerate(found):
        if which is None or i in which:
            cells = " ".join(
                f"{n:4.1f}:{'-' if ms is None else f'{ms:.1f}'}" for n, ms in slices(phase, width)
            )
            lines.append(f"{i:3d} {cells}")
    return lines


def report(path: Path) -> list[str]:
    found = read(path)
    lines = [f"{path}: {len(found)} phase(s); decode ms a token, all, then by sixth sent"]
    for i, phase in enumerate(found):
        t0 = phase[0].start
        length = max(r.end for r in phase) - t0
        prompt = sum(r.prompt_tokens for r in phase) / len(phase)
        decoded = sum(r.decoded for r in phase) / len(phase)
        every = ms_per_token(phase)
        parts = " ".join(
            "      -   " if ms is None else f"{ms:6.2f}({n:3d})" for n, ms in by_part(phase)
        )
        lines.append(
            f"{i:3d} at {t0:7.1f} s {length:5.1f} s  {len(phase):4d} req  prompt {prompt:4.0f}  "
            f"decoded {decoded:6.1f}  {'-' if every is None else f'{every:6.2f}'}  {parts}"
        )
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("logs", nargs="+", type=Path, help="llama-server logs (OUT/logs/*.log)")
    ap.add_argument("--slices", type=float, help="seconds a slice: the batch and step over time")
    ap.add_argument("--phases", help="with --slices, these phases only (0,3,...)")
    args = ap.parse_args(argv)
    if args.slices is not None and args.slices <= 0:
        ap.error("--slices takes seconds above 0")
    try:
        which = None if not args.phases else {int(p) for p in args.phases.split(",")}
    except ValueError:
        ap.error(f"--phases takes phase numbers separated by commas, not {args.phases!r}")
    for path in args.logs:
        try:
            if args.slices is not None:
                print("\n".join(slice_report(path, args.slices, which)))
            else:
                print("\n".join(report(path)))
        except OSError as e:
            print(f"server_timings: {path}: {e.strerror or e}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
