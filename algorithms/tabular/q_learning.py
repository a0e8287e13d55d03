"""Tabular Q-learning (one-step TD) on the delayed reward, read top to bottom.

1. Act epsilon-greedily (constant epsilon, 0.05 by default: the exploration RUDDER and Monte Carlo
   use) at every step on Q(s, .), keyed by the full observation; ties broken uniformly. Unlike the
   RUDDER and Monte Carlo learners this agent is not told that only the first decision matters:
   TD must carry the terminal reward back through the 50-step chain of states itself, which is
   the slowness RUDDER's redistribution addresses.
2. Update after every transition: Q(s, a) += alpha (r + gamma max_a' Q(s', a') - Q(s, a)), with
   max_a' Q(s', .) = 0 at the terminal state; gamma = 1 (undiscounted, episodic).

With a credit rule (`--credit RULE`, algorithms/tabular/credit.py) step 2 waits for the episode's end:
the episode's transitions are replayed in order with the rule's return-equivalent rewards r'_t in
place of r_t, the same one-step backups the agent would have made online had it known r' (no state
repeats within a WatchRepair episode, so the order of the backups changes nothing there). With
gamma = 1, r' keeps every policy's return, so the fixed point is the same Q; what the rule changes is
how many backups the return needs to reach the decision that earned it.

Q is initialised at 0 by default (not RUDDER's optimistic 10): with max-bootstrapping over ~10^4
rarely visited (counter, time) states an optimistic table would keep the first-step values inflated
for a long time; `q_init` makes it configurable.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import numpy as np

from algorithms.common.validation import UNIT, UNIT_POSITIVE, Validated
from algorithms.tabular.base import EPSILON, STEP_SIZE, TabularAgent, epsilon_greedy
from algorithms.tabular.credit import EpisodeCredit
from vcbm_gym.credit.base import CreditRule


@dataclass
class QLearningConfig(Validated):
    RANGES = {"epsilon": UNIT, "alpha": UNIT_POSITIVE, "gamma": UNIT}

    epsilon: float = EPSILON
    alpha: float = STEP_SIZE
    gamma: float = 1.0
    q_init: float = 0.0


class QLearningAgent(TabularAgent):
    config_class = QLearningConfig

    def __init__(
        self,
        observation_space,
        action_space,
        config: QLearningConfig,
        seed: int,
        component_names=None,
        credit: CreditRule | None = None,
    ) -> None:
        super().__init__(observation_space, action_space, config, seed, component_names)
        if not 0.0 <= config.epsilon <= 1.0:
            raise ValueError(f"epsilon={config.epsilon}: expected a probability in [0, 1]")
        if not 0.0 < config.alpha <= 1.0:
            raise ValueError(f"alpha={config.alpha}: expected a step size in (0, 1]")
        self.q: defaultdict[tuple[int, ...], np.ndarray] = defaultdict(lambda: np.full(self.n_actions, config.q_init))
        self._first_key: tuple[int, ...] | None = None
        self.credit = EpisodeCredit(credit) if credit is not None else None

    def act(self, obs: np.ndarray) -> int:
        key = tuple(int(v) for v in obs)
        if self._first_key is None:
            self._first_key = key
        return epsilon_greedy(self.q[key], self.config.epsilon, self.rng)

    def observe(self, obs, action, reward, next_obs, done) -> None:
        """One-step Q-learning backup, or with a credit rule, the transition kept for the episode's end."""
        if self.credit is not None:
            self.credit.record(obs, action, reward, next_obs, done)
        else:
            self.backup(obs, action, reward, next_obs, done)

    def backup(self, obs, action, reward, next_obs, done) -> None:
        """Q(s, a) += alpha (r + gamma max_a' Q(s', a') - Q(s, a))."""
        key = tuple(int(v) for v in obs)
        bootstrap = 0.0 if done else float(self.q[tuple(int(v) for v in next_obs)].max())
        q = self.q[key]
        q[action] += self.config.alpha * (reward + self.config.gamma * bootstrap - q[action])

    def end_episode(self) -> dict[str, float]:
        scalars = super().end_episode()
        if self.credit is not None:
            redistributed = self.credit.redistribute()
            buffered = self.credit
            for transition in zip(
                buffered.observations, buffered.actions, redistributed, buffered.next_observations, buffered.dones
            ):
                self.backup(*transition)
            if len(redistributed):
                scalars["credit/redistributed_reward_t0"] = float(redistributed[0])
            self.credit.clear()
        first = self.q[self._first_key] if self._first_key is not None else None
        self._first_key = None
        if first is not None:
            scalars["td/first_step_q_gap"] = float(first[0] - first[1])
        return scalars

    def summary(self) -> dict[str, Any]:
        first_step = {str(list(k)): [float(v) for v in q] for k, q in sorted(self.q.items()) if k[-1] == 0}
        credit = self.credit.summary() if self.credit is not None else {}
        return {"states_visited": len(self.q), "first_step_q_table": first_step, **credit}
