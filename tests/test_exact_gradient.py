"""Exact policy gradients (vcbm_gym/exact_gradient.py) and the estimators and COCOA scores of
vcbm_gym/gradient_estimators.py (docs/papers/cocoa.md): hand-computed cases, the DP gradient against torch
autograd and finite differences of J, and each estimator's mean against the exact gradient."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from algorithms.common.errors import VcbmGymError
from envs.credit_tree import CreditTreeEnv
from envs.key_to_door import LinearKeyToDoorEnv
from tests.helpers import load_file
from vcbm_gym.exact_gradient import (
    TabularMDP,
    credit_tree_mdp,
    evaluate_policy,
    exact_policy_gradient,
    expected_critic_gradient,
    expected_return,
    key_to_door_mdp,
    sample_episodes,
    softmax_policy,
)
from vcbm_gym.gradient_estimators import (
    advantage_gradients,
    bias_db,
    fit_action_values,
    fit_state_values,
    q_critic_gradients,
    reinforce_gradients,
    rewards_to_go,
    score_function_gradients,
    snr_db,
    variance_db,
)

TREE = credit_tree_mdp(CreditTreeEnv())  # depth 2, leaves (0, 1, 0.5, 0): nodes 3, 4, 5, 6
SLIPPERY_TREE = credit_tree_mdp(CreditTreeEnv(depth=3, leaf_rewards=np.arange(8.0) % 3, slip=0.2))
CONVEYOR = key_to_door_mdp(LinearKeyToDoorEnv(length=23))
RANDOM_CONVEYOR = key_to_door_mdp(LinearKeyToDoorEnv(length=23, random_layout=True))


def _logits(mdp, seed):
    return np.random.default_rng(seed).normal(size=(mdp.n_states, mdp.n_actions))


# --- the exact gradient -------------------------------------------------------------------------------------------


def test_the_tree_by_hand():
    """pi(0 | root) = p, pi(0 | node 1) = q, pi(0 | node 2) = r: J = p (1 - q) + (1 - p) r 0.5."""
    logits = np.zeros((7, 2))
    logits[0, 0], logits[1, 0], logits[2, 0] = np.log(3.0), np.log(1 / 3), 0.0  # p = 3/4, q = 1/4, r = 1/2
    p, q, r = 0.75, 0.25, 0.5
    J, grad = exact_policy_gradient(TREE, logits)
    assert J == pytest.approx(p * (1 - q) + (1 - p) * r * 0.5)
    # dJ/dlogit[s, 0] = pi0 (1 - pi0) dJ/dpi0 = -dJ/dlogit[s, 1]
    dJ_dp, dJ_dq, dJ_dr = (1 - q) - r * 0.5, -p, (1 - p) * 0.5
    expected = np.zeros((7, 2))
    for node, prob, slope in ((0, p, dJ_dp), (1, q, dJ_dq), (2, r, dJ_dr)):
        expected[node] = [prob * (1 - prob) * slope, -prob * (1 - prob) * slope]
    np.testing.assert_allclose(grad, expected, atol=1e-15)
    assert TREE.states == ((0,), (1,), (2,), (3,), (4,), (5,), (6,)) and TREE.terminal.tolist() == [False] * 3 + [True] * 4


def _torch_return(mdp: TabularMDP, logits: torch.Tensor) -> torch.Tensor:
    """J by the same backups in float64 torch: autograd differentiates the DP itself."""
    policy = torch.softmax(logits, dim=-1)
    transitions, rewards = torch.tensor(mdp.transitions), torch.tensor(mdp.expected_rewards())
    values = torch.zeros(mdp.n_states, dtype=torch.float64)
    for _ in range(mdp.horizon):
        values = (policy * (rewards + transitions @ values)).sum(-1)
    return torch.tensor(mdp.initial) @ values


@pytest.mark.parametrize("mdp", [SLIPPERY_TREE, CONVEYOR, RANDOM_CONVEYOR], ids=["tree", "conveyor", "random"])
def test_the_policy_gradient_theorem_equals_autograd_of_the_dp(mdp):
    logits = _logits(mdp, 0)
    J, grad = exact_policy_gradient(mdp, logits)
    logits_t = torch.tensor(logits, requires_grad=True)
    J_t = _torch_return(mdp, logits_t)
    J_t.backward()
    assert J == pytest.approx(J_t.item(), rel=1e-12)
    np.testing.assert_allclose(grad, logits_t.grad.numpy(), rtol=1e-9, atol=1e-13)
    assert np.abs(grad).max() > 1e-3


@pytest.mark.parametrize("mdp, entries", [(SLIPPERY_TREE, None), (CONVEYOR, 12)], ids=["tree", "conveyor"])
def test_the_dp_gradient_matches_finite_differences_of_J(mdp, entries):
    logits, eps = _logits(mdp, 1), 1e-6
    _, grad = exact_policy_gradient(mdp, logits)
    cells = [(s, a) for s in range(mdp.n_states) for a in range(mdp.n_actions) if not mdp.terminal[s]]
    if entries is not None:  # the largest entries and a few others, to keep the test short
        order = sorted(cells, key=lambda cell: -abs(grad[cell]))
        cells = order[: entries // 2] + order[-entries // 2 :]
    for cell in cells:
        up, down = logits.copy(), logits.copy()
        up[cell] += eps
        down[cell] -= eps
        assert grad[cell] == pytest.approx((expected_return(mdp, up) - expected_return(mdp, down)) / (2 * eps), abs=1e-8)


def test_the_conveyors_return_under_uniform_play_by_hand():
    """Uniform play: each apple is eaten with probability 1/4 for 0.5 x 23 / L on average; the key and the door
    each with probability 1/4, then the treasure 0.2 x 23 / L."""
    env = LinearKeyToDoorEnv(length=23)
    n_apples = int(np.isin(env.fixed_layout, [1, 2]).sum())
    J = expected_return(CONVEYOR, np.zeros((CONVEYOR.n_states, 4)))
    assert J == pytest.approx(n_apples * 0.25 * 0.5 + 0.25 * 0.25 * 0.2)


def test_an_mdp_whose_episodes_outlive_the_horizon_is_refused():
    tree = credit_tree_mdp(CreditTreeEnv(depth=3, leaf_rewards=np.arange(8.0)))
    with pytest.raises(ValueError, match="outlives horizon=2"):
        TabularMDP(tree.transitions, tree.reward_values, tree.reward_probs, tree.initial, tree.terminal, 2, tree.states)


# --- COCOA's scores -------------------------------------------------------------------------------------------------


def test_scores_by_hand():
    """g = (1, 0); estimates (1, 1) and (3, -1): mean (2, 0), ||g - mean|| = 1 = ||g||, so bias 0 dB; the
    deviations from the mean are all +-1, mean g^2 = 1/2, so variance 10 log10(2); ||g_hat - g||^2 = 1 and 5, so
    SNR 10 log10(1 / 3)."""
    g, estimates = np.array([1.0, 0.0]), np.array([[1.0, 1.0], [3.0, -1.0]])
    assert bias_db(estimates, g) == pytest.approx(0.0, abs=1e-12)
    assert variance_db(estimates, g) == pytest.approx(10 * np.log10(2))
    assert snr_db(estimates, g) == pytest.approx(10 * np.log10(1 / 3))
    # with E g_hat known (COCOA's analytic expectation) = g: no bias; deviations (0, 1), (2, -1) -> 6 / 4 / 0.5
    assert bias_db(estimates, g, expected=g) == -np.inf
    assert variance_db(estimates, g, expected=g) == pytest.approx(10 * np.log10(3))
    assert bias_db(estimates * 0 + g * 2, g) == pytest.approx(0.0) and bias_db(estimates * 0 + g * 11, g) == pytest.approx(20)
    with pytest.raises(ValueError, match="exact gradient is zero"):
        snr_db(estimates, np.zeros(2))


# --- the estimators ---------------------------------------------------------------------------------------------


def test_one_tree_episode_by_hand():
    """Uniform play, root -> node 1 (action 0) -> leaf 4 (action 1), reward 1 at the last step."""
    policy = softmax_policy(np.zeros((7, 2)))
    states, actions, rewards, mask = np.array([[0, 1]]), np.array([[0, 1]]), np.array([[0.0, 1.0]]), np.ones((1, 2), bool)
    expected = np.zeros((1, 7, 2))
    expected[0, 0], expected[0, 1] = [0.5, -0.5], [-0.5, 0.5]  # G = 1 at both steps; onehot(a) - (1/2, 1/2)
    np.testing.assert_allclose(reinforce_gradients(policy, states, actions, rewards, mask), expected)
    values = np.array([0.375, 0.5, 0.25, 0, 0, 0, 0])
    expected[0, 0], expected[0, 1] = [0.3125, -0.3125], [-0.25, 0.25]  # (1 - 0.375) / 2, (1 - 0.5) / 2
    np.testing.assert_allclose(advantage_gradients(policy, states, actions, rewards, mask, values), expected)
    q_values = np.array([[0.5, 0.25], [0.0, 1.0], [0.5, 0.0], *[[0.0, 0.0]] * 4])
    expected[0, 0], expected[0, 1] = [0.0625, -0.0625], [-0.25, 0.25]  # pi (Q - pi . Q)
    np.testing.assert_allclose(q_critic_gradients(policy, states, mask, q_values), expected)


def test_rewards_to_go_and_learned_values_by_hand():
    rewards, mask = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 9.0]]), np.array([[True, True, True], [True, True, False]])
    assert rewards_to_go(rewards, mask).tolist() == [[6.0, 5.0, 3.0], [9.0, 5.0, 0.0]]
    states, actions = np.array([[0, 1, 2], [0, 2, 2]]), np.array([[0, 1, 0], [1, 1, 0]])
    np.testing.assert_allclose(fit_state_values(states, rewards, mask, 4), [7.5, 5.0, 4.0, 0.0])
    np.testing.assert_allclose(fit_action_values(states, actions, rewards, mask, 4, 2), [[6, 9], [0, 5], [3, 5], [0, 0]])


def _max_z(estimates: np.ndarray, exact: np.ndarray) -> float:
    """The largest |mean - exact| / standard error over the gradient's entries; inf where an entry with no spread
    is not exact."""
    mean, se = estimates.mean(0), estimates.std(0, ddof=1) / np.sqrt(len(estimates))
    spread = se > 1e-12  # an entry every episode gives alike (the critic's at the start state) differs by rounding
    if not np.allclose(mean[~spread], exact[~spread], atol=1e-10):
        return np.inf
    return float(np.max(np.abs(mean - exact)[spread] / se[spread]))


def _estimates(name: str, mdp, logits, episodes, side_batch):
    policy = softmax_policy(logits)
    e = episodes
    if name == "reinforce":
        return reinforce_gradients(policy, e.states, e.actions, e.rewards, e.mask)
    values, q_values = evaluate_policy(mdp, policy)
    if name == "advantage_exact":
        return advantage_gradients(policy, e.states, e.actions, e.rewards, e.mask, values)
    if name == "advantage_learned":  # V learned on other episodes: still unbiased
        learned = fit_state_values(side_batch.states, side_batch.rewards, side_batch.mask, mdp.n_states)
        return advantage_gradients(policy, e.states, e.actions, e.rewards, e.mask, learned)
    if name == "q_critic_exact":
        return q_critic_gradients(policy, e.states, e.mask, q_values)
    if name == "action_dependent_baseline":  # G - Q(s, a): a baseline that depends on the action is biased
        weights = rewards_to_go(e.rewards, e.mask) - q_values[e.states, e.actions]
        return score_function_gradients(policy, e.states, e.actions, weights, e.mask)
    raise ValueError(name)


UNBIASED = ("reinforce", "advantage_exact", "advantage_learned", "q_critic_exact")


@pytest.mark.parametrize("mdp", [SLIPPERY_TREE, CONVEYOR], ids=["tree", "conveyor"])
def test_unbiased_estimators_average_to_the_exact_gradient_and_a_flipped_sign_is_caught(mdp):
    """Each per-entry mean within 4.5 standard errors of the exact gradient (fixed seed); the same estimates with
    their sign flipped, and a biased estimator (an action-dependent baseline), are far outside."""
    logits = _logits(mdp, 2)
    _, exact = exact_policy_gradient(mdp, logits)
    rng = np.random.default_rng(4)
    episodes, side_batch = sample_episodes(mdp, logits, 20_000, rng), sample_episodes(mdp, logits, 2_000, rng)
    for name in UNBIASED:
        estimates = _estimates(name, mdp, logits, episodes, side_batch)
        assert _max_z(estimates, exact) < 4.5, name
        assert _max_z(-estimates, exact) > 10, name
    assert _max_z(_estimates("action_dependent_baseline", mdp, logits, episodes, side_batch), exact) > 10


def test_a_baseline_and_a_critic_cut_the_variance_on_the_conveyor():
    """COCOA's ordering at fixed episodes: REINFORCE's variance above the advantage's, above the exact critic's."""
    logits = _logits(CONVEYOR, 3)
    _, exact = exact_policy_gradient(CONVEYOR, logits)
    episodes = sample_episodes(CONVEYOR, logits, 4_000, np.random.default_rng(5))
    scores = {
        name: variance_db(_estimates(name, CONVEYOR, logits, episodes, None), exact) for name in UNBIASED[:2] + UNBIASED[3:]
    }
    assert scores["reinforce"] > scores["advantage_exact"] + 3 > scores["q_critic_exact"] + 3


@pytest.mark.parametrize("mdp", [SLIPPERY_TREE, CONVEYOR], ids=["tree", "conveyor"])
def test_the_critic_estimators_expectation_for_a_learned_q(mdp):
    """With Q_hat = Q it is the exact gradient; with a Q fitted on few episodes it is what the estimates average to
    (within 4.5 standard errors), and not the exact gradient: a learned critic is biased."""
    logits = _logits(mdp, 6)
    _, exact = exact_policy_gradient(mdp, logits)
    policy = softmax_policy(logits)
    np.testing.assert_allclose(expected_critic_gradient(mdp, logits, evaluate_policy(mdp, policy)[1]), exact, atol=1e-15)
    rng = np.random.default_rng(7)
    few = sample_episodes(mdp, logits, 30, rng)
    learned = fit_action_values(few.states, few.actions, few.rewards, few.mask, mdp.n_states, mdp.n_actions)
    episodes = sample_episodes(mdp, logits, 20_000, rng)
    estimates = q_critic_gradients(policy, episodes.states, episodes.mask, learned)
    expected = expected_critic_gradient(mdp, logits, learned)
    assert _max_z(estimates, expected) < 4.5
    assert _max_z(estimates, exact) > 10


def _benchmark():
    return load_file("benchmarks/exact_gradient.py", "exact_gradient_benchmark")


def test_the_benchmark_at_a_tiny_budget(tmp_path):
    """Every (length, scope, estimator, n) row, scored per seed; unbiased estimators at -inf bias (the analytic E
    g_hat), the learned critic biased; more episodes per estimate, less variance; bad input is one line."""
    benchmark = _benchmark()
    out = tmp_path / "eg.json"
    argv = ["--lengths", "23,43", "--episodes", "1,4", "--estimates", "8", "--seeds", "2", "--critic-episodes", "16"]
    result = benchmark.run([*argv, "--out", str(out)])
    saved = json.loads(out.read_text())
    assert len(saved["rows"]) == 2 * 2 * len(benchmark.ESTIMATORS) * 2 and saved["settings"]["seeds"] == 2
    rows = {(r["length"], r["scope"], r["estimator"], r["episodes"]): r for r in result["rows"]}
    assert rows[(23, "all_states", "reinforce", 1)]["bias_db"]["estimate"] == -benchmark.LIMIT_DB
    assert -benchmark.LIMIT_DB < rows[(23, "all_states", "q_critic_learned", 1)]["bias_db"]["estimate"] < benchmark.LIMIT_DB
    for estimator in ("reinforce", "advantage", "q_critic"):
        variance = [rows[(43, "all_states", estimator, n)]["variance_db"]["estimate"] for n in (1, 4)]
        assert variance[1] < variance[0] - 3  # 4 episodes: about 6 dB less
    assert "| 23 | first_state | `q_critic` | 1 | -inf | -inf | inf |" in result["table"]
    with pytest.raises(VcbmGymError, match=r"--lengths: \[24\] are not COCOA's conveyor lengths"):
        benchmark.run(["--lengths", "24", "--out", str(out)])
