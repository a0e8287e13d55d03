"""Extreme but finite rewards (+-1e308): IRCR's normalisation, the return-equivalent redistribution, the mean of the
last episodes' returns and a training run's summary stay finite where an intermediate sum would overflow."""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces

from algorithms.common import cli
from algorithms.common.convergence import ConvergenceTracker, EpisodeOutcomes
from tests.helpers import make_batch, strict_json
from vcbm_gym.credit.ircr import IRCRRule, normalised_returns
from vcbm_gym.credit.redistribute import return_equivalent_rewards

HUGE = 1e308  # finite; two of them apart overflow: 1e308 - (-1e308) = inf


def test_ircr_normalises_returns_whose_spread_overflows():
    np.testing.assert_array_equal(normalised_returns(np.array([HUGE, -HUGE, 0.0]), -HUGE, HUGE), [1.0, 0.0, 0.5])
    assert normalised_returns(np.array([6.0]), 2.0, 10.0)[0] == 0.5  # the ordinary case bit for bit
    rule = IRCRRule()
    batch = make_batch([[0.0, HUGE], [0.0, -HUGE]])
    rule.observe(batch)
    np.testing.assert_array_equal(rule.advantages(batch), [[1.0, 1.0], [0.0, 0.0]])


def test_the_return_equivalent_projection_survives_an_overflowing_sum():
    mask = np.array([[True, True, False]])
    # sum_s A_s = 2e308 overflows; r'_t = A_t + (G - sum A) / n = 1e308 + (1e308 - 2e308) / 2 = 5e307
    np.testing.assert_allclose(
        return_equivalent_rewards(np.array([[HUGE, HUGE, 0.0]]), mask, np.array([HUGE])), [[5e307, 5e307, 0.0]]
    )
    # ordinary values bit for bit
    np.testing.assert_array_equal(
        return_equivalent_rewards(np.array([[1.0, 2.0, 9.0]]), mask, np.array([4.0])), [[1.5, 2.5, 0.0]]
    )
    batch = make_batch([[0.0, HUGE], [0.0, -HUGE]])
    redistributed = return_equivalent_rewards(IRCRRule().advantages(batch), batch.mask, batch.returns)
    np.testing.assert_allclose(redistributed.sum(axis=1), [HUGE, -HUGE])


class HugeRewardEnv(gym.Env):
    """Two steps; the first action decides the last step's reward: +1e308 (action 1) or -1e308 (action 0)."""

    observation_space, action_space = spaces.Discrete(3), spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t, self.first = 0, None
        return 0, {}

    def step(self, action):
        self.t += 1
        self.first = int(action) if self.first is None else self.first
        done = self.t == 2
        reward = (HUGE if self.first else -HUGE) if done else 0.0
        return self.t, reward, done, False, {}


HUGE_ID = "test/HugeReward-v0"


@pytest.fixture
def huge_env_id():
    gym.register(HUGE_ID, entry_point=HugeRewardEnv)
    yield HUGE_ID
    del gym.registry[HUGE_ID]


def _train(tmp_path, env_id: str, *extra: str) -> dict:
    from algorithms.train import main

    log_dir = tmp_path / "run"
    argv = ["--env", env_id, "--max-episodes", "60", "--no-progress", "--log-dir", str(log_dir), *extra]
    assert main(argv) == 0
    return strict_json((log_dir / "summary.json").read_text())


@pytest.mark.parametrize("algo", ["td", "mc"])
def test_ircr_trains_on_rewards_of_plus_minus_1e308(tmp_path, huge_env_id, algo):
    summary = _train(tmp_path, huge_env_id, "--algo", algo, "--credit", "ircr")
    assert summary["episodes_run"] == 60 and math.isfinite(summary["mean_return_last_episodes"])


def test_overflow_free_mean():
    from algorithms.common.convergence import overflow_free_mean

    assert overflow_free_mean([HUGE, HUGE, HUGE]) == HUGE
    assert overflow_free_mean([HUGE, -HUGE, HUGE, HUGE]) == pytest.approx(5e307, rel=1e-12)
    values = [0.1, 0.2, 0.7, 1e-3]
    assert overflow_free_mean(values) == sum(values) / len(values)  # bit for bit where nothing overflows


def test_episode_outcomes_report_a_finite_mean_of_huge_returns():
    outcomes = EpisodeOutcomes(ConvergenceTracker(window=2, threshold=0.5), "'X'")
    for _ in range(3):
        outcomes.update({}, HUGE)
    assert outcomes.summary()["mean_return_last_episodes"] == HUGE
    assert outcomes.scalars()["mean_return"] == HUGE


def test_plain_td_on_huge_rewards_writes_a_strict_summary_with_a_finite_mean(tmp_path, huge_env_id):
    summary = _train(tmp_path, huge_env_id, "--algo", "td")
    assert abs(summary["mean_return_last_episodes"]) <= HUGE and cli.NON_FINITE_KEY not in summary
