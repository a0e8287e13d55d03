"""SB3 wiring of credit rules: the callback changes what PPO optimises; DQN's buffer; the CLI."""

from __future__ import annotations

import json

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces
from stable_baselines3 import PPO
from stable_baselines3.common.callbacks import BaseCallback, CallbackList
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.vec_env import DummyVecEnv

import vcbm_gym  # noqa: F401  (registers WatchRepair-v0)
from algorithms.common.errors import VcbmGymError
from algorithms.sb3.buffers import RelabelingReplayBuffer
from algorithms.sb3.callbacks import CreditCallback, complete_episodes, discounted_returns_to_go
from algorithms.train import run as train
from tests.helpers import make_batch
from vcbm_gym.credit.base import EpisodeBatch, RewardRule
from vcbm_gym.credit.broadcast import BroadcastRule
from vcbm_gym.credit.redistribute import return_equivalent_rewards
from vcbm_gym.credit.vcbm_bookmark import VCBMBookmarkRule

HORIZON = 50  # WatchRepair-v0's episode length


class _RecordingPPO(PPO):
    """PPO that keeps a copy of the rollout buffer's advantages and returns as train() sees them."""

    def train(self) -> None:
        self.seen_advantages = self.rollout_buffer.advantages.copy()
        self.seen_returns = self.rollout_buffer.returns.copy()
        self.seen_observations = self.rollout_buffer.observations.copy()
        self.seen_actions = self.rollout_buffer.actions.copy()
        super().train()


class _CopyGAE(BaseCallback):
    def _on_step(self) -> bool:
        return True

    def _on_rollout_end(self) -> None:
        self.gae = self.model.rollout_buffer.advantages.copy()


def _one_rollout(rule, n_envs=2, n_steps=2 * HORIZON, gamma=1.0):
    env = DummyVecEnv([lambda: Monitor(gym.make("WatchRepair-v0"))] * n_envs)
    model = _RecordingPPO("MlpPolicy", env, n_steps=n_steps, batch_size=n_steps, n_epochs=1, gamma=gamma, seed=3, device="cpu")
    gae, credit = _CopyGAE(), CreditCallback(rule)
    model.learn(total_timesteps=n_steps * n_envs, callback=CallbackList([gae, credit]))
    return model, gae, credit


