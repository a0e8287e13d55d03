"""Two credit rules, one of each kind: `decayed_return` emits advantages, `even_split` emits rewards."""

from __future__ import annotations

import numpy as np

from vcbm_gym.credit.base import CreditRule, EpisodeBatch, RewardRule


class DecayedReturnRule(CreditRule):
    """A_t = (G - b) w_t: the episode's advantage over a running mean b of the returns, weighted towards its last
    steps (w_t = decay^(steps after t), scaled to average 1 over the episode's trained steps)."""

    name = "decayed_return"

    def __init__(self, decay: float = 0.9) -> None:
        if not 0.0 < decay <= 1.0:
            raise ValueError(f"decay={decay!r}: expected a number in (0, 1]")
        self.decay, self.count, self.mean = float(decay), 0, 0.0

    def advantages(self, batch: EpisodeBatch) -> np.ndarray:
        trained = batch.mask.sum(axis=1, keepdims=True)
        after = trained - np.cumsum(batch.mask, axis=1)  # trained steps after each step (holes in the mask allowed)
        weights = np.where(batch.mask, self.decay**after, 0.0)
        weights *= trained / np.maximum(weights.sum(axis=1, keepdims=True), 1e-12)
        baseline = self.mean if self.count else batch.returns.mean()  # no returns seen yet: the batch's own mean
        return weights * (batch.returns - baseline)[:, None]

    def observe(self, batch: EpisodeBatch) -> None:  # learns after the batch's credit, never inside `advantages`
        for g in batch.returns:
            self.count += 1
            self.mean += (float(g) - self.mean) / self.count

    def state_dict(self) -> dict:
        return {"count": self.count, "mean": self.mean}

    def load_state_dict(self, state: dict) -> None:
        self.count, self.mean = int(state["count"]), float(state["mean"])


class EvenSplitRule(RewardRule):
    """r_t = G / n on each of an episode's n trained steps: the return spread evenly, a return decomposition that
    any learner's own estimator (TD targets, GAE, a replay buffer) can take in place of the env's delayed reward."""

    name = "even_split"

    def rewards(self, batch: EpisodeBatch) -> np.ndarray:
        return batch.broadcast(batch.returns / np.maximum(batch.mask.sum(axis=1), 1))
