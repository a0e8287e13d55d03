"""Welford running mean and variance (paper 000, Eq. 11) and the bookmark action z-test."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass
class Welford:
    """Eq. 11: mu_n = mu_{n-1} + (G - mu_{n-1}) / n;  M2_n = M2_{n-1} + (G - mu_{n-1})(G - mu_n)."""

    n: int = 0
    mean: float = 0.0
    m2: float = 0.0

    def update(self, value: float) -> None:
        self.n += 1
        delta = value - self.mean
        self.mean += delta / self.n
        self.m2 += delta * (value - self.mean)

    @property
    def variance(self) -> float:
        """Unbiased sample variance M2 / (n - 1); 0 with fewer than two samples."""
        return self.m2 / (self.n - 1) if self.n > 1 else 0.0

    @property
    def standard_error(self) -> float:
        """SE = sqrt(M2 / (n (n - 1))); infinite with fewer than two samples."""
        return math.sqrt(self.m2 / (self.n * (self.n - 1))) if self.n > 1 else math.inf


def two_sample_z(a: Welford, b: Welford) -> float:
    """Sec. IV-A4: z = |mu_0 - mu_1| / sqrt(SE_0^2 + SE_1^2).

    The paper prints SE_0^2 + SE_0^2, a typo (SPEC section 2). When both standard errors are 0
    (e.g. two constant returns) z is infinite if the means differ and 0 if they are equal.
    """
    se = math.sqrt(a.standard_error**2 + b.standard_error**2)
    diff = abs(a.mean - b.mean)
    if se == 0.0:
        return math.inf if diff > 0 else 0.0
    return diff / se