def _episodes_from_buffer(model) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Cut the (n_steps, n_envs) buffer into WatchRepair's fixed 50-step episodes, env by env."""
    n_steps, n_envs = model.rollout_buffer.rewards.shape
    rewards = model.rollout_buffer.rewards.T.reshape(n_envs * n_steps // HORIZON, HORIZON)
    obs = model.seen_observations.transpose(1, 0, 2).reshape(n_envs * n_steps // HORIZON, HORIZON, -1)
    actions = model.seen_actions[..., 0].T.reshape(n_envs * n_steps // HORIZON, HORIZON)
    return rewards, obs, actions


def test_broadcast_callback_sets_what_ppo_trains_on():
    model, gae, _ = _one_rollout(BroadcastRule("batch_mean"), gamma=0.9)
    rewards, _, _ = _episodes_from_buffer(model)
    returns = rewards.sum(axis=1)
    expected = np.repeat(returns - returns.mean(), HORIZON).reshape(2, -1).T  # back to (n_steps, n_envs)
    np.testing.assert_allclose(model.seen_advantages, expected, rtol=1e-5, atol=1e-4)
    assert not np.allclose(gae.gae, expected, atol=1e-2)  # SB3's GAE was replaced, not kept
    to_go = discounted_returns_to_go(rewards, np.ones_like(rewards, bool), 0.9)
    np.testing.assert_allclose(model.seen_returns, to_go.reshape(2, -1).T, rtol=1e-5, atol=1e-4)


class _StepRewards(RewardRule):
    """Rewards r_t = scale * (t + 1) on every step: a reward rule whose output is known by hand."""

    name = "step_rewards"

    def __init__(self, scale: float = 1.0) -> None:
        self.scale = scale

    def rewards(self, batch: EpisodeBatch) -> np.ndarray:
        return np.where(batch.mask, self.scale * (np.arange(batch.mask.shape[1]) + 1.0)[None], 0.0)


def _gae_by_hand(rewards: np.ndarray, values: np.ndarray, gamma: float, lam: float) -> np.ndarray:
    """GAE of one terminated episode: delta_t = r_t + gamma V_{t+1} - V_t (V after the last step 0), A_t = sum
    (gamma lam)^k delta_{t+k}."""
    next_values = np.append(values[1:], 0.0)
    deltas = rewards + gamma * next_values - values
    out, running = np.zeros_like(rewards), 0.0
    for t in reversed(range(len(rewards))):
        running = deltas[t] + gamma * lam * running
        out[t] = running
    return out


@pytest.mark.parametrize("scale", [1.0, -1.0])
def test_a_reward_rule_reaches_ppo_as_the_reward_gae_sees_not_as_the_advantage(scale):
    env = DummyVecEnv([lambda: Monitor(gym.make("WatchRepair-v0"))])
    model = _RecordingPPO("MlpPolicy", env, n_steps=2 * HORIZON, batch_size=50, n_epochs=1, gamma=0.9, gae_lambda=0.8, seed=3)
    model.learn(total_timesteps=2 * HORIZON, callback=CreditCallback(_StepRewards(scale)))
    buf, steps = model.rollout_buffer, scale * (np.arange(HORIZON) + 1.0)
    np.testing.assert_allclose(buf.rewards[:, 0], np.tile(steps, 2))  # the rule's rewards replaced the env's
    for start in (0, HORIZON):
        values = buf.values[start : start + HORIZON, 0]
        expected = _gae_by_hand(steps, values, 0.9, 0.8)
        np.testing.assert_allclose(model.seen_advantages[start : start + HORIZON, 0], expected, rtol=1e-5, atol=1e-4)
        np.testing.assert_allclose(model.seen_returns[start : start + HORIZON, 0], expected + values, rtol=1e-5, atol=1e-4)
    assert not np.allclose(model.seen_advantages[:HORIZON, 0], steps, atol=1e-2)  # not taken as the advantage


def test_vcbm_bookmark_callback_rewards_are_the_rules_on_the_same_episodes():
    kwargs = dict(alpha=0.05, baseline="batch_mean", warmup_transitions=0, z_thresh=1.0)
    model, _, credit = _one_rollout(VCBMBookmarkRule(**kwargs), n_envs=4)
    rewards, obs, actions = _episodes_from_buffer(model)
    reference = VCBMBookmarkRule(**kwargs)
    env_rewards = credit._env_rewards.T.reshape(rewards.shape)
    batch = make_batch(env_rewards, observations=obs, actions=actions)
    np.testing.assert_allclose(rewards, reference.rewards(batch), rtol=1e-5, atol=1e-4)  # credit before observe
    reference.observe(batch)
    assert reference.bookmarks(batch)[:, 0].all()  # t = 0 (flag 0, clock 0) is the bookmark
    assert credit.rule.contexts == reference.contexts
    # once the rule knows its bookmarks, its rewards put the episode's return minus the baseline on them
    np.testing.assert_allclose(reference.rewards(batch).sum(axis=1), env_rewards.sum(axis=1), rtol=1e-6, atol=1e-3)


def test_complete_episodes_skips_the_rollout_edges_by_hand():
    starts = np.array([[1, 0], [0, 0], [0, 1], [1, 0], [0, 0], [0, 0]])
    # env 0: [0, 3) complete, [3, 6) runs on (not done); env 1: [0, 2) began last rollout, [2, 6) done.
    assert complete_episodes(starts, np.array([False, True])) == [(0, 0, 3), (1, 2, 6)]


def test_partial_episodes_keep_gae():
    model, gae, credit = _one_rollout(BroadcastRule("batch_mean"), n_envs=1, n_steps=HORIZON + 20)
    assert credit.last_episodes == [(0, 0, HORIZON)]
    np.testing.assert_array_equal(model.seen_advantages[HORIZON:], gae.gae[HORIZON:])
    assert np.all(model.seen_advantages[:HORIZON] == 0.0)  # one complete episode minus its own mean


def test_return_equivalent_rewards_by_hand():
    advantages = np.array([[6.0, 1.0, 1.0, 0.0]])
    mask = np.array([[True, True, True, False]])
    # G = 2, sum A = 8 over 3 steps: each real step gets (2 - 8) / 3 = -2 added.
    np.testing.assert_allclose(return_equivalent_rewards(advantages, mask, np.array([2.0])), [[4.0, -1.0, -1.0, 0.0]])


def test_redistribution_buffer_holds_the_episode_back():
    space = spaces.MultiDiscrete([2, 4])
    buffer = RelabelingReplayBuffer(
        16,
        space,
        spaces.Discrete(2),
        device="cpu",
        rule=VCBMBookmarkRule(alpha=0.5, baseline="none", warmup_transitions=0, z_thresh=0.5),
    )
    states = [np.array([[0, 0]]), np.array([[1, 1]]), np.array([[1, 2]])]
    for t, reward in enumerate([-1.0, 0.0, 7.0]):
        done = np.array([t == 2])
        buffer.add(states[t], np.array([[1, t + 1]]), np.array([[0]]), np.array([reward]), done, [{}])
        assert buffer.size() == (3 if t == 2 else 0)
    assert buffer.rewards[:3, 0].sum() == pytest.approx(6.0)  # the episode's return, redistributed


def test_train_cli_ppo_vcbm_bookmark_writes_summary(tmp_path):
    argv = ["--algo", "ppo", "--credit", "vcbm_bookmark", "--env", "WatchRepair-v0", "--max-episodes", "200"]
    summary = train([*argv, "--log-dir", str(tmp_path), "--no-progress"])
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert on_disk["credit"] == "vcbm_bookmark" and on_disk["episodes_run"] == 200 == summary["episodes_run"]
    assert set(on_disk) >= {"converged", "episodes_to_converge", "episodes_run", "final_correct_rate"}
    assert list(tmp_path.glob("ppo_vcbm_bookmark_*/events.out.tfevents.*"))
    assert on_disk["credit_roles"] == {
        "repaired_flag": "controlled",
        "counter1": "noise",
        "counter2": "noise",
        "brand": "static",
        "timestep": "clock",
    }


@pytest.mark.parametrize("algo", ["a2c", "dqn"])
def test_train_cli_a2c_and_dqn_run_with_a_rule(tmp_path, algo):
    summary = train(
        ["--algo", algo, "--credit", "vcbm_bookmark", "--max-episodes", "25", "--log-dir", str(tmp_path), "--no-progress"]
    )
    assert summary["episodes_run"] == 25


@pytest.mark.parametrize("algo", ["ppo", "a2c"])
def test_on_policy_rollouts_shorter_than_an_episode_are_refused_with_a_rule(tmp_path, algo):
    """WatchRepair's episodes are 50 steps: a 49-step rollout never holds a whole one, so the rule would never act."""

    def run(name: str, n_steps: int, *credit: str) -> dict:
        sizes = [f"n_steps={n_steps}", "n_envs=1"] + ([f"batch_size={n_steps}"] if algo == "ppo" else [])
        log = ["--log-dir", str(tmp_path / name), "--no-progress"]
        return train(["--algo", algo, "--max-episodes", "2", *log, *credit, "--hyperparams", *sizes])

    with pytest.raises(VcbmGymError, match=rf"{algo} with --credit needs n_steps >= one episode \(50 steps\).*got n_steps=49$"):
        run("short", 49, "--credit", "rudder")
    assert not (tmp_path / "short").exists()  # refused before anything is written
    assert run("plain", 49)["episodes_run"] == 2  # without a rule the same rollout length is fine
    assert run("whole", 50, "--credit", "rudder")["episodes_run"] == 2


def test_unknown_credit_is_one_clear_error(tmp_path):
    with pytest.raises(VcbmGymError, match="unknown credit rule 'bogus'; expected one of: none, broadcast"):
        train(["--algo", "ppo", "--credit", "bogus", "--log-dir", str(tmp_path)])


def test_credit_kwargs_are_keyed_by_rule_name(tmp_path):
    with pytest.raises(VcbmGymError, match=r"credit_kwargs\['alpha'\]"):
        train(
            [
                "--algo",
                "ppo",
                "--credit",
                "vcbm_bookmark",
                "--hyperparams",
                "credit_kwargs={alpha: 0.1}",
                "--log-dir",
                str(tmp_path),
            ]
        )
    with pytest.raises(VcbmGymError, match=r"credit rule 'vcbm_bookmark' .*alpha=0.0: expected a number"):
        train(
            [
                "--algo",
                "ppo",
                "--credit",
                "vcbm_bookmark",
                "--max-episodes",
                "1",
                "--hyperparams",
                "credit_kwargs={vcbm_bookmark: {alpha: 0.0}}",
                "--log-dir",
                str(tmp_path),
            ]
        )


def test_bookmark_weights_on_gae_keep_gae_at_alpha_one():
    rule = VCBMBookmarkRule(alpha=1.0, advantage="given", warmup_transitions=0, z_thresh=1.0)
    model, gae, _ = _one_rollout(rule, n_envs=2)
    np.testing.assert_allclose(model.seen_advantages, gae.gae, rtol=1e-6, atol=1e-5)


def test_group_ids_by_initial_observation():
    from algorithms.sb3.callbacks import group_ids_for

    first = np.array([[0, 0, 0, 1, 0], [0, 0, 0, 2, 0], [0, 0, 0, 1, 0]])
    np.testing.assert_array_equal(group_ids_for(first, "initial_obs"), [0, 1, 0])
    np.testing.assert_array_equal(group_ids_for(first, "none"), [0, 0, 0])
