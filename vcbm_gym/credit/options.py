"""The credit rules' constructor options, checked as they are given.

Options arrive from YAML and the command line, where `false`, `'false'`, `64`, `'64'` and `2.9` all look
alike. Coercing them hides the mistake: bool('false') is True, tuple('64') is ('6', '4'), int(2.9) is 2.
So a flag must be a bool, a count an integer, a number a finite real; anything else is one ValueError
line naming the option, the value and what was expected (the arms turn it into their one-line error).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np


def flag(name: str, value: Any) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name}={value!r}: expected true or false")
    return bool(value)


def integer(name: str, value: Any, lo: int) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < lo:
        raise ValueError(f"{name}={value!r}: expected an integer >= {lo}")
    return int(value)


def optional_integer(name: str, value: Any, lo: int) -> int | None:
    if value is None:
        return None
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < lo:
        raise ValueError(f"{name}={value!r}: expected null or an integer >= {lo}")
    return int(value)


def number(
    name: str,
    value: Any,
    lo: float | None = None,
    hi: float | None = None,
    *,
    above: float | None = None,
    below: float | None = None,
) -> float:
    """A finite real with lo <= value <= hi, above < value < below (an infinite learning rate or scale would only
    fail later, far from here)."""
    real = not isinstance(value, (bool, np.bool_)) and isinstance(value, (int, float, np.integer, np.floating))
    inside = (
        real
        and math.isfinite(value)
        and (lo is None or value >= lo)
        and (hi is None or value <= hi)
        and (above is None or value > above)
        and (below is None or value < below)
    )
    if not inside:
        raise ValueError(f"{name}={value!r}: expected {describe(lo, hi, above, below)}")
    return float(value)


def describe(lo: float | None, hi: float | None, above: float | None, below: float | None) -> str:
    low = f"[{lo:g}" if lo is not None else (None if above is None else f"({above:g}")
    high = f"{hi:g}]" if hi is not None else (None if below is None else f"{below:g})")
    if low and high:
        return f"a number in {low}, {high}"
    if low:
        return f"a finite number {'>=' if lo is not None else '>'} {low[1:]}"
    if high:
        return f"a finite number {'<=' if hi is not None else '<'} {high[:-1]}"
    return "a finite number"


def layer_widths(name: str, value: Any) -> tuple[int, ...]:
    """A list of integer widths >= 1 ([] for none); a bare integer is one layer."""
    widths = (value,) if isinstance(value, (int, np.integer)) else value
    if not isinstance(widths, (list, tuple)) or not all(
        isinstance(h, (int, np.integer)) and not isinstance(h, (bool, np.bool_)) and h >= 1 for h in widths
    ):
        raise ValueError(f"{name}={value!r}: expected a list of integer layer widths >= 1 (or [] for a linear model)")
    return tuple(int(h) for h in widths)
