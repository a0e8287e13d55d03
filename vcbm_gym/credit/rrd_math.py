"""RRD's reward-model maths written once for every array module (numpy, or jax.numpy for `backend: jax`): the
forward pass of `RewardModel`'s parameters and the per-episode terms of the L_Rand-RD loss (Randomized Return
Decomposition, Ren et al., ICLR 2022, Sec. 4). vcbm_gym/credit/rrd.py and rrd_jax.py both read them from here."""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np


class LossTerms(NamedTuple):
    """`loss_terms`' per-episode values (B,): the surrogate and correction terms, and what their gradient reads."""

    surrogate: Any  # (G_i - T_i/n_i sum_{t in I_i} r_t)^2, per-step weighted
    correction: Any  # coef_i * s_i^2
    residual: Any  # G_i - T_i/n_i sum_{t in I_i} r_t
    centred: Any  # (B, K) r_t - mean_{I_i} r on the sampled steps, 0 elsewhere
    n: Any  # n_i, the real samples
    dof: Any  # n_i - 1 (1 where n_i < 2)
    coef: Any  # T_i^2 (1 - n_i/T_i) / n_i (0 where n_i < 2), per-step weighted
    weight: Any  # 1 / T_i^2 with per_step, else 1


def loss_terms(r: Any, m: Any, t: Any, g: Any, per_step: bool, xp: Any = np) -> LossTerms:
    """`rrd_loss`'s per-episode terms of rewards r (B, K), float mask m (B, K), lengths t (B,) and returns g (B,), in
    array module `xp` (numpy, or jax.numpy for rrd_jax.py: one formula for both backends)."""
    n = m.sum(axis=1)
    total = (r * m).sum(axis=1)
    residual = g - t / n * total
    centred = (r - (total / n)[:, None]) * m
    has_var = n > 1
    dof = xp.where(has_var, n - 1.0, 1.0)
    weight = 1.0 / t**2 if per_step else xp.ones_like(t)
    coef = xp.where(has_var, t**2 * (1.0 - n / t) / n, 0.0) * weight  # correction_i = coef_i * s_i^2
    correction = coef * (centred**2).sum(axis=1) / dof
    return LossTerms(residual**2 * weight, correction, residual, centred, n, dof, coef, weight)


def mlp_forward(params: list[np.ndarray], features: np.ndarray, xp: Any = np) -> tuple[np.ndarray, list[np.ndarray]]:
    """r_theta of (..., F) features with `RewardModel`'s parameters [W_1, b_1, ..., W_L, b_L]: (rewards (...), activations);
    `xp` the array module (numpy, or jax.numpy for rrd_jax.py)."""
    activations = [features]
    h = features
    for layer in range(0, len(params), 2):
        h = h @ params[layer].T + params[layer + 1]
        if layer + 2 < len(params):
            h = xp.maximum(h, 0.0)
        activations.append(h)
    return h[..., 0], activations
