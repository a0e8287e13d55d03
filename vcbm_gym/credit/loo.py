"""Leave-one-out advantage of LOOP (Chen et al., "Reinforcement Learning for Long-Horizon Interactive LLM
Agents", 2025, arXiv:2502.01600), as Eq. 6 of "Visual Causal-chain Bookmarking" (Selvakumar, 2026,
arXiv:2610.24032, Sec. II-C) writes it."""

from __future__ import annotations

import numpy as np

from vcbm_gym.credit.base import CreditRule, EpisodeBatch


def loo_advantages(returns: np.ndarray, group_ids: np.ndarray | None = None) -> np.ndarray:
    """Eq. 6: A_k = G_k - mean_{j != k} G_j, over the K rollouts of the same task (group).

    Equivalently K/(K-1) * (G_k - mean_j G_j). A group of one rollout has no baseline: A = 0.
    """
    returns = np.asarray(returns, dtype=np.float64)
    groups = np.zeros(len(returns), dtype=np.int64) if group_ids is None else np.asarray(group_ids)
    advantages = np.zeros_like(returns)
    for g in np.unique(groups):
        idx = groups == g
        k = int(idx.sum())
        if k > 1:
            total = returns[idx].sum()
            advantages[idx] = returns[idx] - (total - returns[idx]) / (k - 1)
    return advantages


class LeaveOneOutRule(CreditRule):
    """Every step of rollout k gets the LOO advantage A_k of its episode (LOOP)."""

    name = "loo"
    batch_needs = ("group_ids",)

    def advantages(self, batch: EpisodeBatch) -> np.ndarray:
        return batch.broadcast(loo_advantages(batch.returns, batch.group_ids))
