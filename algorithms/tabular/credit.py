"""The tabular arm's side of the credit slot (algorithms/common/credit_slot.py): td and mc learn from a reward
rule's rewards (`--algo td|mc --credit RULE`).

A rule plugs in when it emits rewards (a return decomposition: rudder, rrd, ircr, vcbm_bookmark's
return-equivalent form) and the tabular episode provides its inputs (TABULAR_BATCH_PROVIDES, in the terms of
CreditRule.batch_needs); the others (advantage rules, casi's coalition values, loo/grpo/gigpo's episode groups)
are refused when the run is resolved, before the log dir exists.

The pattern is the one tabular RUDDER runs (algorithms/tabular/rudder.py), for any reward rule:

1. The agent buffers the episode (flattened int observations, actions numbered from 0, rewards, the
   next observations).
2. At its end, `EpisodeCredit.redistribute` builds a one-episode EpisodeBatch and takes the rule's rewards
   for it, then lets the rule learn from it (`credit_slot.assign_credit`).
3. The agent's update reads those rewards in place of the env's (q_learning.py, mc.py say how).

Batch size: one episode, as in tabular RUDDER. Each episode's credit comes from a rule that has seen every
earlier episode, and the agent updates after every episode as it does without a rule; a rule's own schedule
(RUDDER's lesson buffer and LSTM training events, vcbm_bookmark's warm-up) decides how much history it pools.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from algorithms.common.credit_slot import assign_credit, rule_summary
from vcbm_gym.credit.base import CreditRule, EpisodeBatch

# What the tabular arm's EpisodeBatch holds beyond rewards and mask (EpisodeCredit.batch), in the terms
# of CreditRule.batch_needs. Every step is its own turn (the batch's default step_turn). No groups: one
# episode per batch. The agents never see the env's info, so no info key reaches a rule.
TABULAR_BATCH_PROVIDES = frozenset({"observations", "actions", "step_turn", "extras['next_observations']"})
TABULAR_INFO_PROVIDES: frozenset[str] = frozenset()


class AgentSpacesView(gym.Wrapper):
    """The env as the tabular agent sees it (flattened observations, actions from 0), for building a rule
    (`make_rule(name, env=view)`: RUDDER's and RRD's features, vcbm_bookmark's space check); never stepped.
    The env's own `credit_featurizer()` stays reachable through `unwrapped`."""

    def __init__(self, env: gym.Env, observation_space: gym.Space, action_space: gym.Space) -> None:
        super().__init__(env)
        self.observation_space, self.action_space = observation_space, action_space


class EpisodeCredit:
    """Buffers one episode's transitions and hands back the rule's rewards for it at its end."""

    def __init__(self, rule: CreditRule) -> None:
        self.rule = rule
        self.observations: list[np.ndarray] = []
        self.actions: list[int] = []
        self.rewards: list[float] = []
        self.next_observations: list[np.ndarray] = []
        self.dones: list[bool] = []

    def record(self, obs: np.ndarray, action: int, reward: float, next_obs: np.ndarray, done: bool) -> None:
        self.observations.append(np.asarray(obs).copy())
        self.actions.append(int(action))
        self.rewards.append(float(reward))
        self.next_observations.append(np.asarray(next_obs).copy())
        self.dones.append(bool(done))

    def batch(self) -> EpisodeBatch:
        """The buffered episode as a batch of one (what TABULAR_BATCH_PROVIDES declares)."""
        rewards = np.asarray(self.rewards, dtype=np.float64)[None]
        return EpisodeBatch(
            rewards=rewards,
            mask=np.ones_like(rewards, dtype=bool),
            observations=np.asarray(self.observations)[None],
            actions=np.asarray(self.actions, dtype=np.int64)[None],
            extras={"next_observations": np.asarray(self.next_observations)[None]},
        )

    def redistribute(self) -> np.ndarray:
        """(T,) the rule's rewards for the buffered episode (then the rule learns from it); empty for an empty episode."""
        if not self.rewards:
            return np.zeros(0)
        return assign_credit(self.rule, self.batch())[0]

    def clear(self) -> None:
        self.observations, self.actions, self.rewards, self.next_observations, self.dones = [], [], [], [], []

    def summary(self) -> dict[str, Any]:
        return rule_summary(self.rule)
