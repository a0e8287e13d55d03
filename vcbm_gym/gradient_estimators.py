"""Policy-gradient estimators of a tabular softmax policy, and COCOA's scores of an estimator.

Estimators (one gradient per episode, shape (N, S, A), over padded episode arrays: states as MDP rows, actions,
rewards, mask; vcbm_gym.exact_gradient.Episodes). Every one is sum_t sum_a d pi(a | s_t) / d logits C_t(a) for a
per-step "contribution" C_t, as COCOA writes them (`ccoa/contribution/reinforce.py`, `qnet.py`):
- `reinforce_gradients`: C_t(a) = 1[a = a_t] G_t / pi(a_t | s_t), i.e. G_t grad log pi(a_t | s_t), G_t the
  reward to go (COCOA's `return_contribution="action_value"` for reinforce; Williams 1992 with causality);
- `advantage_gradients`: the same with G_t - V(s_t) (COCOA's "advantage": a baseline, exact or learned);
- `q_critic_gradients`: C_t(a) = Q(s_t, a) for every action, the all-actions form of COCOA's `qnet`
  contribution (exact or learned Q; subtracting V changes nothing, sum_a d pi(a | s) = 0).
REINFORCE is unbiased; the advantage estimator too for any state value, exact or learned on other episodes than
the ones it weighs; the critic only with the exact Q (a learned Q's bias is `expected_critic_gradient` minus the
exact gradient, vcbm_gym/exact_gradient.py). `fit_state_values` / `fit_action_values` learn V and Q (Monte Carlo
means per state / per pair).

Scores (COCOA `callback.py`, `get_metrics`), for a stack of estimates g_hat of the exact g:
- `bias_db` = 20 log10(||g - E g_hat|| / ||g||);
- `variance_db` = 10 log10(mean (g_hat - E g_hat)^2 / mean g^2), means over estimates and entries;
- `snr_db` = 10 log10(||g||^2 / E ||g_hat - g||^2).
E g_hat is the stack's mean unless the caller knows it (COCOA uses the estimator's analytic expectation).
"""

from __future__ import annotations

import numpy as np


