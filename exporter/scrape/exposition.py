"""A targeted scanner for Prometheus text exposition.

The sidecar needs a handful of families out of a ~600-line page. Instead of parsing every
line (as a general parser must), it jumps with `str.find` to lines that start with a known
lead such as ``vllm:spec_decode_num_`` and parses only those. It never raises: a line that
does not parse is counted and skipped.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

Labels = tuple[tuple[str, str], ...]

_LABEL = re.compile(r'[ \t]*([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*"((?:[^"\\\n]|\\.)*)"[ \t]*(,|\})')
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


@dataclass(frozen=True, slots=True)
class Sample:
    """One sample line: metric name, labels in page order, value (timestamp dropped)."""

    name: str
    labels: Labels
    value: float


@dataclass(slots=True)
class Scan:
    """What a scan found: the samples under the leads and how many of those lines were bad."""

    samples: list[Sample] = field(default_factory=list)
    bad_lines: int = 0


def scan(text: str, leads: tuple[str, ...]) -> Scan:
    """Parse the sample lines of `text` that start with one of `leads`; skip everything else."""
    result = Scan()
    for lead in leads:
        pos = 0 if text.startswith(lead) else _next_line_with(text, lead, 0)
        while pos != -1:
            end = text.find("\n", pos)
            line = text[pos:] if end == -1 else text[pos:end]
            sample = parse_line(line.rstrip("\r"))
            if sample is None:
                result.bad_lines += 1
            else:
                result.samples.append(sample)
            pos = -1 if end == -1 else _next_line_with(text, lead, end)
    return result


def _next_line_with(text: str, lead: str, start: int) -> int:
    hit = text.find("\n" + lead, start)
    return -1 if hit == -1 else hit + 1


def parse_line(line: str) -> Sample | None:
    """Parse one sample line (`name{labels} value [timestamp]`); None when it is malformed."""
    name_match = _NAME.match(line)
    if name_match is None:
        return None
    name = name_match.group()
    pos = name_match.end()
    labels: list[tuple[str, str]] = []
    if pos < len(line) and line[pos] == "{":
        pos += 1
        if line.startswith("}", pos):
            pos += 1
        else:
            while True:
                match = _LABEL.match(line, pos)
                if match is None:
                    return None
                value = match.group(2)
                if "\\" in value:
                    value = re.sub(r"\\.", lambda m: _UNESCAPE.get(m.group(), m.group()), value)
                labels.append((match.group(1), value))
                pos = match.end()
                if match.group(3) == "}":
                    break
    rest = line[pos:].split()
    if not rest or len(rest) > 2 or (pos < len(line) and line[pos] not in " \t"):
        return None
    number = _number(rest[0])
    if number is None or (len(rest) == 2 and _number(rest[1]) is None):
        return None
    return Sample(name, tuple(labels), number)


def _number(text: str) -> float | None:
    if "_" in text:  # float() accepts "1_000"; the exposition format does not
        return None
    try:
        return float(text)
    except ValueError:
        return None
