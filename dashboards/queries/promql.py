"""A tiny PromQL helper: ratios the Prometheus way (sum the rates, then divide, with a `> 0`
guard so an idle denominator gives no sample instead of NaN or +Inf)."""

from __future__ import annotations


def by(labels: tuple[str, ...]) -> str:
    return f"by ({', '.join(labels)})" if labels else ""


def rate(metric: str, window: str, selector: str = "") -> str:
    return f"rate({metric}{{{selector}}}[{window}])" if selector else f"rate({metric}[{window}])"


def sum_rate(metric: str, window: str, labels: tuple[str, ...], selector: str = "") -> str:
    return f"sum {by(labels)} ({rate(metric, window, selector)})"


def ratio(numerator: str, denominator: str) -> str:
    """numerator / (denominator > 0): no sample where nothing happened."""
    return f"{numerator}\n/\n({denominator} > 0)"
