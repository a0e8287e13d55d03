"""Statistics of a comparison ("Visual Causal-chain Bookmarking" (Selvakumar, 2026, arXiv:2610.24032), Sec. V-A4;
docs/papers/vcbm.md) and the aggregate metrics with bootstrap confidence intervals of "Deep Reinforcement Learning
at the Edge of the Statistical Precipice" (Agarwal et al., NeurIPS 2021): pure functions over lists of numbers."""

from __future__ import annotations

import math
from typing import Any, Sequence

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


# --- Aggregate metrics with bootstrap confidence intervals ("Deep Reinforcement Learning at the Edge of the
# Statistical Precipice", Agarwal et al., NeurIPS 2021: median, IQM, mean, probability of improvement) ---

N_RESAMPLES = 10_000
CONFIDENCE = 0.95
BOOTSTRAP_SEED = 0  # fixed: the same runs always give the same intervals (results.json is reproducible)
BOOTSTRAP_METHOD = "percentile"  # rliable's default; BCa fails on samples where many runs tie (e.g. at the cap)


def iqm(values: Any, axis: int = -1) -> Any:
    """Interquartile mean: the mean of the middle 50% (scipy's trim_mean, 25% cut at each end, as rliable)."""
    return stats.trim_mean(values, 0.25, axis=axis)


def _median(values: Any, axis: int = -1) -> Any:
    return np.median(values, axis=axis)


def _mean(values: Any, axis: int = -1) -> Any:
    return np.mean(values, axis=axis)


AGGREGATES = {"median": _median, "iqm": iqm, "mean": _mean}


def probability_of_improvement(x: Any, y: Any, lower_is_better: bool, axis: int = -1) -> Any:
    """P(X better than Y) + P(X = Y) / 2 over independent draws of a run of each method: the
    Mann-Whitney U of the better direction normalised by n1 n2 (rliable's probability of
    improvement). Computed from the ranks of the pooled sample (ties get average ranks), along `axis`."""
    x, y = np.moveaxis(np.asarray(x, float), axis, -1), np.moveaxis(np.asarray(y, float), axis, -1)
    n1, n2 = x.shape[-1], y.shape[-1]
    ranks = stats.rankdata(np.concatenate((x, y), axis=-1), axis=-1)
    u_x = ranks[..., :n1].sum(axis=-1) - n1 * (n1 + 1) / 2.0  # pairs with x > y, ties count 1/2
    p_x_greater = u_x / (n1 * n2)
    return 1.0 - p_x_greater if lower_is_better else p_x_greater


def _interval(data: tuple[np.ndarray, ...], statistic: Any) -> tuple[float, float] | None:
    """Percentile bootstrap CI, each sample resampled on its own (unpaired); None when a sample has < 2 runs."""
    if min(len(d) for d in data) < 2:
        return None
    result = _bootstrap(data, statistic, N_RESAMPLES)
    return float(result.confidence_interval.low), float(result.confidence_interval.high)


def _bootstrap(data: tuple[np.ndarray, ...], statistic: Any, n_resamples: int) -> Any:
    """scipy's bootstrap at this module's confidence, method and seed, the statistic vectorized over the last axis."""
    return stats.bootstrap(
        data,
        statistic,
        n_resamples=n_resamples,
        confidence_level=CONFIDENCE,
        method=BOOTSTRAP_METHOD,
        vectorized=True,
        axis=-1,
        rng=np.random.default_rng(BOOTSTRAP_SEED),
    )


def _estimate(point: float, interval: tuple[float, float] | None) -> dict[str, float | None]:
    low, high = interval if interval is not None else (None, None)
    return {"estimate": float(point), "ci_low": low, "ci_high": high}


def aggregate_estimates(values: Sequence[float]) -> dict[str, dict[str, float | None]]:
    """Median, IQM and mean of one method's runs, each with its bootstrap 95% CI (runs resampled with
    replacement; with a single task, rliable's stratified bootstrap is exactly this)."""
    x = np.asarray(values, dtype=float)
    if x.size == 0:
        raise ValueError("aggregate_estimates() needs at least one value")
    return {name: _estimate(f(x), _interval((x,), f)) for name, f in AGGREGATES.items()}


def improvement_estimate(x: Sequence[float], y: Sequence[float], lower_is_better: bool) -> dict[str, float | None]:
    """Probability of improvement of x over y with its bootstrap 95% CI (both samples resampled independently)."""
    a, b = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if a.size == 0 or b.size == 0:
        raise ValueError(f"probability of improvement needs two non-empty samples; got sizes {a.size} and {b.size}")

    def statistic(s: np.ndarray, t: np.ndarray, axis: int = -1) -> np.ndarray:
        return probability_of_improvement(s, t, lower_is_better, axis=axis)

    return _estimate(statistic(a, b), _interval((a, b), statistic))


def fraction_estimate(successes: int, n: int) -> dict[str, float | None]:
    """A fraction with its exact (Clopper-Pearson) 95% CI, scipy.stats.binomtest."""
    if n < 1 or not 0 <= successes <= n:
        raise ValueError(f"fraction {successes}/{n}: expected 0 <= successes <= n and n >= 1")
    ci = stats.binomtest(successes, n).proportion_ci(CONFIDENCE, method="exact")
    return {"estimate": successes / n, "ci_low": float(ci.low), "ci_high": float(ci.high)}


def bootstrap_description() -> dict[str, Any]:
    return {
        "library": "scipy.stats.bootstrap",
        "method": BOOTSTRAP_METHOD,
        "n_resamples": N_RESAMPLES,
        "confidence_level": CONFIDENCE,
        "rng_seed": BOOTSTRAP_SEED,
        "strata": "one task (the env): the stratified bootstrap resamples each method's seeds with replacement; "
        "for the probability of improvement the two methods' seeds are resampled independently",
        "fraction_converged_ci": "exact Clopper-Pearson (scipy.stats.binomtest)",
    }


def mean_ci_curves(curves: np.ndarray, n_resamples: int = 2_000) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per column of `curves` (runs x points): the mean across runs and its percentile bootstrap 95% CI
    (all columns at once, the same resampled runs in every column). One run: the CI is the curve itself."""
    curves = np.asarray(curves, dtype=float)
    mean = curves.mean(axis=0)
    if curves.shape[0] < 2:
        return mean, mean.copy(), mean.copy()
    result = _bootstrap((curves.T,), _mean, n_resamples)
    return mean, np.asarray(result.confidence_interval.low), np.asarray(result.confidence_interval.high)
