"""RRD (vcbm_gym/credit/rrd.py): the surrogate loss and its bias correction by hand, learning a known
reward, and the rule through SB3 PPO."""

from __future__ import annotations

import copy
import itertools
import json

import gymnasium as gym
import numpy as np
import pytest
import torch

import vcbm_gym  # noqa: F401  (registers WatchRepair-v0)
from tests.helpers import make_batch
from vcbm_gym.credit.base import EpisodeBatch
from vcbm_gym.credit.registry import make_rule
from vcbm_gym.credit.rrd import RewardModel, RRDConfig, RRDRule, mlp_backward, mlp_forward, rrd_loss, sample_subsets

TRUE_REWARD = np.array([-1.0, 0.5, 2.0, 0.0])  # per category of the synthetic task


class OneHotCategory:
    """Synthetic featurizer: the one-hot of observation component 0 (4 categories)."""

    n_features = 4

    def __call__(self, observations: np.ndarray, actions: np.ndarray) -> np.ndarray:
        return np.eye(4, dtype=np.float32)[np.asarray(observations)[..., 0]]


def _loss(rewards, mask, lengths, returns, corrected):
    loss, surrogate, correction, _ = rrd_loss(np.array(rewards), np.array(mask), np.array(lengths), np.array(returns), corrected)
    return [loss, surrogate, correction]


def _torch_loss(r, m, t, g, corrected):
    """The loss of the docstring in torch, written independently: the autograd reference for the gradients."""
    n = m.sum(1)
    est = t / n * (r * m).sum(1)
    mean = (r * m).sum(1) / n
    var = ((r - mean[:, None]) ** 2 * m).sum(1) / (n - 1).clamp(min=1)
    corr = torch.where(n > 1, t**2 * (1 - n / t) * var / n, torch.zeros_like(n))
    return ((g - est) ** 2).mean() - (corr.mean() if corrected else 0.0)


@pytest.mark.parametrize("corrected", [False, True])
def test_loss_gradient_and_backpropagation_equal_torch_autograd(corrected):
    rng = np.random.default_rng(4)
    lengths = np.array([7, 3, 1, 5])
    features = rng.normal(size=(4, 5, 6))
    indices, mask = sample_subsets(rng, lengths, 5)
    returns = rng.normal(size=4) * 5
    model = RewardModel(6, (8, 5), seed=2)
    params = [p.detach().numpy() for p in model.parameters()]
    rewards, activations = mlp_forward(params, features)
    loss, _, _, d_rewards = rrd_loss(rewards, mask, lengths, returns, corrected)
    grads = mlp_backward(params, activations, d_rewards)

    x = torch.from_numpy(features)
    reference = _torch_loss(
        model(x), torch.from_numpy(mask).double(), torch.from_numpy(lengths).double(), torch.from_numpy(returns), corrected
    )
    reference.backward()
    np.testing.assert_allclose(rewards, model(x).detach().numpy(), rtol=1e-12)
    assert loss == pytest.approx(reference.item(), rel=1e-12)
    for grad, param in zip(grads, model.parameters()):
        np.testing.assert_allclose(grad, param.grad.numpy(), rtol=1e-9, atol=1e-12)


def test_surrogate_and_correction_by_hand():
    # T = 4 steps, I = 2 sampled steps with r = 1 and 3, G = 10:
    # T/n sum = 4/2 * 4 = 8, surrogate (10 - 8)^2 = 4; s^2 = ((1-2)^2 + (3-2)^2) / 1 = 2;
    # correction T^2 (1 - n/T) s^2 / n = 16 * 0.5 * 2 / 2 = 8.
    loss, surrogate, correction = _loss([[1.0, 3.0]], [[True, True]], [4], [10.0], corrected=False)
    assert (loss, surrogate, correction) == (4.0, 4.0, 8.0)
    loss, _, _ = _loss([[1.0, 3.0]], [[True, True]], [4], [10.0], corrected=True)
    assert loss == -4.0
    # an episode shorter than K uses all its steps: the surrogate is L_RD, no correction;
    # one sample alone has no variance estimate
    assert _loss([[1.0, 2.0, 9.0]], [[True, True, False]], [2], [5.0], True) == [4.0, 4.0, 0.0]
    assert _loss([[2.0]], [[True]], [3], [5.0], True) == [1.0, 1.0, 0.0]


