"""The interface every tabular agent implements (the runner drives it through the Gymnasium API),
and `FirstDecisionAgent`, the first-step policy that RUDDER's direct-Q learner and the Monte Carlo
baseline share."""

from __future__ import annotations

import abc
from collections import defaultdict
from typing import Any, ClassVar

import numpy as np
from gymnasium import spaces

# The tabular baselines' shared settings (td, mc and RUDDER's direct-Q policy), written once: they explore
# and learn alike, so that a comparison of them measures their credit assignment.
EPSILON = 0.05  # constant epsilon-greedy exploration
STEP_SIZE = 0.1  # the Q update's step size (mc and td `alpha`, rudder `q_learning_rate`)
OPTIMISTIC_Q = 10.0  # the first-decision agents' initial Q (mc, rudder): above any return, so both actions are tried
LATER_ACTION = 1  # the first-decision agents' action after the first step


class TabularAgent(abc.ABC):
    """An agent that sees only observations, actions and rewards (never the env's `info`).

    `config_class` is the dataclass of the agent's hyperparameters (zoo_configs/<algo>.yml).
    """

    config_class: ClassVar[type]

    @classmethod
    def unsupported(cls, observation_space: spaces.Space, action_space: spaces.Space, config: Any) -> str | None:
        """Why this agent cannot run on these spaces with this config (one line), or None.

        The runner asks before the log dir exists; the spaces are the ones the agent will be given
        (the flattened observation space, actions numbered from 0)."""
        if not isinstance(action_space, spaces.Discrete):
            return f"{cls.__name__} needs a Discrete action space, got {action_space}"
        return None

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


def epsilon_greedy(q_values: np.ndarray, epsilon: float, rng: np.random.Generator) -> int:
    """With probability epsilon a uniform action, else a greedy one (ties broken uniformly)."""
    if rng.random() < epsilon:
        return int(rng.integers(len(q_values)))
    best = np.flatnonzero(q_values == q_values.max())
    return int(best[0] if len(best) == 1 else rng.choice(best))


class FirstDecisionAgent(TabularAgent):
    """Acts epsilon-greedily on Q(s_0, .) at the first step only; subclasses give the update target."""

    @classmethod
    def unsupported(cls, observation_space, action_space, config: Any) -> str | None:
        why = super().unsupported(observation_space, action_space, config)
        if why is None and not 0 <= config.later_action < action_space.n:
            why = f"later_action={config.later_action}: expected an action in [0, {action_space.n - 1}]"
        return why

    def __init__(self, observation_space, action_space, config: Any, seed: int, component_names=None) -> None:
        super().__init__(observation_space, action_space, config, seed, component_names)
        if not 0.0 <= config.epsilon <= 1.0:
            raise ValueError(f"epsilon={config.epsilon}: expected a probability in [0, 1]")
        if not 0 <= config.later_action < self.n_actions:
            raise ValueError(f"later_action={config.later_action}: expected an action in [0, {self.n_actions - 1}]")
        self.q: defaultdict[tuple[int, ...], np.ndarray] = defaultdict(lambda: np.full(self.n_actions, config.q_init))
        self.visits: defaultdict[tuple[int, ...], np.ndarray] = defaultdict(lambda: np.zeros(self.n_actions, np.int64))
        self._observations: list[np.ndarray] = []
        self._actions: list[int] = []
        self._rewards: list[float] = []

    def act(self, obs: np.ndarray) -> int:
        if self._actions:
            return self.config.later_action
        return epsilon_greedy(self.q[tuple(int(v) for v in obs)], self.config.epsilon, self.rng)

    def observe(self, obs, action, reward, next_obs, done) -> None:
        self._observations.append(np.asarray(obs).copy())
        self._actions.append(int(action))
        self._rewards.append(float(reward))

    def update_first_decision(self, target: float, alpha: float | None) -> None:
        """Q(s_0, a_0) += alpha (target - Q(s_0, a_0)); alpha None: 1 / n(s_0, a_0)."""
        key, action = tuple(int(v) for v in self._observations[0]), self._actions[0]
        self.visits[key][action] += 1
        step = 1.0 / self.visits[key][action] if alpha is None else alpha
        self.q[key][action] += step * (target - self.q[key][action])

    def clear_episode(self) -> None:
        self._observations, self._actions, self._rewards = [], [], []

    def summary(self) -> dict[str, Any]:
        return {"q_table": {str(list(k)): [float(v) for v in q] for k, q in sorted(self.q.items())}}
