"""Redistributed rewards for off-policy SB3 (DQN): a replay buffer that holds each episode back.

Why not a Gymnasium reward wrapper: a rule's credit for step t depends on the episode's return,
known only at its end, while SB3 stores transition t in the replay buffer as soon as `step`
returns; a wrapper cannot take back the reward it already emitted. The correct form is to delay
the episode: `EpisodeRedistributionBuffer` keeps the transitions of the running episode aside
and, when it ends, writes them all with redistributed rewards, so DQN never samples a
transition whose reward is not final.

Redistribution: the rule gives per-step advantages A_t for the (single-episode) batch; the
reward written is their return-equivalent projection, the closest rewards to A (least squares)
whose sum is the episode return G:

    r'_t = A_t + (G - sum_s A_s) / n          (so sum_t r'_t = G)

Return equivalence keeps every policy's undiscounted return, hence the optimal policies (RUDDER,
Arjona-Medina et al. 2019, Theorem 1); use gamma = 1 for the equivalence to hold exactly. What
changes is where the reward sits: vcbm_bookmark moves most of G - b onto the bookmark step and
rudder moves it to the steps its LSTM predicts, so Q-learning needs fewer bootstrap steps to see
it. Rules whose advantage is one constant per episode (broadcast, loo, grpo) redistribute to the
uniform G / n: their baselines are offsets that cancel in the projection.
Single environment only (the buffer writes whole episodes at its position).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from stable_baselines3.common.buffers import ReplayBuffer

from vcbm_gym.credit.base import CreditRule, EpisodeBatch
from vcbm_gym.credit.redistribute import return_equivalent_rewards


class EpisodeRedistributionBuffer(ReplayBuffer):
    """ReplayBuffer whose episodes enter at their end, with rewards redistributed by `rule`."""

    def __init__(self, *args: Any, rule: CreditRule, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.n_envs != 1:
            raise ValueError(f"n_envs={self.n_envs}: EpisodeRedistributionBuffer expects a single environment")
        self.rule = rule
        self._pending: list[tuple[np.ndarray, np.ndarray, np.ndarray, float, np.ndarray, list[dict]]] = []
        self.last_redistributed: np.ndarray | None = None

    def add(self, obs, next_obs, action, reward, done, infos) -> None:  # type: ignore[override]
        self._pending.append(
            (np.array(obs), np.array(next_obs), np.array(action), float(np.asarray(reward).reshape(-1)[0]), np.array(done), infos)
        )
        if bool(np.asarray(done).reshape(-1)[0]):
            self._flush()

    def _flush(self) -> None:
        obs = np.stack([p[0].reshape(self.obs_shape) for p in self._pending])[None]
        actions = np.stack([p[2].reshape(-1) for p in self._pending])[None]
        actions = actions[..., 0] if actions.shape[-1] == 1 else actions
        rewards = np.array([[p[3] for p in self._pending]])
        batch = EpisodeBatch(rewards, np.ones_like(rewards, dtype=bool), observations=obs, actions=actions)
        self.rule.observe(batch)
        redistributed = return_equivalent_rewards(self.rule.advantages(batch), batch.mask, batch.returns)[0]
        for (o, no, a, _, d, infos), r in zip(self._pending, redistributed):
            super().add(o, no, a, np.array([r], dtype=np.float32), d, infos)
        self.last_redistributed = redistributed
        self._pending = []