def test_corrected_loss_averages_to_l_rd_over_every_subset():
    """E_I[corrected] = L_RD = (G - sum_t r_t)^2 exactly; the plain surrogate exceeds it by Var_I."""
    r = np.array([0.3, -1.2, 2.5, 0.7, 1.9])
    g = 6.0
    subsets = list(itertools.combinations(range(len(r)), 3))
    picked = np.array([r[list(s)] for s in subsets])
    ones = np.ones(picked.shape, bool)
    lengths, returns = np.full(len(subsets), 5), np.full(len(subsets), g)
    corrected, surrogate, _ = _loss(picked, ones, lengths, returns, True)
    l_rd = (g - r.sum()) ** 2
    estimates = 5 / 3 * picked.sum(axis=1)
    assert corrected == pytest.approx(l_rd, rel=1e-12)
    assert surrogate == pytest.approx(l_rd + estimates.var(), rel=1e-12) and surrogate > l_rd + 1.0


def test_sample_subsets_are_distinct_steps_inside_each_episode():
    rng = np.random.default_rng(0)
    lengths = np.array([5, 2, 8])
    indices, mask = sample_subsets(rng, lengths, 4)
    np.testing.assert_array_equal(mask, [[1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 1]])
    for row, keep, length in zip(indices, mask, lengths):
        chosen = row[keep]
        assert len(set(chosen.tolist())) == len(chosen) and chosen.max() < length
    counts = np.zeros(8)
    for _ in range(2000):
        idx, m = sample_subsets(rng, np.array([8]), 2)
        np.add.at(counts, idx[m], 1)
    # each step is picked with probability 2/8 per draw: 500 expected, sd sqrt(2000 * 0.25 * 0.75) ~ 19
    assert np.all(np.abs(counts - 500) < 5 * 19.4)


def _synthetic_batch(rng: np.random.Generator, n: int, horizon: int = 10) -> EpisodeBatch:
    """Episodes of random categories; the true reward of a step is TRUE_REWARD[category], all paid at the end."""
    categories = rng.integers(0, 4, size=(n, horizon))
    rewards = np.zeros((n, horizon))
    rewards[:, -1] = TRUE_REWARD[categories].sum(axis=1)
    return EpisodeBatch(
        rewards, np.ones((n, horizon), bool), observations=categories[..., None], actions=np.zeros((n, horizon), np.int64)
    )


def _exact_l_rd(rule: RRDRule, batch: EpisodeBatch) -> float:
    return float(np.mean((batch.returns - rule.model_rewards(batch).sum(axis=1)) ** 2))


def _train_on_synthetic(subsequence_size: int, bias_correction: bool) -> tuple[RRDRule, float, float, np.ndarray]:
    """A linear model trained on 8 batches of 64 ten-step episodes: (rule, held-out L_RD before, after, learned rewards)."""
    rng = np.random.default_rng(7)
    rule = RRDRule(
        OneHotCategory(),
        hidden_sizes=(),
        subsequence_size=subsequence_size,
        episodes_per_step=32,
        train_steps=100,
        learning_rate=0.02,
        min_buffer_episodes=64,
        bias_correction=bias_correction,
        seed=3,
    )
    held_out = _synthetic_batch(np.random.default_rng(99), 200)
    before = _exact_l_rd(rule, held_out)
    for _ in range(8):
        rule.observe(_synthetic_batch(rng, 64))
    one_of_each = EpisodeBatch(
        np.zeros((1, 4)), np.ones((1, 4), bool), observations=np.arange(4)[None, :, None], actions=np.zeros((1, 4), np.int64)
    )
    return rule, before, _exact_l_rd(rule, held_out), rule.model_rewards(one_of_each)[0]


