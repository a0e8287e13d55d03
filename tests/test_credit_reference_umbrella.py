"""The replay reference reproduces bsuite umbrella_length's analytic credit.

In umbrella_chain (bsuite, "Behaviour Suite for Reinforcement Learning", umbrella experiments) only the first
action (take the umbrella or not) changes the last reward: +1 when it matches the weather shown at t = 0, -1 otherwise;
every other reward is a fair +-1 coin. Under the uniform policy Q(s_0, right) = 1 + E[coins], Q(s_0, wrong) = -1 +
E[coins] and V(s_0) is their mean, so the taken first action's credit is +1 if it was right and -1 if it was wrong,
and every later action's credit is 0. With common random numbers every branch of one continuation sees the same
coins (the env's draws do not depend on the actions), so the reference must give these values exactly, with a zero
standard error; independent branches give them within their standard error.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("bsuite")

import vcbm_gym  # noqa: E402,F401 (registers the envs)
from algorithms.credit_reference import cli as reference_cli  # noqa: E402
from algorithms.credit_reference import replay  # noqa: E402

ENV = "umbrella_length/9"  # setting 9: chain length 10
LENGTH = 10
NEED_UMBRELLA = 0  # bsuite's observation: component 0 is the weather (need the umbrella), 1 whether it is held


def analytic_credit(observations: np.ndarray, actions: np.ndarray) -> np.ndarray:
    """(T,) the uniform policy's Q(s_t, a_t) - V(s_t): +-1 at the first step, 0 after it."""
    credit = np.zeros(len(actions))
    credit[0] = 1.0 if int(actions[0]) == int(observations[0][NEED_UMBRELLA]) else -1.0
    return credit


def replayed(seed: int, k: int, common: bool) -> replay.ReplayedEpisode:
    env = reference_cli.make_env(ENV)
    return replay.replay_episode(env, replay.BehaviourPolicy("uniform"), seed, np.random.SeedSequence(seed), k, common, "auto")


def test_common_random_numbers_give_the_analytic_credit_exactly():
    episodes = [replayed(seed, k=4, common=True) for seed in range(10)]
    signs = {float(e.credit[0]) for e in episodes}
    assert signs == {1.0, -1.0}  # both a right and a wrong first action were scored: a flipped sign would show
    for episode in episodes:
        assert episode.decision_step == 0 and len(episode.credit) == LENGTH
        np.testing.assert_array_equal(episode.credit, analytic_credit(episode.played.observations, episode.actions))
        np.testing.assert_array_equal(episode.credit_se, np.zeros(LENGTH))


def test_independent_branches_give_the_analytic_credit_within_their_standard_error():
    # Each branch draws its own coins: at t < 9 the contrast is a difference of sums of fair +-1 coins, sd about
    # sqrt(2 x remaining steps), so a K = 256 estimate sits within 4 SE of the truth (a fixed seed; z > 4 has
    # probability 6e-5 per step, ~0.006 over the 100 steps checked).
    for seed in range(10):
        episode = replayed(seed, k=256, common=False)
        truth = analytic_credit(episode.played.observations, episode.actions)
        noisy = episode.credit_se > 0
        assert noisy[0] and abs(truth[0]) > 4 * episode.credit_se[0]  # the decision's sign is resolved
        assert np.all(np.abs(episode.credit - truth)[noisy] < 4 * episode.credit_se[noisy])
        np.testing.assert_array_equal(episode.credit[~noisy], truth[~noisy])
