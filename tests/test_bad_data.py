"""No silent wrong result from bad data: a NaN or infinite reward is refused at its step (DelayedReward,
check_contract) or episode (a training run), and an env that mutates an observation it returned is named as such.
Damaged TensorBoard event files: tests/test_plot.py."""

from __future__ import annotations

import json
import math

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces

from algorithms.common.convergence import ConvergenceTracker, EpisodeOutcomes
from envs.delayed_reward import DelayedReward
from vcbm_gym.contract import ContractError, check_contract


class BadRewardEnv(gym.Env):
    """Four steps an episode, reward 1 each, except `bad` at step `at_step` of the `at_episode`-th reset (of every
    episode if None)."""

    observation_space, action_space = spaces.MultiDiscrete([5]), spaces.Discrete(2)  # the tabular agents' kind

    def __init__(self, bad: float = math.nan, at_step: int = 2, at_episode: int | None = None) -> None:
        self.bad, self.at_step, self.at_episode = bad, at_step, at_episode
        self.episode = self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.episode, self.t = self.episode + 1, 0
        return np.array([0]), {}

    def step(self, action):
        self.t += 1
        bad_episode = self.at_episode is None or self.episode == self.at_episode
        reward = self.bad if bad_episode and self.t == self.at_step else 1.0
        return np.array([self.t]), reward, self.t == 4, False, {}


class StateArrayEnv(gym.Env):
    """Keeps its state in one array and returns that array itself, then `+= 1`s it in place on the next step
    (the bug): with `copy=True` it returns a copy, as the contract asks."""

    observation_space, action_space = spaces.Box(0.0, 100.0, (2,), np.float32), spaces.Discrete(2)

    def __init__(self, copy: bool = False) -> None:
        self.copy = copy
        self.state = np.zeros(2, np.float32)

    def _obs(self):
        return self.state.copy() if self.copy else self.state

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.state[:] = self.np_random.uniform(0.0, 1.0, 2)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.state += 1.0 + action
        self.t += 1
        return self._obs(), 1.0, self.t == 5, False, {}


class MutatingWrapper(gym.ObservationWrapper):
    """Scales the observation in place: the inner env is fine, the env as the runners see it is not."""

    def observation(self, observation):
        self.last = observation if not hasattr(self, "last") else self.last
        self.last[:] = observation * 0.5
        return self.last


