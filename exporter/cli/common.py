"""What the verb modules under exporter/cli/ share (what every verb is: exporter/verbs.py)."""

from __future__ import annotations

import argparse

from exporter.core.durations import parse_seconds


def duration(text: str) -> float:
    """argparse type of a duration flag: seconds (2.5) or Prometheus' grammar (500ms, 1m30s)."""
    try:
        return parse_seconds(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
