"""Statistics of a comparison ("Visual Causal-chain Bookmarking" (Selvakumar, 2026, arXiv:2610.24032), Sec. V-A4;
docs/papers/vcbm.md): pure functions over lists of numbers."""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
from scipy import stats


def describe(values: Sequence[float]) -> dict[str, float | int]:
    """Range, mean, sample standard deviation (ddof = 1, as the paper's "mean +- std") and median."""
    x = np.asarray(values, dtype=float)
    if x.size == 0:
        raise ValueError("describe() needs at least one value")
    return {
        "n": int(x.size),
        "min": float(x.min()),
        "max": float(x.max()),
        "mean": float(x.mean()),
        "std": float(x.std(ddof=1)) if x.size > 1 else 0.0,
        "median": float(np.median(x)),
    }


def tie_corrected_z(u: float, x: Sequence[float], y: Sequence[float]) -> float:
    """z = (U - n1 n2 / 2) / sigma with sigma^2 = n1 n2 / 12 ((n + 1) - sum_k (t_k^3 - t_k) / (n (n - 1))),
    t_k the sizes of the tie groups of the pooled sample; no continuity correction."""
    n1, n2 = len(x), len(y)
    n = n1 + n2
    _, tie_sizes = np.unique(np.concatenate([np.asarray(x, float), np.asarray(y, float)]), return_counts=True)
    tie_term = float((tie_sizes**3 - tie_sizes).sum()) / (n * (n - 1))
    sigma = math.sqrt(n1 * n2 / 12.0 * ((n + 1) - tie_term))
    return (u - n1 * n2 / 2.0) / sigma if sigma > 0 else 0.0


def mann_whitney(x: Sequence[float], y: Sequence[float]) -> dict[str, float | int]:
    """Unpaired two-sided Mann-Whitney U test, normal approximation with tie correction, via scipy.

    No continuity correction: the paper's z = -4.90 for U = 19 with 20 + 20 seeds is
    (19 - 200) / 36.97 (with the correction it would be -4.88). `U` is scipy's statistic for `x`
    (small when x tends to be smaller); `z` is negative then; the rank-biserial correlation
    r = 1 - 2 U / (n1 n2) is positive then (paper: U = 19, z = -4.90, r = 0.91).
    """
    if len(x) < 1 or len(y) < 1:
        raise ValueError(f"Mann-Whitney needs two non-empty samples; got sizes {len(x)} and {len(y)}")
    result = stats.mannwhitneyu(x, y, alternative="two-sided", method="asymptotic", use_continuity=False)
    u = float(result.statistic)
    n1, n2 = len(x), len(y)
    return {
        "n1": n1,
        "n2": n2,
        "U": u,
        "U_min": min(u, n1 * n2 - u),
        "z": tie_corrected_z(u, x, y),
        "p": None if math.isnan(result.pvalue) else float(result.pvalue),  # NaN when every value ties
        "rank_biserial_r": 1.0 - 2.0 * u / (n1 * n2),
        "method": "scipy.stats.mannwhitneyu, two-sided, asymptotic, tie-corrected, no continuity correction",
    }
