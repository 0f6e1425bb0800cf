"""Counters that add and subtract field by field: a window's figures are the difference of two
running totals, and replicas' figures the sum of theirs (monotonic sums, never ratios)."""

from __future__ import annotations

from dataclasses import Field, fields
from typing import Any, ClassVar, Self


class Fieldwise:
    """Mixed into a frozen dataclass whose fields are all numbers: `a + b`, `a - b` field by
    field."""

    __slots__ = ()
    __dataclass_fields__: ClassVar[dict[str, Field[Any]]]

    def __add__(self, other: Self) -> Self:
        return type(self)(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))

    def __sub__(self, other: Self) -> Self:
        return type(self)(*(getattr(self, f.name) - getattr(other, f.name) for f in fields(self)))