def rewards_to_go(rewards: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """G[n, t] = sum_{u >= t} r[n, u] over steps taken (undiscounted, as COCOA's conveyor); 0 on padding."""
    taken = np.where(mask, rewards, 0.0)
    return np.where(mask, np.cumsum(taken[:, ::-1], axis=1)[:, ::-1], 0.0)


def _scatter(rows: np.ndarray, states: np.ndarray, mask: np.ndarray, n_states: int) -> np.ndarray:
    """Sum per-step rows (N, T, A) into their states: out[n, s] = sum_t 1[s_t = s] rows[n, t] over taken steps."""
    n_episodes, _, n_actions = rows.shape
    out = np.zeros((n_episodes, n_states, n_actions))
    episode = np.broadcast_to(np.arange(n_episodes)[:, None], states.shape)
    np.add.at(out, (episode[mask], states[mask]), rows[mask])
    return out


def score_function_gradients(policy: np.ndarray, states, actions, weights, mask) -> np.ndarray:
    """Per episode sum_t w_t grad_logits log pi(a_t | s_t); the softmax's score is onehot(a_t) - pi(. | s_t)."""
    rows = np.eye(policy.shape[1])[actions] - policy[states]
    return _scatter(rows * weights[..., None], states, mask, policy.shape[0])


def reinforce_gradients(policy: np.ndarray, states, actions, rewards, mask) -> np.ndarray:
    """REINFORCE: sum_t G_t grad log pi(a_t | s_t) per episode (Williams 1992; COCOA's reinforce)."""
    return score_function_gradients(policy, states, actions, rewards_to_go(rewards, mask), mask)


def advantage_gradients(policy: np.ndarray, states, actions, rewards, mask, values: np.ndarray) -> np.ndarray:
    """sum_t (G_t - V(s_t)) grad log pi(a_t | s_t) per episode, V a state value per MDP row (COCOA's advantage)."""
    return score_function_gradients(policy, states, actions, rewards_to_go(rewards, mask) - values[states], mask)


def q_critic_gradients(policy: np.ndarray, states, mask, q_values: np.ndarray) -> np.ndarray:
    """sum_t sum_a grad pi(a | s_t) Q(s_t, a) per episode: pi (Q - pi . Q) at each visited state (COCOA's qnet,
    all-actions form). The actions and rewards taken do not enter: the critic stands in for them."""
    pi, q = policy[states], q_values[states]
    rows = pi * (q - (pi * q).sum(-1, keepdims=True))
    return _scatter(rows, states, mask, policy.shape[0])


def fit_state_values(states, rewards, mask, n_states: int) -> np.ndarray:
    """V(s) learned: the mean reward to go from s over the given episodes (0 for a state never seen)."""
    totals, counts = np.zeros(n_states), np.zeros(n_states)
    np.add.at(totals, states[mask], rewards_to_go(rewards, mask)[mask])
    np.add.at(counts, states[mask], 1.0)
    return np.divide(totals, counts, out=np.zeros(n_states), where=counts > 0)


def fit_action_values(states, actions, rewards, mask, n_states: int, n_actions: int) -> np.ndarray:
    """Q(s, a) learned: the mean reward to go after a in s over the given episodes (0 for a pair never seen)."""
    totals, counts = np.zeros((n_states, n_actions)), np.zeros((n_states, n_actions))
    np.add.at(totals, (states[mask], actions[mask]), rewards_to_go(rewards, mask)[mask])
    np.add.at(counts, (states[mask], actions[mask]), 1.0)
    return np.divide(totals, counts, out=np.zeros((n_states, n_actions)), where=counts > 0)


def _flat(estimates: np.ndarray, true_gradient: np.ndarray, expected: np.ndarray | None):
    """(estimates as (M, D), g as (D,), E g_hat as (D,)); E g_hat the stack's mean unless given."""
    stack = np.asarray(estimates, dtype=np.float64).reshape(len(estimates), -1)
    g = np.asarray(true_gradient, dtype=np.float64).reshape(-1)
    if stack.shape[1] != g.size:
        raise ValueError(f"estimates have {stack.shape[1]} entries each, the gradient {g.size}")
    if not np.any(g):
        raise ValueError("the exact gradient is zero: every dB score divides by its norm")
    mean = stack.mean(axis=0) if expected is None else np.asarray(expected, dtype=np.float64).reshape(-1)
    return stack, g, mean


def bias_db(estimates: np.ndarray, true_gradient: np.ndarray, expected: np.ndarray | None = None) -> float:
    """20 log10(||g - E g_hat|| / ||g||) (COCOA `policy_grad_bias_dB`); -inf for an exactly unbiased mean."""
    _, g, mean = _flat(estimates, true_gradient, expected)
    with np.errstate(divide="ignore"):
        return float(20 * np.log10(np.linalg.norm(g - mean) / np.linalg.norm(g)))


def variance_db(estimates: np.ndarray, true_gradient: np.ndarray, expected: np.ndarray | None = None) -> float:
    """10 log10(mean (g_hat - E g_hat)^2 / mean g^2) (COCOA `policy_grad_var_dB`), means over estimates and entries."""
    stack, g, mean = _flat(estimates, true_gradient, expected)
    with np.errstate(divide="ignore"):
        return float(10 * np.log10(np.mean((stack - mean) ** 2) / np.mean(g**2)))


def snr_db(estimates: np.ndarray, true_gradient: np.ndarray) -> float:
    """10 log10(||g||^2 / E ||g_hat - g||^2) (COCOA `policy_grad_snr_dB`): bias and variance together."""
    stack, g, _ = _flat(estimates, true_gradient, None)
    with np.errstate(divide="ignore"):
        return float(10 * np.log10(np.sum(g**2) / np.mean(np.sum((stack - g) ** 2, axis=1))))
