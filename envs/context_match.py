"""ContextMatch: the first action pays only where it matches a context bit.

A test bed for VCBM's causal test (docs/papers/vcbm.md, "The context test"), not a task of the VCBM paper.
At reset a context bit is drawn (1 with probability `context_prob`) and stays for the episode. The first
action sets a flag to 1 if it equals the context bit, else the flag stays 0; later actions change nothing.
After the last action the episode pays `match_reward` if the flag is set, plus N(0, reward_noise_sd^2)
noise either way; every other step pays 0. `n_distractors` bits are redrawn uniformly every step.

Observation: [context, flag, timestep, distractors...] as `MultiDiscrete([2, 2, T + 1, 2, ...])`;
actions 0 and 1. Ground-truth roles: static, controlled, clock, noise.

Why it exists: with the context bit uniform, the flag changes on the first step of half of the episodes
under either action and always arrives at 1, so the rate at which it changes (the paper's Eq. 10) and the
rate at which it arrives at each value (the value test) are the same under both actions: both tests call
it noise, though the action decides it in every episode. Within one context the action's effect is plain.

`info` carries `context` and `optimal_first_action` (= the context bit), and once the first decision is
made `first_decision_optimal`; the last step also carries SB3's `is_success` (the same flag). All are for
evaluation only (the env contract, vcbm_gym/contract.py).
"""

from __future__ import annotations

import math
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

COMPONENT_NAMES = ("context", "flag", "timestep")
GROUND_TRUTH_ROLES = ("static", "controlled", "clock")  # then "noise" for every distractor


def _check_int(name: str, value: Any, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise ValueError(f"{name}={value!r}: expected an integer >= {low}")
    return int(value)


def _check_real(name: str, value: Any, low: float | None = None, high: float | None = None) -> float:
    ok = not isinstance(value, bool) and isinstance(value, (int, float, np.integer, np.floating)) and math.isfinite(value)
    if not ok or (low is not None and value < low) or (high is not None and value > high):
        bounds = f" in [{low}, {high}]" if high is not None else (f" >= {low}" if low is not None else "")
        raise ValueError(f"{name}={value!r}: expected a finite real number{bounds}")
    return float(value)


class ContextMatchEnv(gym.Env):
    """The task of the module docstring; every constant is a constructor argument."""

    metadata = {"render_modes": ["ansi"], "render_fps": 4}

    def __init__(
        self,
        horizon: int = 10,
        context_prob: float = 0.5,
        match_reward: float = 1.0,
        reward_noise_sd: float = 1.0,
        n_distractors: int = 2,
        render_mode: str | None = None,
    ) -> None:
        self.horizon = _check_int("horizon", horizon, 1)
        self.context_prob = _check_real("context_prob", context_prob, 0.0, 1.0)
        self.match_reward = _check_real("match_reward", match_reward)
        self.reward_noise_sd = _check_real("reward_noise_sd", reward_noise_sd, 0.0)
        self.n_distractors = _check_int("n_distractors", n_distractors, 0)
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode={render_mode!r}: expected one of {self.metadata['render_modes']}")
        self.render_mode = render_mode
        self.observation_space = spaces.MultiDiscrete([2, 2, self.horizon + 1] + [2] * self.n_distractors, dtype=np.int64)
        self.action_space = spaces.Discrete(2)
        self.component_names = COMPONENT_NAMES + tuple(f"distractor_{i}" for i in range(self.n_distractors))
        self._context, self._flag, self._t = 0, 0, 0
        self._first_action: int | None = None
        self._started = False

    def _observation(self) -> np.ndarray:
        """A fresh array each step (the env contract: a returned observation is never changed later)."""
        distractors = self.np_random.integers(2, size=self.n_distractors)
        return np.concatenate([[self._context, self._flag, self._t], distractors]).astype(np.int64)

    def _info(self) -> dict[str, Any]:
        info: dict[str, Any] = {"context": self._context, "optimal_first_action": self._context}
        if self._first_action is not None:
            info["first_decision_optimal"] = self._first_action == self._context
        return info

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self._context = int(self.np_random.random() < self.context_prob)
        self._flag, self._t, self._first_action, self._started = 0, 0, None, True
        return self._observation(), self._info()

    def step(self, action):
        if not self._started or self._t >= self.horizon:
            raise RuntimeError("step() called before reset() or after the episode ended")
        if isinstance(action, (bool, np.bool_)) or not self.action_space.contains(action):
            raise ValueError(f"invalid action {action!r}: expected 0 or 1")
        if self._t == 0:
            self._first_action = int(action)
            self._flag = int(self._first_action == self._context)
        self._t += 1
        terminated = self._t == self.horizon
        reward = 0.0
        if terminated:
            reward = self.match_reward * self._flag + self.reward_noise_sd * float(self.np_random.standard_normal())
        info = self._info()
        if terminated:
            info["is_success"] = info["first_decision_optimal"]
        return self._observation(), reward, terminated, False, info

    def render(self):
        if self.render_mode == "ansi" and self._started:
            return f"context={self._context}, flag={self._flag}, timestep={self._t}"
        return None
