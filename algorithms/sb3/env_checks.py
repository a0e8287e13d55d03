"""What an SB3 run checks of its env's steps that SB3 itself would get wrong."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from algorithms.common.errors import VcbmGymError
from vcbm_gym.contract import env_name

FLOAT32_MAX = float(np.finfo(np.float32).max)


class Float32Rewards(gym.Wrapper):
    """Refuses, in one line, a finite reward beyond float32: SB3's vector env and buffers store rewards as float32,
    where it would become infinite (and the run end blaming the env for a NaN or infinite reward it never returned)."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self._episode, self._step = 0, 0

    def reset(self, **kwargs: Any):
        self._episode, self._step = self._episode + 1, 0
        return self.env.reset(**kwargs)

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self._step += 1
        if abs(float(reward)) > FLOAT32_MAX:
            raise VcbmGymError(
                f"env {env_name(self.env)} returned reward {float(reward):g} at step {self._step} of episode "
                f"{self._episode}: SB3 stores rewards as float32, whose largest magnitude is {FLOAT32_MAX:.3g}; "
                "expected rewards within it (scale the env's rewards, e.g. gymnasium.wrappers.TransformReward)"
            )
        return obs, reward, terminated, truncated, info
