"""Tabular Monte Carlo on the delayed reward: the baseline RUDDER's redistribution is meant to beat.

The policy is the one RUDDER's direct-Q learner uses (`FirstDecisionAgent`, algorithms/tabular/base.py),
so that the two differ only in their learning target:

1. Decide only at an episode's first step: epsilon-greedy (constant epsilon, 0.05 by default) on a
   table Q(s_0, a) initialised optimistically at 10, keyed by the full first observation; ties are
   broken uniformly. Later actions are fixed (`later_action`), as in the reference demonstration.
2. After the episode: Q(s_0, a_0) += alpha (G - Q(s_0, a_0)) with G the undistributed return.

The default step size alpha = 0.1 is RUDDER's direct-Q rate, so this baseline is RUDDER minus the
redistribution. With it the table tracks the noisy return (sd ~11 against brand effects of at most
5) with an exponential average of sd ~2.5 and rarely reaches 95% correct decisions.
With a credit rule (`--credit RULE`, algorithms/tabular/credit.py) the target of step 2 is the rule's
first return-equivalent reward r'_0 instead of G: RUDDER's direct Q estimate (arXiv:1806.07857,
Sec. 3: under a redistribution that leaves no expected reward to come, q(s_t, a_t) = E[r'_t]), the
target tabular RUDDER uses (rudder.py). The sum of r' from the first step is G again (return
equivalence), so a Monte Carlo return of r' would change nothing; r'_0 is where a rule's credit
differs. `mc --credit rudder` is thus the `rudder` learner with its redistribution made
return-equivalent (`rudder` takes the LSTM's first difference as is).

`alpha: null` uses the sample average 1/n(s_0, a_0) (first-visit Monte Carlo control), a much
stronger baseline on this one-decision task: a simulation of it converged in ~750-3,400 episodes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from algorithms.common.validation import NON_NEGATIVE, UNIT, Range, Validated
from algorithms.tabular.base import EPSILON, LATER_ACTION, OPTIMISTIC_Q, STEP_SIZE, FirstDecisionAgent
from algorithms.tabular.credit import EpisodeCredit
from vcbm_gym.credit.base import CreditRule


@dataclass
class MonteCarloConfig(Validated):
    RANGES = {"epsilon": UNIT, "alpha": Range(0, 1, lo_open=True, optional=True), "later_action": NON_NEGATIVE}

    epsilon: float = EPSILON
    q_init: float = OPTIMISTIC_Q
    alpha: float | None = STEP_SIZE  # None: sample average 1 / n
    later_action: int = LATER_ACTION


class MonteCarloAgent(FirstDecisionAgent):
    config_class = MonteCarloConfig

    def __init__(
        self, observation_space, action_space, config, seed: int, component_names=None, credit: CreditRule | None = None
    ):
        super().__init__(observation_space, action_space, config, seed, component_names)
        self.credit = EpisodeCredit(credit) if credit is not None else None

    def observe(self, obs, action, reward, next_obs, done) -> None:
        super().observe(obs, action, reward, next_obs, done)
        if self.credit is not None:
            self.credit.record(obs, action, reward, next_obs, done)

    def end_episode(self) -> dict[str, float]:
        scalars: dict[str, float] = {}
        if self.credit is None:
            target = float(sum(self._rewards))
        else:
            redistributed = self.credit.redistribute()
            self.credit.clear()
            target = float(redistributed[0])
            scalars["credit/redistributed_reward_t0"] = target
        self.update_first_decision(target, self.config.alpha)
        self.clear_episode()
        return {**super().end_episode(), **scalars}

    def summary(self) -> dict[str, Any]:
        return {**super().summary(), **(self.credit.summary() if self.credit is not None else {})}
