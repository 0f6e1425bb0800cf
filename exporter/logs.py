"""structlog setup: JSON lines when stdout is not a terminal, readable console lines when it is."""

from __future__ import annotations

import logging
import sys

import structlog


def setup(level: str = "info") -> None:
    renderer: structlog.types.Processor = (
        structlog.dev.ConsoleRenderer()
        if sys.stdout.isatty()
        else structlog.processors.JSONRenderer()
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        logger_factory=_current_stdout,
        cache_logger_on_first_use=False,
    )


def _current_stdout(*_: object) -> structlog.PrintLogger:
    """A logger printing to sys.stdout as it is now: a stream bound once at setup outlives a
    replaced and closed stdout (an in-process caller's, a test's capture) and fails every line
    after it. Made per log call (`cache_logger_on_first_use=False`); lines are few."""
    return structlog.PrintLogger(sys.stdout)


def get(name: str) -> structlog.stdlib.BoundLogger:
    logger: structlog.stdlib.BoundLogger = structlog.get_logger(name)
    return logger
