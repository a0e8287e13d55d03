"""The interface every tabular agent implements; the runner drives it through the Gymnasium API."""

from __future__ import annotations

import abc
from typing import Any, ClassVar

import numpy as np
from gymnasium import spaces


class TabularAgent(abc.ABC):
    """An agent that sees only observations, actions and rewards (never the env's `info`).

    `config_class` is the dataclass of the agent's hyperparameters (zoo_configs/<algo>.yml).
    """

    config_class: ClassVar[type]

    def __init__(
        self,
        observation_space: spaces.Space,
        action_space: spaces.Discrete,
        config: Any,
        seed: int,
        component_names: tuple[str, ...] | None = None,
    ) -> None:
        if not isinstance(action_space, spaces.Discrete):
            raise TypeError(f"{type(self).__name__} needs a Discrete action space, got {action_space}")
        self.observation_space = observation_space
        self.action_space = action_space
        self.n_actions = int(action_space.n)
        self.config = config
        self.rng = np.random.default_rng(np.random.SeedSequence([seed, 0x7AB]))
        self.episode = 0  # completed episodes
        n_components = int(np.prod(observation_space.shape or (1,)))
        # Names label logs and reports only; no agent learns from them.
        self.component_names = tuple(component_names or (f"component_{i}" for i in range(n_components)))

    @abc.abstractmethod
    def act(self, obs: np.ndarray) -> int:
        """Choose an action for the current observation."""

    @abc.abstractmethod
    def observe(self, obs: np.ndarray, action: int, reward: float, next_obs: np.ndarray, done: bool) -> None:
        """Record one transition."""

    def end_episode(self) -> dict[str, float]:
        """Called after the last transition of an episode; returns scalars to log."""
        self.episode += 1
        return {}

    def summary(self) -> dict[str, Any]:
        """Extra fields for summary.json (e.g. discovered roles)."""
        return {}
