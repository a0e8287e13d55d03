"""RUDDER + tabular direct-Q, read top to bottom.

RUDDER (Arjona-Medina et al., 2019, arXiv:1806.07857) as "Visual Causal-chain Bookmarking"
(Selvakumar, 2026, arXiv:2610.24032, Sec. II-B and V-A2) runs it against VCBM; the direct-Q
policy and its settings come from the RUDDER demonstration code (docs/papers/vcbm.md, "RUDDER").

1. Act: epsilon-greedy (constant epsilon = 0.05) on Q(s_0, .) at the first step only, Q initialised
   optimistically at 10; later actions are fixed (the reference fixes them; they change nothing).
2. After each episode, hand it to `RudderRule` (vcbm_gym/credit/rudder.py) on the env's features
   (the runner passes the env's `credit_featurizer()`, WatchRepair's on WatchRepair-v0; without
   one, the flattened observation and action): it joins the lesson buffer, and on schedule the
   gate-less LSTM trains until its running main loss < 0.15.
3. Redistribute the episode's return (Eq. 5) and update Q(s_0, a_0) += 0.1 (r_0 - Q) with r_0 the
   first redistributed reward (before the LSTM's first training event: the raw first reward).

Exploration: the reference demonstration code uses 0.1 while its comment says 0.05; with 0.1
about one seed in 20 stalls below the 95% criterion (the greedy policy alone caps the correct
rate at 1 - epsilon/2), with 0.05 all converge as in the paper. Default 0.05.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from algorithms.common.credit_slot import observe_then_credit
from algorithms.common.validation import AT_LEAST_ONE, NON_NEGATIVE, POSITIVE, UNIT, UNIT_POSITIVE, Validated
from algorithms.tabular.base import EPSILON, LATER_ACTION, OPTIMISTIC_Q, STEP_SIZE, FirstDecisionAgent
from vcbm_gym.credit.base import EpisodeBatch
from vcbm_gym.credit.features import Featurizer, SpaceFeaturizer
from vcbm_gym.credit.rudder import RudderCreditConfig, RudderLSTMConfig, RudderRule


@dataclass
class RudderConfig(Validated, RudderLSTMConfig):
    """The direct-Q policy's settings; the LSTM's and its schedule's come from RudderLSTMConfig."""

    RANGES = {
        "epsilon": UNIT, "q_learning_rate": UNIT_POSITIVE, "later_action": NON_NEGATIVE,
        # RudderLSTMConfig's fields (vcbm_gym stays free of algorithms/, so their ranges live here)
        "hidden_size": AT_LEAST_ONE, "init_std": NON_NEGATIVE, "reward_scale": POSITIVE, "aux_loss_weight": NON_NEGATIVE,
        "learning_rate": POSITIVE, "weight_decay": NON_NEGATIVE, "buffer_capacity": AT_LEAST_ONE, "batch_size": AT_LEAST_ONE,
        "min_buffer_episodes": NON_NEGATIVE, "train_every": AT_LEAST_ONE, "loss_threshold": NON_NEGATIVE,
        "running_loss_init": NON_NEGATIVE, "running_loss_decay": UNIT, "max_steps_per_event": AT_LEAST_ONE,
    }  # fmt: skip

    epsilon: float = EPSILON
    q_init: float = OPTIMISTIC_Q
    q_learning_rate: float = STEP_SIZE
    later_action: int = LATER_ACTION


def credit_config(config: RudderConfig) -> RudderCreditConfig:
    """The rule's config: the LSTM fields of RudderConfig."""
    return RudderCreditConfig(**{f.name: getattr(config, f.name) for f in fields(RudderLSTMConfig)})


class RudderAgent(FirstDecisionAgent):
    config_class = RudderConfig

    def __init__(
        self,
        observation_space,
        action_space,
        config: RudderConfig,
        seed: int,
        component_names=None,
        featurizer: Featurizer | None = None,
    ) -> None:
        super().__init__(observation_space, action_space, config, seed, component_names)
        featurizer = featurizer or SpaceFeaturizer(observation_space, action_space)
        self.rule = RudderRule(featurizer, config=credit_config(config), seed=seed)
        self.adam_steps_per_event: list[int] = []

    def end_episode(self) -> dict[str, float]:
        batch = EpisodeBatch(
            rewards=np.asarray(self._rewards)[None],
            mask=np.ones((1, len(self._rewards)), dtype=bool),
            observations=np.asarray(self._observations)[None],
            actions=np.asarray(self._actions)[None],
        )
        events_before = self.rule.training_events
        redistributed = observe_then_credit(self.rule, batch)[0]
        self.update_first_decision(float(redistributed[0]), self.config.q_learning_rate)
        scalars = {"rudder/redistributed_reward_t0": float(redistributed[0]), "rudder/lstm_trained": float(self.rule.trained)}
        if self.rule.training_events > events_before:
            event = self.rule.last_event
            self.adam_steps_per_event.append(event.steps)
            scalars.update(
                {
                    "rudder/lstm_main_loss": event.main_loss,
                    "rudder/lstm_aux_loss": event.aux_loss,
                    "rudder/lstm_running_main_loss": event.running_loss,
                    "rudder/adam_steps_per_event": float(event.steps),
                }
            )
        self.clear_episode()
        super().end_episode()
        return scalars

    def summary(self) -> dict[str, Any]:
        steps = np.asarray(self.adam_steps_per_event)
        return {
            **super().summary(),
            "lstm_training_events": len(steps),
            "adam_steps_per_event_median": float(np.median(steps)) if len(steps) else None,
            "adam_steps_per_event_max": int(steps.max()) if len(steps) else None,
            "capped_training_events": int((steps >= self.config.max_steps_per_event).sum()),
        }
