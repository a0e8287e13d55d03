"""Broadcast: the episode's return minus a baseline, the same on every step (REINFORCE with a
baseline; the "undifferentiated trajectory-level signal" of "Visual Causal-chain Bookmarking"
(Selvakumar, 2026, arXiv:2610.24032), Sec. II-C: Eq. 6 without leaving one out).

    A_{k,t} = G_k - b,   for every trained step t of episode k.

Baselines (constructor option `baseline`):
  "running_mean" (default): b = the mean of every return observed before this batch (credit comes before
      `observe`, CreditRule's order); the batch's own mean before the first observe
      (Welford's running mean, Eq. 11 of the same paper). Works with groups of one and single episodes.
  "batch_mean":  b = the mean return of this batch.
  "group_mean":  b = the mean return of the episode's group (GRPO without the std; see grpo.py).
  "given":       b = batch.extras["baseline"] (B,), supplied by the caller, e.g. an SB3 critic's
      V(s_0) of each episode (algorithms/sb3/callbacks.py): a state-dependent baseline.
  "none":        b = 0 (plain REINFORCE).
A state-independent baseline (running/batch mean) leaves PPO's clipped, sign-like update to
learn from the sign of G - b, which a brand-dependent optimum (WatchRepair) does not survive:
prefer "group_mean" with groups of equal start states, or "given".
"""

from __future__ import annotations

from typing import Any

import numpy as np

from vcbm_gym.credit.base import CreditRule, EpisodeBatch

BASELINES = ("running_mean", "batch_mean", "group_mean", "given", "none")
DEFAULT_BASELINE = "running_mean"  # Eq. 11's running mean of the returns (vcbm_bookmark's default too)


def group_means(returns: np.ndarray, group_ids: np.ndarray) -> np.ndarray:
    """(B,) mean return of each episode's group, broadcast back to its episodes."""
    _, inverse = np.unique(group_ids, return_inverse=True)
    sums = np.bincount(inverse, weights=returns)
    counts = np.bincount(inverse)
    return (sums / counts)[inverse]


class BroadcastRule(CreditRule):
    name = "broadcast"

    def __init__(self, baseline: str = DEFAULT_BASELINE) -> None:
        if baseline not in BASELINES:
            raise ValueError(f"baseline={baseline!r}: expected one of {', '.join(BASELINES)}")
        self.baseline = baseline
        self.count = 0
        self.mean = 0.0

    def needs(self) -> tuple[str, ...]:
        return {"group_mean": ("group_ids",), "given": ("extras['baseline']",)}.get(self.baseline, ())

    def observe(self, batch: EpisodeBatch) -> None:
        for g in batch.returns:  # Eq. 11, the mean only
            self.count += 1
            self.mean += (float(g) - self.mean) / self.count

    def episode_advantages(self, batch: EpisodeBatch) -> np.ndarray:
        """(B,) G_k - b: the per-episode advantage that `advantages` broadcasts."""
        returns = batch.returns
        if self.baseline == "running_mean":  # before any observe, the batch's own mean (0 would be no baseline)
            return returns - (self.mean if self.count else (returns.mean() if len(returns) else 0.0))
        if self.baseline == "batch_mean":
            return returns - returns.mean() if len(returns) else returns
        if self.baseline == "group_mean":
            return returns - group_means(returns, batch.group_ids)
        if self.baseline == "given":
            given = np.asarray(batch.extras.get("baseline", np.full(len(returns), np.nan)), dtype=np.float64)
            if given.shape != returns.shape or not np.isfinite(given).all():
                raise ValueError(f'baseline="given" reads batch.extras["baseline"]: expected {len(returns)} finite values')
            return returns - given
        return returns

    def advantages(self, batch: EpisodeBatch) -> np.ndarray:
        return batch.broadcast(self.episode_advantages(batch))

    def state_dict(self) -> dict[str, Any]:
        return {"count": self.count, "mean": self.mean}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if set(state) != {"count", "mean"}:
            raise ValueError(f"broadcast state keys {sorted(state)}: expected ['count', 'mean']")
        self.count, self.mean = int(state["count"]), float(state["mean"])