@pytest.mark.parametrize(("subsequence_size", "bias_correction", "atol"), [(10, False, 1e-4), (4, True, 0.1)])
def test_linear_model_recovers_a_known_per_step_reward(subsequence_size, bias_correction, atol):
    """With all T = 10 steps the surrogate is L_RD; with K = 4 the corrected loss is L_RD in expectation:
    both fit the noise-free rewards, up to optimisation error (SGD noise of the subsets at K = 4)."""
    rule, before, after, learned = _train_on_synthetic(subsequence_size, bias_correction)
    assert rule.trained and after < 0.01 * before
    np.testing.assert_allclose(learned, TRUE_REWARD, atol=atol)


def test_uncorrected_surrogate_shrinks_the_rewards_towards_their_mean():
    """L_Rand-RD = L_RD + Var_I (the paper's Proposition 1): at K = 4 of 10 it trades fit for smoothness,
    keeping the order of the rewards but not their spread."""
    rule, before, after, learned = _train_on_synthetic(4, False)
    assert after < 0.1 * before
    np.testing.assert_array_equal(np.argsort(learned), np.argsort(TRUE_REWARD))
    assert learned.std() < 0.6 * TRUE_REWARD.std()


def test_advantages_are_raw_rewards_until_trained_then_the_model():
    batch = _synthetic_batch(np.random.default_rng(0), 3)
    rule = RRDRule(OneHotCategory(), min_buffer_episodes=4, train_steps=1)
    rule.observe(batch)
    assert not rule.trained
    np.testing.assert_array_equal(rule.advantages(batch), batch.rewards)
    rule.observe(batch)
    assert rule.stats.steps == 1
    np.testing.assert_array_equal(rule.advantages(batch), rule.model_rewards(batch))
    short = EpisodeBatch(
        batch.rewards, np.arange(10)[None, :] < np.array([[3], [10], [1]]), observations=batch.observations, actions=batch.actions
    )
    assert np.all(rule.advantages(short)[~short.mask] == 0.0)


def _watch_repair_batches(env: gym.Env, n_batches: int, seed: int) -> list[EpisodeBatch]:
    """Batches of 64 WatchRepair episodes under the uniform random policy."""
    rng = np.random.default_rng(seed)
    batches = []
    for _ in range(n_batches):
        obs, acts, rews = [], [], []
        for _ in range(64):
            o, _ = env.reset(seed=int(rng.integers(2**31)))
            ep_obs, ep_acts, ep_rews, done = [], [], [], False
            while not done:
                a = int(rng.integers(2))
                ep_obs.append(o)
                ep_acts.append(a)
                o, r, term, trunc, _ = env.step(a)
                ep_rews.append(r)
                done = term or trunc
            obs.append(ep_obs), acts.append(ep_acts), rews.append(ep_rews)
        batches.append(make_batch(np.array(rews), observations=np.array(obs), actions=np.array(acts)))
    return batches


def test_mlp_beats_the_best_constant_decomposition_on_watch_repair():
    """On 256 held-out episodes the learned decomposition explains part of the return's variance (a
    constant per-step reward, the best return-blind decomposition, leaves all of it: L_RD = Var G).
    Only part: WatchRepair's features (state differences) cannot tell after t = 1 whether the watch
    was repaired, so the counters' penalties stay partly unexplained (measured: 0.81 Var G)."""
    env = gym.make("WatchRepair-v0")
    rule = make_rule("rrd", env=env, train_steps=40, min_buffer_episodes=64, seed=1)
    assert rule.n_features == 10  # WatchRepair's own credit featurizer
    batches = _watch_repair_batches(env, 14, seed=5)
    held_out = EpisodeBatch(
        np.concatenate([b.rewards for b in batches[10:]]),
        np.ones((256, 50), bool),
        observations=np.concatenate([b.observations for b in batches[10:]]),
        actions=np.concatenate([b.actions for b in batches[10:]]),
    )
    before = _exact_l_rd(rule, held_out)
    for batch in batches[:10]:
        rule.observe(batch)
    after = _exact_l_rd(rule, held_out)
    assert after < 0.9 * held_out.returns.var() < 0.9 * before


