"""WatchRepair-v0's exact MDP (vcbm_gym.exact_gradient.watch_repair_mdp) and the env-episode hook `env_episodes`:
J and the gradient by hand from WatchRepairParams' defaults, the DP gradient against finite differences of J,
REINFORCE on the real env's episodes (noise included) against the exact gradient, the env's noise in those
episodes and not in the MDP's, and the benchmark's WatchRepair section (docs/papers/cocoa.md)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

import vcbm_gym  # noqa: F401  (registers WatchRepair-v0)
from algorithms.common.errors import VcbmGymError
from envs.credit_tree import CreditTreeEnv
from envs.watch_repair import KEEP, REPAIR, WatchRepairEnv
from vcbm_gym.exact_gradient import (
    credit_tree_mdp,
    env_episodes,
    exact_policy_gradient,
    expected_return,
    sample_episodes,
    softmax_policy,
    watch_repair_mdp,
    watch_repair_state,
)
from vcbm_gym.gradient_estimators import reinforce_gradients

MDP = watch_repair_mdp(WatchRepairEnv())
HORIZON = 50
# E[G | brand, repair] from the defaults: price - E[cost] - E[transport] - T (0.1 x 0.1 + 0.05 x 7) (the counters'
# expected penalties, 50 x 0.36 = 18): 18 - 1 - 0.5 - 18, 28 - 4 - 2.5 - 18, 31 - 5 - 4.5 - 18, 59 - 24.5 - 18 - 18.
REPAIR_RETURN = np.array([-1.5, 3.5, 3.5, -1.5])
REPAIR_COST = np.array([1.0, 4.0, 5.0, 24.5])
# Var[G | brand, repair] = cost sd^2 + transport sd^2 + T sum_j penalty_j^2 p_j (1 - p_j)
REPAIR_VARIANCE = np.array([4.0, 4.0, 4.0, 1.0]) + 1.5**2 + HORIZON * (0.1**2 * 0.1 * 0.9 + 7.0**2 * 0.05 * 0.95)
START = [MDP.index((0, brand, 0)) for brand in range(4)]


def _vector_env(n: int, mode: str = "vector_entry_point"):
    return gym.make_vec("WatchRepair-v0", num_envs=n, vectorization_mode=mode)


def _logits(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(MDP.n_states, 2))


def test_the_states_the_policy_sees():
    """(flag, brand, t): per brand one start, both flags at t = 1 .. T - 1 and at the end; only t = T ends."""
    assert MDP.n_states == 4 * (1 + 2 * (HORIZON - 1) + 2) == 404 and MDP.horizon == HORIZON
    np.testing.assert_allclose(MDP.initial[START], 0.25)
    assert MDP.initial.sum() == pytest.approx(1.0) and MDP.terminal.sum() == 8
    assert all(MDP.terminal[MDP.index((flag, brand, HORIZON))] for flag in (0, 1) for brand in range(4))
    observation = np.array([[1, 7, 3, 2, 30], [0, 0, 0, 3, 0]])  # [flag, counter1, counter2, brand, t]
    assert MDP.rows(watch_repair_state(observation)).tolist() == [MDP.index((1, 2, 30)), START[3]]
    with pytest.raises(KeyError, match=r"observation \(1, 2, 0\) is not a state"):  # repaired before deciding
        MDP.rows([[1, 2, 0]])
    with pytest.raises(KeyError, match=r"observation \(0, 4, 0\) is not a state"):  # no fifth brand
        MDP.rows([[0, 4, 0]])
    with pytest.raises(ValueError, match=r"keys: expected shape \(N, 3\), got \(2, 5\)"):
        MDP.rows(observation)
    tree = credit_tree_mdp(CreditTreeEnv())  # one-int keys (the node) may come as a flat batch
    assert tree.rows(np.array([4, 0])).tolist() == [tree.index(4), tree.index(0)]


def test_j_and_the_gradient_by_hand():
    """p_b = pi(repair | brand b, t = 0): J = sum_b 1/4 p_b E[G | b, repair]; dJ / dlogits[start_b] =
    1/4 p_b (1 - p_b) E[G | b, repair] (+1, -1); every later row's gradient is 0 (no later action changes anything),
    whatever its logits."""
    p = np.array([0.8, 0.5, 0.25, 0.1])
    logits = 3.0 * _logits(0)  # the later rows' logits must not matter
    logits[START, REPAIR], logits[START, KEEP] = np.log(p / (1 - p)), 0.0
    J, grad = exact_policy_gradient(MDP, logits)
    assert J == pytest.approx(0.25 * (p @ REPAIR_RETURN), rel=1e-12)
    slope = 0.25 * p * (1 - p) * REPAIR_RETURN
    np.testing.assert_allclose(grad[START], np.stack([slope, -slope], axis=1), rtol=1e-12)
    later = np.ones(MDP.n_states, dtype=bool)
    later[START] = False
    assert np.abs(grad[later]).max() < 1e-13  # Q(s, .) flat: Q - V is 0 up to rounding
    rewards = MDP.expected_rewards()  # the repair cost at t = 0, the rest of E[G | b, repair] at t = T - 1
    np.testing.assert_allclose(rewards[START, REPAIR], -REPAIR_COST)
    last = [MDP.index((1, brand, HORIZON - 1)) for brand in range(4)]
    np.testing.assert_allclose(rewards[last], np.repeat((REPAIR_RETURN + REPAIR_COST)[:, None], 2, axis=1))


def test_the_dp_gradient_matches_finite_differences_of_J():
    logits, eps = _logits(1), 1e-6
    _, grad = exact_policy_gradient(MDP, logits)
    cells = [(s, a) for s in START for a in (REPAIR, KEEP)] + [(MDP.index((1, 1, 49)), 0), (MDP.index((0, 2, 7)), 1)]
    for cell in cells:
        up, down = logits.copy(), logits.copy()
        up[cell] += eps
        down[cell] -= eps
        assert grad[cell] == pytest.approx((expected_return(MDP, up) - expected_return(MDP, down)) / (2 * eps), abs=1e-8)
    assert np.abs(grad[START]).min() > 1e-2


def test_the_numpy_vector_env_gives_gym_makes_episodes():
    """The fast path (WatchRepair's vector env) plays sub-env i exactly as gym.make("WatchRepair-v0") with its seed."""
    logits = _logits(2)
    fast = env_episodes(_vector_env(16), MDP, logits, np.random.default_rng(3), watch_repair_state)
    single = env_episodes(_vector_env(16, "sync"), MDP, logits, np.random.default_rng(3), watch_repair_state)
    for name in ("states", "actions", "rewards", "mask"):
        np.testing.assert_array_equal(getattr(fast, name), getattr(single, name))
    assert fast.mask.all() and np.unique(fast.rewards.sum(1)).size > 8  # noisy returns, all 50 steps taken


def test_an_mdp_shorter_than_the_envs_episodes_is_refused():
    short = watch_repair_mdp(WatchRepairEnv(horizon=10))
    with pytest.raises(ValueError, match="4 env episodes outlived horizon=10"):
        env_episodes(_vector_env(4), short, np.zeros((short.n_states, 2)), np.random.default_rng(0), watch_repair_state)


def test_the_env_episodes_carry_the_noise_the_mdp_replaces_by_its_mean():
    """Repaired episodes of brand b: the env's returns average E[G | b, repair] and spread with the analytic
    variance (each within 4.5 standard errors; the variance's from the squared deviations' spread); the MDP's own
    episodes pay exactly E[G | b, repair], no spread."""
    logits = np.zeros((MDP.n_states, 2))
    episodes = env_episodes(_vector_env(20_000), MDP, logits, np.random.default_rng(5), watch_repair_state)
    mdp_episodes = sample_episodes(MDP, logits, 2_000, np.random.default_rng(6))
    for brand in range(4):
        for e, noisy in ((episodes, True), (mdp_episodes, False)):
            returns = e.rewards.sum(1)[(e.states[:, 0] == START[brand]) & (e.actions[:, 0] == REPAIR)]
            assert len(returns) > 200
            if not noisy:
                np.testing.assert_allclose(returns, REPAIR_RETURN[brand], rtol=1e-12)
                continue
            deviations = (returns - returns.mean()) ** 2
            assert abs(returns.mean() - REPAIR_RETURN[brand]) < 4.5 * returns.std(ddof=1) / np.sqrt(len(returns))
            assert abs(deviations.mean() - REPAIR_VARIANCE[brand]) < 4.5 * deviations.std(ddof=1) / np.sqrt(len(returns))
        kept = episodes.rewards.sum(1)[(episodes.states[:, 0] == START[brand]) & (episodes.actions[:, 0] == KEEP)]
        assert np.all(kept == 0.0)  # a kept watch pays nothing, whatever the counters do


def test_reinforce_on_the_real_env_averages_to_the_exact_gradient():
    """20,000 episodes of the env (noise included): every entry's mean within 4.5 standard errors of the exact
    gradient (the later entries, 0, included); with the sign flipped every start entry fails that bound."""
    logits = _logits(7)
    _, exact = exact_policy_gradient(MDP, logits)
    e = env_episodes(_vector_env(20_000), MDP, logits, np.random.default_rng(8), watch_repair_state)
    estimates = reinforce_gradients(softmax_policy(logits), e.states, e.actions, e.rewards, e.mask)
    mean, se = estimates.mean(0), estimates.std(0, ddof=1) / np.sqrt(len(estimates))
    spread = se > 0  # a kept watch's later steps have G_t = 0 in every episode: their entries are exactly 0
    assert np.all(mean[~spread] == 0.0) and np.all(exact[~spread] == 0.0)
    assert spread.sum() == 2 * (4 + 4 * (HORIZON - 1))  # both actions at the starts and a repaired watch's steps
    assert np.max(np.abs(mean - exact)[spread] / se[spread]) < 4.5
    assert np.min(np.abs(-mean[START] - exact[START]) / se[START]) > 4.5


def test_the_benchmarks_watch_repair_section_at_a_tiny_budget(tmp_path):
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "exact_gradient.py"
    spec = importlib.util.spec_from_file_location("exact_gradient_benchmark", path)
    benchmark = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(benchmark)
    out = tmp_path / "eg.json"
    argv = ["--envs", "WatchRepair-v0", "--episodes", "1,4", "--estimates", "16", "--seeds", "2"]
    result = benchmark.run([*argv, "--critic-episodes", "64", "--out", str(out)])
    saved = json.loads(out.read_text())["watch_repair"]
    assert result["rows"] == [] and saved["n_states"] == 404 and saved["params"]["horizon"] == HORIZON
    assert len(saved["rows"]) == 2 * len(benchmark.ESTIMATORS) * 2
    rows = {(r["scope"], r["estimator"], r["episodes"]): r for r in saved["rows"]}
    assert rows[("first_state", "reinforce", 1)]["bias_db"]["estimate"] == -benchmark.LIMIT_DB
    for estimator in ("reinforce", "advantage", "q_critic"):  # 4 episodes: about 6 dB less variance
        variance = [rows[("first_state", estimator, n)]["variance_db"]["estimate"] for n in (1, 4)]
        assert variance[1] < variance[0] - 3
    # the exact critic has spread at the start (the brand is drawn) but none later, where Q(s, .) is flat
    assert -benchmark.LIMIT_DB < rows[("all_states", "q_critic", 1)]["variance_db"]["estimate"] < benchmark.LIMIT_DB
    assert "| first_state | `reinforce` | 1 | -inf |" in saved["table"]
    with pytest.raises(VcbmGymError, match=r"--envs \['Watch'\]: expected names from"):
        benchmark.run(["--envs", "Watch", "--out", str(out)])
