"""Group-relative advantage of GRPO (Shao et al. 2024, DeepSeekMath Eq. 3 outcome supervision):

    A_k = (G_k - mean_{j in group(k)} G_j) / (std_{j in group(k)} G_j + eps)     (normalise_std)
    A_k =  G_k - mean_{j in group(k)} G_j                                         (otherwise)

broadcast to every trained step of episode k. The std is the unbiased sample std (ddof=1), as
TRL's GRPOTrainer computes it; a group of one has no baseline and gets A = 0 (like loo.py).
Unlike LOO (Eq. 6 of "Visual Causal-chain Bookmarking" (Selvakumar, 2026, arXiv:2610.24032)),
the episode's own return is inside its baseline.
"""

from __future__ import annotations

import numpy as np

import vcbm_gym.credit.options as options
from vcbm_gym.credit.base import CreditRule, EpisodeBatch

# Written once for GRPO's and GiGPO's group normalisation (functions and rules alike).
NORMALISE_STD = True  # divide by the group's std (DeepSeekMath Eq. 3); False: centre only
STD_EPS = 1e-4  # added to the std, so that a group of equal returns gets 0, not 0/0


def group_relative_advantages(
    returns: np.ndarray, group_ids: np.ndarray, normalise_std: bool = NORMALISE_STD, eps: float = STD_EPS
) -> np.ndarray:
    returns = np.asarray(returns, dtype=np.float64)
    advantages = np.zeros_like(returns)
    for g in np.unique(group_ids):
        idx = np.asarray(group_ids) == g
        if idx.sum() < 2:
            continue
        centred = returns[idx] - returns[idx].mean()
        advantages[idx] = centred / (returns[idx].std(ddof=1) + eps) if normalise_std else centred
    return advantages


class GroupMeanRule(CreditRule):
    name = "grpo"
    batch_needs = ("group_ids",)

    def __init__(self, normalise_std: bool = NORMALISE_STD, eps: float = STD_EPS) -> None:
        self.normalise_std = options.flag("normalise_std", normalise_std)
        self.eps = options.number("eps", eps, 0)

    def advantages(self, batch: EpisodeBatch) -> np.ndarray:
        return batch.broadcast(group_relative_advantages(batch.returns, batch.group_ids, self.normalise_std, self.eps))
