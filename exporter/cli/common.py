"""What every verb module shares."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TypeAlias

from exporter.core.durations import parse_seconds

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports it
# what each verb module's register() gets: the `add_parser` of `specdec <verb>`'s subparsers
AddVerb: TypeAlias = Callable[..., argparse.ArgumentParser]


def duration(text: str) -> float:
    """argparse type of a duration flag: seconds (2.5) or Prometheus' grammar (500ms, 1m30s)."""
    try:
        return parse_seconds(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
