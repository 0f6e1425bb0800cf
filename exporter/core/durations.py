"""One duration grammar for the config, the rolling windows, command-line flags and the
dashboards: Prometheus' own (`model.ParseDuration`), so a window written as in PromQL means the
same here. Units ms, s, m, h, d, w, y, largest first, each at most once: 500ms, 90s, 1h30m, 2d.
"""

from __future__ import annotations

import re

UNITS = {"y": 365 * 86400.0, "w": 7 * 86400.0, "d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0}
_PATTERN = re.compile(
    r"(?:(\d+)y)?(?:(\d+)w)?(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?(?:(\d+)ms)?"
)
_SCALES = (*UNITS.values(), 0.001)
EXAMPLES = "30s, 5m or 1h"


def parse_duration(text: str) -> float:
    """'500ms', '90s', '1h30m', '2d' -> seconds; ValueError for anything else."""
    match = _PATTERN.fullmatch(text)
    if not text or match is None:
        raise ValueError(f"not a duration like {EXAMPLES}: {text!r}")
    return sum(int(n) * scale for n, scale in zip(match.groups(), _SCALES, strict=True) if n)


def parse_seconds(text: str) -> float:
    """A number of seconds ('2', '2.5') or a duration ('500ms', '10s', '1m')."""
    try:
        return float(text)
    except ValueError:
        return parse_duration(text)