def _one_line(excinfo) -> str:
    message = str(excinfo.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_delayed_reward_refuses_a_non_finite_reward_at_its_step(bad):
    env = DelayedReward(BadRewardEnv(bad, at_step=3, at_episode=2))
    env.reset(seed=0)
    assert [env.step(0)[1] for _ in range(4)] == [0.0, 0.0, 0.0, 4.0]  # episode 1 is paid as before
    env.reset()
    env.step(0), env.step(0)
    with pytest.raises(ContractError) as excinfo:
        env.step(0)
    message = _one_line(excinfo)
    assert f"reward {bad!r}" in message and "step 3 of episode 2" in message and "DelayedReward" in message


@pytest.mark.parametrize("check_api", [True, False])
def test_check_contract_refuses_a_nan_reward_naming_the_step(check_api):
    # step 2: inside the probe that precedes Gymnasium's check_env (whose determinism check would say
    # "rewards are not equivalent", since NaN != NaN), or in the contract's own episodes
    with pytest.raises(ContractError) as excinfo:
        check_contract(BadRewardEnv(math.nan, at_step=2), check_api=check_api)
    message = _one_line(excinfo)
    assert "reward nan" in message and "expected a finite number" in message
    assert ("step 2 after reset(seed=0)" if check_api else "step 2 of episode 1") in message
    # later than the probe and check_env look: the contract's episodes name it
    with pytest.raises(ContractError) as excinfo:
        check_contract(BadRewardEnv(math.inf, at_step=4), check_api=check_api)
    assert "reward inf at step 4 of episode 1" in _one_line(excinfo)
    if not check_api:  # (check_env's resets would count as episodes of BadRewardEnv)
        with pytest.raises(ContractError) as excinfo:
            check_contract(BadRewardEnv(-math.inf, at_step=4, at_episode=2), episodes=2, check_api=False)
        assert "reward -inf at step 4 of episode 2" in _one_line(excinfo)
    check_contract(BadRewardEnv(1.0), episodes=2, check_api=check_api)  # a finite "bad" reward is fine


@pytest.mark.parametrize("check_api", [True, False])
def test_check_contract_names_an_env_that_mutates_the_observation_it_returned(check_api):
    with pytest.raises(ContractError) as excinfo:
        check_contract(StateArrayEnv(), check_api=check_api)
    message = _one_line(excinfo)
    assert "mutates the observation array it returned" in message and "return a copy" in message
    assert "non-deterministic" not in message and "not equivalent" not in message
    assert (
        "of reset(seed=0) changed in place at step 1" if check_api else "of the reset of episode 1 changed in place"
    ) in message
    check_contract(StateArrayEnv(copy=True), episodes=2, check_api=check_api)


def test_check_contract_names_a_wrapper_that_mutates_the_observation_it_returned():
    env = MutatingWrapper(StateArrayEnv(copy=True))
    with pytest.raises(ContractError) as excinfo:
        check_contract(env)  # check_env sees the sound unwrapped env; the contract's episodes see the wrapper
    assert "mutates the observation array it returned" in _one_line(excinfo) and "at step 1 of episode 1" in str(excinfo.value)


def test_episode_outcomes_refuse_a_non_finite_return_naming_the_episode():
    outcomes = EpisodeOutcomes(ConvergenceTracker(window=2, threshold=0.5), "'X'")
    outcomes.update({}, 1.0)
    with pytest.raises(ContractError) as excinfo:
        outcomes.update({}, math.nan)
    assert "episode 2" in _one_line(excinfo) and "NaN or infinite reward" in str(excinfo.value)
    assert outcomes.summary()["mean_return_last_episodes"] == 1.0  # the NaN never reached the averages


@pytest.fixture
def bad_reward_env_ids():
    ids = {"plain": "test/BadRewardPlain-v0", "delayed": "test/BadRewardDelayed-v0"}
    kwargs = {"bad": math.nan, "at_step": 2, "at_episode": 3}
    common = {"entry_point": BadRewardEnv, "kwargs": kwargs, "max_episode_steps": 4, "disable_env_checker": True}
    gym.register(ids["plain"], **common)
    gym.register(ids["delayed"], **common, additional_wrappers=(DelayedReward.wrapper_spec(),))
    yield ids
    for env_id in ids.values():
        del gym.registry[env_id]


@pytest.mark.parametrize(
    ("algo", "which", "where"),
    [
        ("mc", "plain", "in episode 3"),
        ("mc", "delayed", "at step 2 of episode 3"),
        ("ppo", "plain", "in episode 3"),
    ],
)
def test_a_run_on_an_env_with_a_nan_reward_is_refused_with_one_line(bad_reward_env_ids, tmp_path, capsys, algo, which, where):
    from algorithms.train import main

    log_dir = tmp_path / "run"
    extra = ["--hyperparams", "n_steps=16", "batch_size=16"] if algo == "ppo" else []
    argv = [
        "--algo",
        algo,
        "--env",
        bad_reward_env_ids[which],
        "--max-episodes",
        "10",
        "--no-progress",
        "--log-dir",
        str(log_dir),
    ]
    assert main([*argv, *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and where in err[0], err
    assert "nan" in err[0] and bad_reward_env_ids[which] in err[0]
    summary = log_dir / "summary.json"
    assert not summary.exists() or not math.isnan(json.loads(summary.read_text())["mean_return_last_episodes"])


def test_the_llm_rollout_refuses_a_nan_reward_at_its_turn_instead_of_averaging_it():
    """The LLM arm's mean return must not turn NaN: play_episodes checks each turn's reward (one line, naming it)."""
    pytest.importorskip("transformers")
    from algorithms.llm.generation.rollout import play_episodes
    from algorithms.llm.model.tiny import build_tiny

    _, tok = build_tiny(0)
    env = gym.make("TextWatchRepair-v0")
    step, turns = env.step, []

    def nan_on_second_turn(action):
        obs, reward, terminated, truncated, info = step(action)
        turns.append(action)
        return obs, (float("nan") if len(turns) == 2 else reward), terminated, truncated, info

    env.step = nan_on_second_turn
    answer = tok("Thought : wait for it Action : wait ( )", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    with pytest.raises(ContractError, match=r"returned reward nan at turn 2 of the episode of task seed 11") as raised:
        play_episodes(lambda contexts: [(answer, [-0.1] * len(answer))] * len(contexts), tok, [env], [11], max_turns=4)
    assert "\n" not in str(raised.value)