def test_state_round_trip_continues_identically():
    rng = np.random.default_rng(2)
    first, second = _synthetic_batch(rng, 8), _synthetic_batch(rng, 8)
    rule = RRDRule(OneHotCategory(), min_buffer_episodes=4, train_steps=3, episodes_per_step=4)
    rule.observe(first)
    state = json.loads(json.dumps({"config": rule.state_dict()["config"]}))  # a config through JSON still matches
    restored = RRDRule(OneHotCategory(), min_buffer_episodes=4, train_steps=3, episodes_per_step=4, seed=9)
    restored.load_state_dict({**copy.deepcopy(rule.state_dict()), **state})
    rule.observe(second)
    restored.observe(second)
    np.testing.assert_array_equal(restored.advantages(second), rule.advantages(second))
    with pytest.raises(ValueError, match="saved config differs"):
        RRDRule(OneHotCategory(), train_steps=4).load_state_dict(rule.state_dict())


def test_bad_options_are_one_clear_error():
    with pytest.raises(ValueError, match="unknown RRDRule option\\(s\\) \\['k'\\]"):
        RRDRule(OneHotCategory(), k=3)
    with pytest.raises(ValueError, match="subsequence_size=0"):
        RRDConfig(subsequence_size=0)
    with pytest.raises(ValueError, match="featurizer=None"):
        RRDRule()
    assert RRDConfig(hidden_sizes=[8, 8]).hidden_sizes == (8, 8)


def test_the_llm_arm_refuses_rrd_in_one_line():
    from algorithms.common.credit_slot import CreditSlot
    from algorithms.llm.config import LLM_CREDIT

    with pytest.raises(ValueError, match="credit rule 'rrd' needs observations, actions, which the llm arm does not provide"):
        CreditSlot("rrd", {}).build(LLM_CREDIT)


def _random_episodes(n: int, seed: int) -> EpisodeBatch:
    env = gym.make("WatchRepair-v0")
    rng, rows = np.random.default_rng(seed), []
    for k in range(n):
        obs, _ = env.reset(seed=seed + k)
        observations, actions, rewards, done = [], [], [], False
        while not done:
            action = int(rng.integers(2))
            observations.append(obs), actions.append(action)
            obs, reward, terminated, truncated, _ = env.step(action)
            rewards.append(reward)
            done = terminated or truncated
        rows.append((observations, actions, rewards))
    return EpisodeBatch(
        np.array([r for _, _, r in rows]),
        np.ones((n, len(rows[0][2])), dtype=bool),
        observations=np.array([o for o, _, _ in rows]),
        actions=np.array([a for _, a, _ in rows]),
    )


def test_ppo_takes_the_learned_rewards_as_its_rewards():
    """The rewards PPO's GAE reads are the rule's r_theta of the rollout's episodes (a trained model, frozen here
    so that the rollout's own observe leaves it as it was)."""
    from tests.test_sb3_credit import _episodes_from_buffer, _one_rollout

    rule = RRDRule.from_env(gym.make("WatchRepair-v0"), min_buffer_episodes=4, train_steps=20)
    rule.observe(_random_episodes(8, seed=100))
    assert rule.stats.steps == 20
    rule.config.train_steps = 0
    model, _, credit = _one_rollout(rule, n_envs=4)
    written, obs, actions = _episodes_from_buffer(model)
    batch = make_batch(written, observations=obs, actions=actions)
    expected = rule.model_rewards(batch)
    assert np.abs(expected).max() > 0 and not np.allclose(expected, credit._env_rewards.T.reshape(expected.shape))
    np.testing.assert_allclose(written, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("algo", ["ppo", "dqn"])
def test_train_cli_runs_rrd_end_to_end(tmp_path, algo):
    from algorithms.train import run as train

    episodes = "128" if algo == "ppo" else "25"
    argv = ["--algo", algo, "--credit", "rrd", "--env", "WatchRepair-v0", "--max-episodes", episodes]
    summary = train([*argv, "--log-dir", str(tmp_path), "--no-progress"])
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert on_disk["credit"] == "rrd" and on_disk["episodes_run"] == int(episodes) == summary["episodes_run"]
    credit = on_disk["credit_summary"]
    assert credit["n_features"] == 10 and credit["episodes_seen"] > 0
    if algo == "ppo":  # 64 episodes reach the rule in the first rollout: above min_buffer_episodes, so it trained
        assert credit["train_steps"] == RRDConfig().train_steps and np.isfinite(credit["last_loss"])
