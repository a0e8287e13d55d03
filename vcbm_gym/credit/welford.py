"""Welford running mean and variance (Welford, Technometrics 1962, as Eq. 11 of
"Visual Causal-chain Bookmarking" (Selvakumar, 2026, arXiv:2610.24032)), the bookmark action z-test, and (vcbm-plus,
beyond the paper) Welford co-moments for a control-variate mean."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


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

    The paper prints SE_0^2 + SE_0^2, a typo (docs/papers/vcbm.md, "Tabular VCBM"). When both standard errors are 0
    (e.g. two constant returns) z is infinite if the means differ and 0 if they are equal.
    """
    return z_statistic(a.mean, a.standard_error, b.mean, b.standard_error)


def z_statistic(mean0: float, se0: float, mean1: float, se1: float) -> float:
    """`two_sample_z` from means and standard errors."""
    se = math.sqrt(se0**2 + se1**2)
    diff = abs(mean0 - mean1)
    if se == 0.0:
        return math.inf if diff > 0 else 0.0
    return diff / se


class RegressionWelford:
    """Welford co-moments of (x, y): x a vector of covariates, y the return (vcbm-plus, beyond the paper).

    mu_x += dx / n, mu_y += dy / n, C_xx += dx (x - mu_x)^T, C_xy += dx (y - mu_y), C_yy += dy (y - mu_y),
    with dx = x - mu_x and dy = y - mu_y taken before the update (Eq. 11's recursion, per coordinate pair).
    `adjusted(columns, x_mean)` is the control-variate (regression-adjusted) estimate of E[y].
    """

    def __init__(self, dim: int) -> None:
        self.n = 0
        self.mean_x = np.zeros(dim)
        self.mean_y = 0.0
        self.c_xx = np.zeros((dim, dim))
        self.c_xy = np.zeros(dim)
        self.c_yy = 0.0

    def update(self, x: np.ndarray, y: float) -> None:
        self.n += 1
        dx, dy = x - self.mean_x, y - self.mean_y
        self.mean_x = self.mean_x + dx / self.n
        self.mean_y += dy / self.n
        self.c_xx += np.outer(dx, x - self.mean_x)
        self.c_xy += dx * (y - self.mean_y)
        self.c_yy += dy * (y - self.mean_y)

    def adjusted(self, columns: list[int], x_mean: np.ndarray) -> tuple[float, float]:
        """(mean, standard error) of y at x = x_mean, regressing y on x[columns] (least squares):

        mean = mu_y - beta . (mu_x - x_mean),  beta = C_xx^+ C_xy  (pseudo-inverse: a covariate that
        never varied gets no weight);  SE^2 = s^2 (1/n + d^T C_xx^+ d),  d = mu_x - x_mean,
        s^2 = (C_yy - beta . C_xy) / (n - 1 - rank). With no columns this is Welford's mean and SE.
        SE is infinite until the residual variance has a degree of freedom.
        """
        idx = np.asarray(columns, dtype=np.int64)
        eigenvalues, vectors = np.linalg.eigh(self.c_xx[np.ix_(idx, idx)])  # symmetric PSD: pinv by eigh
        keep = eigenvalues > 1e-9 * max(float(eigenvalues.max(initial=0.0)), 1e-300)
        vectors = vectors[:, keep]
        inv = (vectors / eigenvalues[keep]) @ vectors.T
        beta = inv @ self.c_xy[idx]
        d = self.mean_x[idx] - x_mean[idx]
        dof = self.n - 1 - int(keep.sum())
        if dof < 1:
            return float(self.mean_y - beta @ d), math.inf
        s2 = max(self.c_yy - float(beta @ self.c_xy[idx]), 0.0) / dof
        return float(self.mean_y - beta @ d), math.sqrt(s2 * (1.0 / self.n + float(d @ inv @ d)))
