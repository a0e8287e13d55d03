"""Rewards that are finite but beyond what a learner stores or a rule's arithmetic holds, one line naming the cause;
and train --help, where every such line points."""

from __future__ import annotations

import warnings

import gymnasium as gym
import pytest

from algorithms.common.errors import VcbmGymError
from algorithms.train import run as train
from tests.helpers import DecideFirst


class DecideHuge(DecideFirst):
    """A 5-step episode whose first action decides a return of +-1e308 (finite), paid at the last step."""

    HORIZON = 5
    observation_space = gym.spaces.MultiDiscrete([3, HORIZON + 1])

    def payoff(self) -> float:
        return 1e308 if self.decided == 2 else -1e308


@pytest.fixture(scope="module", autouse=True)
def registered():
    gym.register("DecideHuge-v0", entry_point=DecideHuge, max_episode_steps=5)
    yield
    gym.registry.pop("DecideHuge-v0")


def test_sb3_names_float32_not_the_env_for_a_finite_reward_it_cannot_store(tmp_path):
    argv = ["--algo", "ppo", "--env", "DecideHuge-v0", "--max-episodes", "20", "--no-progress", "--log-dir", str(tmp_path)]
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # nothing overflows before the refusal
        with pytest.raises(VcbmGymError) as excinfo:
            train([*argv, "--hyperparams", "n_steps=20", "batch_size=20"])
    message = str(excinfo.value)
    assert "\n" not in message and "float32" in message and "1e+308" in message and "NaN" not in message


@pytest.mark.parametrize("rule", ["rrd", "vcbm_bookmark"])
def test_a_rule_whose_arithmetic_overflows_is_one_line_naming_it(tmp_path, rule):
    argv = ["--algo", "td", "--credit", rule, "--env", "DecideHuge-v0", "--max-episodes", "50", "--no-progress"]
    with pytest.raises(VcbmGymError) as excinfo:
        train([*argv, "--log-dir", str(tmp_path)])
    message = str(excinfo.value)
    assert "\n" not in message and f"credit rule {rule!r} gave nan" in message and "1e+308" in message


@pytest.mark.parametrize("algo", ["td", "ppo", "loop"])
def test_train_help_lists_the_credit_and_resume_flags(run_cli, algo):
    # every credit error points to --help: it must list --credit (the arm's) and --resume
    done = run_cli("algorithms.train", "--algo", algo, "--help")
    assert done.returncode == 0 and "--credit" in done.stdout and "--resume" in done.stdout, done.stdout[-500:]
    bare = run_cli("algorithms.train", "--help")
    assert bare.returncode == 0 and "--resume" in bare.stdout and "--algo ALGO --help" in bare.stdout
