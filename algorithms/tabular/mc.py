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
`alpha: null` uses the sample average 1/n(s_0, a_0) (first-visit Monte Carlo control), a much
stronger baseline on this one-decision task: a simulation of it converged in ~750-3,400 episodes.
"""

from __future__ import annotations

from dataclasses import dataclass

from algorithms.common.validation import NON_NEGATIVE, UNIT, Range, Validated
from algorithms.tabular.base import FirstDecisionAgent


@dataclass
class MonteCarloConfig(Validated):
    RANGES = {"epsilon": UNIT, "alpha": Range(0, 1, lo_open=True, optional=True), "later_action": NON_NEGATIVE}

    epsilon: float = 0.05
    q_init: float = 10.0
    alpha: float | None = 0.1  # None: sample average 1 / n
    later_action: int = 1


class MonteCarloAgent(FirstDecisionAgent):
    config_class = MonteCarloConfig

    def end_episode(self) -> dict[str, float]:
        episode_return = float(sum(self._rewards))
        self.update_first_decision(episode_return, self.config.alpha)
        self.clear_episode()
        return super().end_episode()
