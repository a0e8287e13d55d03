"""Per-step rewards from a rule's advantages: the form in which value-based learners (SB3's DQN, tabular
Q-learning and Monte Carlo) take a credit rule.

A rule gives per-step advantages A_t for a batch of episodes; the rewards handed to the learner are
their return-equivalent projection, the closest rewards to A (least squares) whose sum over an
episode's n trained steps is its return G:

    r'_t = A_t + (G - sum_s A_s) / n          (so sum_t r'_t = G)

Return equivalence keeps every policy's undiscounted return, hence the optimal policies (RUDDER,
Arjona-Medina et al. 2019, arXiv:1806.07857, Theorem 1); use gamma = 1 for the equivalence to hold
exactly. What changes is where the reward sits: vcbm_bookmark moves most of G - b onto the bookmark
step and rudder moves it to the steps its LSTM predicts, so a learner needs fewer bootstrap steps to
see it. Rules whose advantage is one constant per episode (broadcast, loo, grpo, ircr) redistribute
to the uniform G / n: their baselines are offsets that cancel in the projection.
"""

from __future__ import annotations

import numpy as np


def return_equivalent_rewards(advantages: np.ndarray, mask: np.ndarray, returns: np.ndarray) -> np.ndarray:
    """(B, T) r'_t = A_t + (G - sum_s A_s) / n on masked steps, 0 elsewhere.

    Near the float limit (returns of +-1e308) sum_s A_s or G - sum_s A_s can overflow though every A_t, G
    and r'_t is finite; there each episode is projected in units of its largest |A_t| or |G|.
    """
    with np.errstate(over="ignore", invalid="ignore"):
        plain = _projection(advantages, mask, returns)
    if np.isfinite(plain).all():
        return plain
    size = np.maximum(np.abs(np.where(mask, advantages, 0.0)).max(axis=1, initial=0.0), np.abs(returns))
    size = np.where(np.isfinite(size) & (size > 0), size, 1.0)
    with np.errstate(over="ignore", invalid="ignore"):  # what is left over is an r'_t beyond the float range
        return _projection(advantages / size[:, None], mask, returns / size) * size[:, None]


def _projection(advantages: np.ndarray, mask: np.ndarray, returns: np.ndarray) -> np.ndarray:
    n = mask.sum(axis=1)
    residual = np.divide(returns - np.where(mask, advantages, 0.0).sum(axis=1), n, out=np.zeros(len(n)), where=n > 0)
    return np.where(mask, advantages + residual[:, None], 0.0)
