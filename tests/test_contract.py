"""The env contract (vcbm_gym/contract.py): the checker on every registered env and on broken ones,
the runners without evaluation keys, and the DelayedReward wrapper."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces

import vcbm_gym
from algorithms.common.convergence import ConvergenceTracker, EpisodeOutcomes
from algorithms.llm.runner import check_env_reports, info_needs
from envs.delayed_reward import DelayedReward
from vcbm_gym.contract import INFO_KEYS, NEEDS, ContractError, check_contract, required_keys
from vcbm_gym.credit.registry import RULES, rule_class

# What each registered env must satisfy beyond the API (AppWorld-v0: tests/test_appworld.py, which has its servers).
NEEDED = {
    "WatchRepair-v0": (),
    "TextWatchRepair-v0": ("vcbm-loop", "--ratio-sharing effect"),
    "TextWatchWorkshop-v0": ("vcbm-loop", "--ratio-sharing effect"),
    "TextThinkSolve-v0": ("vcbm-loop", "--ratio-sharing effect"),
    "SetRetrieval-v0": ("casi",),
    "TextSetRetrieval-v0": ("casi",),
    "ContextMatch-v0": (),
    "LinearKeyToDoor-v0": (),
    "CreditTree-v0": (),
    "Sokoban-v0": ("vcbm-loop", "--ratio-sharing effect"),
    "SokobanDescribed-v0": ("vcbm-loop", "--ratio-sharing effect"),
    **{env_id: () for env_id in vcbm_gym.DELAYED_ENV_IDS},
}
EVALUATION = {
    "WatchRepair-v0": {"first_decision_optimal", "is_success"},
    "ContextMatch-v0": {"first_decision_optimal", "is_success"},
    "LinearKeyToDoor-v0": {"first_decision_optimal", "is_success"},
    "CreditTree-v0": {"first_decision_optimal", "is_success"},
    "TextWatchRepair-v0": {"first_decision_optimal", "task_goal_completion", "is_decision_turn"},
    "TextWatchWorkshop-v0": {"first_decision_optimal", "task_goal_completion", "is_decision_turn"},
    "TextThinkSolve-v0": {"first_decision_optimal", "task_goal_completion", "is_decision_turn"},
    "Sokoban-v0": {"task_goal_completion", "is_success"},
    "SokobanDescribed-v0": {"task_goal_completion", "is_success"},
}


def test_every_registered_env_is_listed_here():
    assert set(NEEDED) | {"AppWorld-v0"} == set(vcbm_gym.ENV_IDS + vcbm_gym.DELAYED_ENV_IDS)


@pytest.mark.parametrize("env_id", sorted(NEEDED))
def test_registered_envs_meet_the_contract(env_id):
    report = check_contract(gym.make(env_id), needs=NEEDED[env_id], episodes=2, seed=3)
    needed = set(required_keys(NEEDED[env_id]))
    assert needed <= report.reported
    assert EVALUATION.get(env_id, set()) <= report.reported
    assert report.episodes == 2 and report.steps >= 2


class _DropKey(gym.Wrapper):
    def __init__(self, env, key):
        super().__init__(env)
        self.key = key

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        return obs, reward, terminated, truncated, {k: v for k, v in info.items() if k != self.key}


class _SetKey(gym.Wrapper):
    """info[key] = value(episode) on the last step."""

    def __init__(self, env, key, value):
        super().__init__(env)
        self.key, self.value, self.episodes = key, value, 0

    def reset(self, **kwargs):
        self.episodes += 1
        return self.env.reset(**kwargs)

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        value = self.value(self.episodes)
        if (terminated or truncated) and value is not None:
            info = {**info, self.key: value}
        return obs, reward, terminated, truncated, info


def _one_line(excinfo) -> str:
    message = str(excinfo.value)
    assert "\n" not in message
    return message


def test_a_missing_key_fails_at_the_first_step_with_one_line_naming_it():
    env = _DropKey(gym.make("TextWatchRepair-v0"), "state_mutating")
    check_contract(env, needs=(), check_api=False)  # nobody needs it: fine
    with pytest.raises(ContractError) as excinfo:
        check_contract(env, needs=("vcbm-loop",), check_api=False)
    message = _one_line(excinfo)
    assert "info['state_mutating']" in message and "step 1 of episode 1" in message and "vcbm-loop" in message
    assert "env contract" in message
    with pytest.raises(ContractError, match="coalition_values"):
        check_contract(_DropKey(gym.make("SetRetrieval-v0"), "coalition_values"), needs=("casi",), check_api=False)


def test_wrong_types_and_keys_on_some_episodes_only_fail():
    env = _SetKey(gym.make("DelayedCartPole-v1"), "is_success", lambda episode: "yes")
    with pytest.raises(ContractError) as excinfo:
        check_contract(env, check_api=False)
    assert "info['is_success']" in _one_line(excinfo) and "'yes'" in str(excinfo.value) and "bool" in str(excinfo.value)
    sometimes = _SetKey(gym.make("DelayedCartPole-v1"), "first_decision_optimal", lambda episode: True if episode == 1 else None)
    with pytest.raises(ContractError) as excinfo:
        check_contract(sometimes, episodes=2, check_api=False)
    assert "info['first_decision_optimal']" in _one_line(excinfo) and "episode 2" in str(excinfo.value)
    with pytest.raises(ValueError, match="unknown consumer, credit rule or key 'nope'"):
        check_contract(gym.make("DelayedCartPole-v1"), needs=("nope",))


def test_the_contract_names_every_key_a_runner_or_rule_reads():
    assert set(INFO_KEYS) == {
        "first_decision_optimal", "is_success", "task_goal_completion", "is_decision_turn", "action_optimal",
        "state_mutating", "execution_output", "effect", "coalition_values", "withheld_reward",
    }  # fmt: skip
    learned_from = {k for k, spec in INFO_KEYS.items() if not spec.evaluation_only}
    assert {key for keys in NEEDS.values() for key in keys} <= learned_from
    assert {key for name in RULES for key in rule_class(name).info_needs} <= learned_from


def test_a_rule_name_needs_the_info_keys_the_rule_declares():
    assert required_keys(["casi"]) == {"coalition_values": "credit rule casi"}
    assert set(required_keys(["vcbm_blend"])) == {"state_mutating", "execution_output"}
    assert required_keys(["rudder"]) == {}
    assert "casi" not in NEEDS  # declared once, by the rule (CreditRule.info_needs)


def test_llm_runner_checks_what_the_run_learns_from_at_the_first_step():
    assert info_needs("vcbm_blend", "effect") == {
        "state_mutating": "--credit vcbm_blend (vcbm-loop)",
        "effect": "--ratio-sharing effect",
    }
    assert info_needs("loo", "none") == {}
    check_env_reports("TextWatchRepair-v0", {}, info_needs("vcbm_blend", "effect"), seed=0)
    with pytest.raises(ContractError) as excinfo:
        check_env_reports("TextSetRetrieval-v0", {}, info_needs("loo", "effect"), seed=0)
    assert "info['effect']" in _one_line(excinfo) and "--ratio-sharing effect" in str(excinfo.value)


def test_episode_outcomes_without_a_criterion_report_return_and_success():
    outcomes = EpisodeOutcomes(ConvergenceTracker(window=2, threshold=0.5), "'X'")
    for episode_return, success in ((1.0, True), (3.0, False)):
        assert not outcomes.update({"is_success": success}, episode_return)
    summary = outcomes.summary()
    assert summary["converged"] is None and summary["final_correct_rate"] is None and summary["episodes_run"] == 2
    assert summary["mean_return_last_episodes"] == 2.0 and summary["success_rate_last_episodes"] == 0.5
    with pytest.raises(ContractError, match="is_success"):
        outcomes.update({}, 0.0)
    with_criterion = EpisodeOutcomes(ConvergenceTracker(window=2, threshold=0.5), "'X'")
    assert not with_criterion.update({"first_decision_optimal": True}, 0.0)
    assert with_criterion.update({"first_decision_optimal": False}, 0.0)  # 1 of 2 >= 0.5: converged at episode 2
    assert with_criterion.summary()["converged"] is True and with_criterion.summary()["episodes_to_converge"] == 2


def test_ppo_trains_on_cartpole_which_reports_no_evaluation_keys(run_cli, tmp_path):
    done = run_cli(
        "algorithms.train", "--algo", "ppo", "--env", "CartPole-v1", "--max-episodes", "5", "--no-progress",
        "--log-dir", str(tmp_path / "run"), "--hyperparams", "n_steps=64", "batch_size=32",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    summary = __import__("json").loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["episodes_run"] == 5 and summary["converged"] is None and summary["mean_return_last_episodes"] > 0


def test_sb3_refuses_rules_that_learn_from_info_it_does_not_collect(run_cli, tmp_path):
    done = run_cli("algorithms.train", "--algo", "ppo", "--credit", "vcbm_blend", "--log-dir", str(tmp_path / "run"))
    assert done.returncode == 2
    line = done.stderr.strip()
    assert "\n" not in line and "vcbm_blend" in line and "info['state_mutating']" in line


def test_a_rule_that_needs_discrete_states_is_refused_before_the_run_on_a_float_env(tmp_path):
    from algorithms.common.errors import ConfigError
    from algorithms.train import run

    with pytest.raises(ConfigError) as excinfo:
        run(["--algo", "ppo", "--credit", "vcbm_bookmark", "--env", "DelayedCartPole-v1", "--log-dir", str(tmp_path / "run")])
    assert "'DelayedCartPole-v1'" in _one_line(excinfo) and "Discrete(2)" in str(excinfo.value)
    assert not (tmp_path / "run").exists()


def test_delayed_reward_pays_the_sum_at_the_last_step_truncation_included():
    plain, delayed = gym.make("MountainCar-v0"), gym.make("DelayedMountainCar-v0")
    assert delayed.spec.max_episode_steps == plain.spec.max_episode_steps == 200
    assert isinstance(delayed, DelayedReward)  # outside the TimeLimit, so truncation is seen
    plain.reset(seed=4), delayed.reset(seed=4)
    plain_rewards, delayed_rewards, done = [], [], False
    while not done:
        o1, r1, t1, u1, _ = plain.step(1)
        o2, r2, t2, u2, _ = delayed.step(1)
        np.testing.assert_array_equal(o1, o2)
        assert (t1, u1) == (t2, u2)
        plain_rewards.append(r1), delayed_rewards.append(r2)
        done = t1 or u1
    assert u1 and not t1  # doing nothing never reaches the flag: the time limit ends it
    assert delayed_rewards[:-1] == [0.0] * (len(delayed_rewards) - 1) and delayed_rewards[-1] == sum(plain_rewards) == -200.0
    delayed.reset(seed=5)
    assert delayed.step(1)[1] == 0.0  # nothing carried over from the last episode


def test_delayed_reward_wraps_any_env_and_keeps_its_spaces():
    class Counter(gym.Env):
        observation_space, action_space = spaces.Discrete(4), spaces.Discrete(2)

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            self.t = 0
            return 0, {}

        def step(self, action):
            self.t += 1
            return self.t, float(self.t), self.t == 3, False, {"t": self.t}

    env = DelayedReward(Counter())
    assert env.observation_space == spaces.Discrete(4)
    env.reset()
    assert [env.step(0)[1] for _ in range(3)] == [0.0, 0.0, 6.0]
    assert env.spec is None and DelayedReward.wrapper_spec().entry_point == "envs.delayed_reward:DelayedReward"
