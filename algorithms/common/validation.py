"""Range checks for hyperparameters, declared beside the dataclass fields they guard.

A config dataclass that inherits `Validated` lists `RANGES = {field: Range(...)}`; its
`__post_init__` (inherited) rejects NaN, infinities and out-of-range values with one line, so a
bad value is caught where it enters, whether it came from a YAML file or from Python.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, ClassVar, Mapping

from algorithms.common.errors import ConfigError


@dataclass(frozen=True)
class Range:
    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False  # lo itself excluded
    hi_open: bool = False
    optional: bool = False  # None allowed

    def describe(self) -> str:
        parts = []
        if self.lo is not None and self.hi is not None:
            parts.append(f"in {'(' if self.lo_open else '['}{self.lo:g}, {self.hi:g}{')' if self.hi_open else ']'}")
        elif self.lo is not None:
            parts.append(f"{'>' if self.lo_open else '>='} {self.lo:g}")
        elif self.hi is not None:
            parts.append(f"{'<' if self.hi_open else '<='} {self.hi:g}")
        text = "a finite number" + (" " + " and ".join(parts) if parts else "")
        return text + (" (or null)" if self.optional else "")

    def contains(self, value: Any) -> bool:
        if value is None:
            return self.optional
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return False
        if self.lo is not None and (value <= self.lo if self.lo_open else value < self.lo):
            return False
        if self.hi is not None and (value >= self.hi if self.hi_open else value > self.hi):
            return False
        return True


POSITIVE = Range(0, lo_open=True)
NON_NEGATIVE = Range(0)
AT_LEAST_ONE = Range(1)
UNIT = Range(0, 1)  # a probability or a rate
UNIT_POSITIVE = Range(0, 1, lo_open=True)


def check_value(name: str, value: Any, allowed: Range) -> None:
    if not allowed.contains(value):
        raise ConfigError(f"hyperparameter {name}={value!r}: expected {allowed.describe()}")


def check_finite(name: str, value: Any) -> None:
    """NaN and infinities anywhere in a (nested) value; what they would break is never obvious."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"hyperparameter {name}={value!r}: expected a finite number")
    if isinstance(value, Mapping):
        for key, item in value.items():
            check_finite(f"{name}.{key}", item)
    elif isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            check_finite(f"{name}[{i}]", item)


def validate_fields(obj: Any, ranges: Mapping[str, Range]) -> None:
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if f.name in ranges:
            check_value(f.name, value, ranges[f.name])
        else:
            check_finite(f.name, value)


class Validated:
    """Mixin for config dataclasses: `RANGES` of every class in the MRO are checked after init."""

    RANGES: ClassVar[dict[str, Range]] = {}

    def __post_init__(self) -> None:
        ranges: dict[str, Range] = {}
        for cls in reversed(type(self).__mro__):
            ranges.update(cls.__dict__.get("RANGES", {}))
        validate_fields(self, ranges)
