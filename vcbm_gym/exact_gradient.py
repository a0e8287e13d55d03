"""Exact policy gradients of small episodic MDPs for a tabular softmax policy (COCOA's yardstick; issue 34 item 3).

Meulemans et al., NeurIPS 2023, "Would I have gotten that reward?" score every policy-gradient estimator
against the exact gradient of the expected return, computed by dynamic programming on the task's MDP (code
seijin-kobayashi/cocoa: `ccoa/contribution/dp_utils/dp_utils.py` builds the MDP, `callback.py`'s
`get_policy_gradient_mean` the gradient). This module is that ground truth, for a policy pi(a | s) =
softmax(logits[s])_a with one row of logits per MDP state:

- `TabularMDP`: states, actions, P(s' | s, a), the reward's law given (s, a, s'), the initial distribution,
  terminal states and a horizon within which every episode ends; undiscounted, as COCOA's conveyor.
- `evaluate_policy`: V and Q by `horizon` Bellman backups (exact: every episode ends within the horizon).
- `exact_policy_gradient`: J = mu . V and dJ / dlogits[s, a] = d(s) pi(a | s) (Q(s, a) - V(s)), d(s) the expected
  number of visits to s in an episode: the policy gradient theorem (Sutton et al. 2000, Thm. 1, episodic
  undiscounted) with the softmax's d pi(a | s) / d logits[s, b] = pi(a | s) (1[a = b] - pi(b | s)).
- `expected_critic_gradient`: the expectation of the critic estimator for a given (learned) Q, COCOA's analytic
  E g_hat.
- `sample_episodes`: episodes of the MDP itself, as padded arrays (the estimators' input,
  vcbm_gym/gradient_estimators.py).
- `key_to_door_mdp`, `credit_tree_mdp`: the exact MDPs of LinearKeyToDoor-v0 and CreditTree-v0, built from the
  envs' own one-step laws (docs/papers/cocoa.md says what each state holds and what is marginalised).
Pure array code (numpy); no I/O.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass, field

import numpy as np

from envs.credit_tree import CreditTreeEnv, children
from envs.key_to_door import (
    APPLE_VALUES,
    EMPTY,
    TREASURE,
    TREASURE_VALUE,
    LinearKeyToDoorEnv,
    cell_step,
    middle_cell_probs,
)

PROB_ATOL = 1e-9  # rows of probabilities may be off by rounding, no more


@dataclass(frozen=True)
class TabularMDP:
    """A finite episodic MDP: S states, A actions, K reward values.

    transitions[s, a, s'] = P(s' | s, a); reward_probs[s, a, s', k] = P(r = reward_values[k] | s, a, s');
    initial[s] = P(s_0 = s); terminal[s]: the episode has ended (absorbing, pays nothing, its actions are never
    taken); every episode ends within `horizon` steps. `states[i]` is the env observation (as a tuple of ints)
    of state i, so `index(obs)` maps an env's observation to its row.
    """

    transitions: np.ndarray
    reward_values: np.ndarray
    reward_probs: np.ndarray
    initial: np.ndarray
    terminal: np.ndarray
    horizon: int
    states: tuple[Hashable, ...]
    _index: dict = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        n_states, n_actions, _ = self.transitions.shape
        if self.transitions.shape != (n_states, n_actions, n_states):
            raise ValueError(f"transitions: expected shape (S, A, S), got {self.transitions.shape}")
        if self.reward_probs.shape != (n_states, n_actions, n_states, len(self.reward_values)):
            raise ValueError(f"reward_probs: expected shape (S, A, S, K), got {self.reward_probs.shape}")
        if not np.allclose(self.transitions.sum(-1), 1.0, atol=PROB_ATOL) or not np.allclose(
            self.initial.sum(), 1.0, atol=PROB_ATOL
        ):
            raise ValueError("transitions[s, a] and initial must each sum to 1")
        if not np.allclose(self.reward_probs.sum(-1), 1.0, atol=PROB_ATOL):
            raise ValueError("reward_probs[s, a, s'] must sum to 1 over the reward values")
        if len(self.states) != n_states or self.terminal.shape != (n_states,):
            raise ValueError("states and terminal need one entry per state")
        terminal = np.flatnonzero(self.terminal)
        if np.any(self.transitions[terminal, :, terminal] != 1.0) or np.any(self.expected_rewards()[terminal] != 0.0):
            raise ValueError("a terminal state must be absorbing and pay nothing")
        # Uniform play gives every action some mass, so any path that outlives the horizon would show here.
        uniform = np.full((n_states, n_actions), 1.0 / n_actions)
        alive = self.initial @ np.linalg.matrix_power(policy_transitions(self, uniform), self.horizon)
        if alive[~self.terminal].sum() > PROB_ATOL:
            raise ValueError(f"some episode outlives horizon={self.horizon}: the DP would truncate it")
        object.__setattr__(self, "_index", {state: i for i, state in enumerate(self.states)})

    @property
    def n_states(self) -> int:
        return self.transitions.shape[0]

    @property
    def n_actions(self) -> int:
        return self.transitions.shape[1]

    def index(self, observation) -> int:
        """The row of an env observation (an int or an integer vector)."""
        key = tuple(int(x) for x in np.atleast_1d(observation))
        if key not in self._index:
            raise KeyError(f"observation {key} is not a state of this MDP")
        return self._index[key]

    def expected_rewards(self) -> np.ndarray:
        """R[s, a] = E[r | s, a] = sum_s' P(s' | s, a) E[r | s, a, s']."""
        return np.einsum("xas,xask,k->xa", self.transitions, self.reward_probs, self.reward_values)


def softmax_policy(logits: np.ndarray) -> np.ndarray:
    """pi[s, a] = softmax(logits[s])_a, computed stably."""
    shifted = logits - logits.max(axis=-1, keepdims=True)
    weights = np.exp(shifted)
    return weights / weights.sum(axis=-1, keepdims=True)


def policy_transitions(mdp: TabularMDP, policy: np.ndarray) -> np.ndarray:
    """P_pi[s, s'] = sum_a pi(a | s) P(s' | s, a)."""
    return np.einsum("xa,xas->xs", policy, mdp.transitions)


def evaluate_policy(mdp: TabularMDP, policy: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """V[s] and Q[s, a] of `policy`: `horizon` backups V <- R_pi + P_pi V from V = 0 (the Bellman equation,
    undiscounted; exact, since every episode has ended after `horizon` steps and terminal states pay 0)."""
    rewards = mdp.expected_rewards()
    values = np.zeros(mdp.n_states)
    for _ in range(mdp.horizon):
        q_values = rewards + mdp.transitions @ values
        values = (policy * q_values).sum(-1)
    return values, rewards + mdp.transitions @ values


def expected_visits(mdp: TabularMDP, policy: np.ndarray) -> np.ndarray:
    """d[s] = sum_t P(s_t = s), t < horizon, over non-terminal s: the expected visits of an episode."""
    step = policy_transitions(mdp, policy)
    occupancy, visits = mdp.initial.astype(np.float64), np.zeros(mdp.n_states)
    for _ in range(mdp.horizon):
        visits += occupancy
        occupancy = occupancy @ step
    return np.where(mdp.terminal, 0.0, visits)


def expected_return(mdp: TabularMDP, logits: np.ndarray) -> float:
    """J(logits) = E[sum_t r_t] = mu . V."""
    values, _ = evaluate_policy(mdp, softmax_policy(logits))
    return float(mdp.initial @ values)


def exact_policy_gradient(mdp: TabularMDP, logits: np.ndarray) -> tuple[float, np.ndarray]:
    """(J, dJ / dlogits): dJ / dlogits[s, a] = d(s) pi(a | s) (Q(s, a) - V(s)) (policy gradient theorem, softmax).

    COCOA's `get_policy_gradient_mean` sums the same advantage-weighted terms over time and divides by the
    horizon; that constant cancels in every dB score (bias, variance, SNR are ratios to ||g||).
    """
    logits = np.asarray(logits, dtype=np.float64)
    if logits.shape != (mdp.n_states, mdp.n_actions):
        raise ValueError(f"logits: expected shape {(mdp.n_states, mdp.n_actions)}, got {logits.shape}")
    policy = softmax_policy(logits)
    values, q_values = evaluate_policy(mdp, policy)
    visits = expected_visits(mdp, policy)
    return float(mdp.initial @ values), visits[:, None] * policy * (q_values - values[:, None])


def expected_critic_gradient(mdp: TabularMDP, logits: np.ndarray, q_values: np.ndarray) -> np.ndarray:
    """E of the all-actions critic estimator sum_t sum_a grad pi(a | s_t) Q_hat(s_t, a) for a fixed critic Q_hat:
    d(s) pi(a | s) (Q_hat(s, a) - pi(. | s) . Q_hat(s, .)) (COCOA `expected_advantage` through
    `get_policy_gradient_mean`). The exact gradient when Q_hat = Q; the score-function estimators with any state
    baseline have expectation exact_policy_gradient itself."""
    policy = softmax_policy(np.asarray(logits, dtype=np.float64))
    visits = expected_visits(mdp, policy)
    return visits[:, None] * policy * (q_values - (policy * q_values).sum(-1, keepdims=True))


@dataclass(frozen=True)
class Episodes:
    """N episodes padded to T steps: states[n, t] (MDP rows), actions, rewards; mask[n, t] is a step taken."""

    states: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    mask: np.ndarray


def _draw(probs: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """One index per row of `probs` (inverse CDF; the last index takes any rounding remainder)."""
    below = (probs.cumsum(-1) < rng.random((len(probs), 1))).sum(-1)
    return np.minimum(below, probs.shape[-1] - 1)


def sample_episodes(mdp: TabularMDP, logits: np.ndarray, n_episodes: int, rng: np.random.Generator) -> Episodes:
    """`n_episodes` episodes of the softmax policy on `mdp`, `horizon` steps each, padded after the end."""
    policy = softmax_policy(np.asarray(logits, dtype=np.float64))
    shape = (n_episodes, mdp.horizon)
    states, actions = np.zeros(shape, dtype=np.int64), np.zeros(shape, dtype=np.int64)
    rewards, mask = np.zeros(shape), np.zeros(shape, dtype=bool)
    state = _draw(np.broadcast_to(mdp.initial, (n_episodes, mdp.n_states)), rng)
    for t in range(mdp.horizon):
        action = _draw(policy[state], rng)
        next_state = _draw(mdp.transitions[state, action], rng)
        reward = mdp.reward_values[_draw(mdp.reward_probs[state, action, next_state], rng)]
        live = ~mdp.terminal[state]
        states[:, t], actions[:, t], rewards[:, t], mask[:, t] = state, action, np.where(live, reward, 0.0), live
        state = next_state
    return Episodes(states, actions, rewards, mask)


class _Builder:
    """Collects the states an MDP reaches from its start, breadth first, and its (s, a) -> s' laws."""

    def __init__(self, n_actions: int) -> None:
        self.n_actions, self.index, self.queue = n_actions, {}, deque()
        self.edges: list[tuple[int, int, int, float, dict[float, float]]] = []  # s, a, s', P(s'|s,a), {r: P(r|s,a,s')}

    def state(self, key: tuple[int, ...]) -> int:
        if key not in self.index:
            self.index[key] = len(self.index)
            self.queue.append(key)
        return self.index[key]

    def build(self, initial_key: tuple[int, ...], terminal, successors, horizon: int) -> TabularMDP:
        """successors(key, action) -> [(next key, probability, {reward: probability})], each next key once."""
        self.state(initial_key)
        while self.queue:
            key = self.queue.popleft()
            for action in range(self.n_actions):
                outcomes = [(key, 1.0, {0.0: 1.0})] if terminal(key) else successors(key, action)
                for next_key, prob, rewards in outcomes:
                    self.edges.append((self.index[key], action, self.state(next_key), prob, rewards))
        values = np.array(sorted({r for *_, rewards in self.edges for r in rewards}))
        n = len(self.index)
        transitions, reward_probs = np.zeros((n, self.n_actions, n)), np.zeros((n, self.n_actions, n, len(values)))
        reward_probs[..., np.searchsorted(values, 0.0)] = 1.0  # (s, a, s') never reached: any law will do
        if len({edge[:3] for edge in self.edges}) < len(self.edges):
            raise ValueError("successors listed one next state twice for the same (state, action): merge them")
        for s, a, s_next, prob, rewards in self.edges:
            transitions[s, a, s_next] = prob
            reward_probs[s, a, s_next] = 0.0
            for reward, p in rewards.items():
                reward_probs[s, a, s_next, np.searchsorted(values, reward)] += p
        keys = tuple(self.index)
        initial = np.eye(n)[0]
        return TabularMDP(transitions, values, reward_probs, initial, np.array([terminal(k) for k in keys]), horizon, keys)


def key_to_door_mdp(env: LinearKeyToDoorEnv) -> TabularMDP:
    """LinearKeyToDoor-v0's exact MDP over its observation (position, cell, has_key).

    The cell law is the env's `cell_step`. Marginalised: an apple's value (0.1 or 0.9 x 23 / L, equal odds) is a
    reward law, not a state; with `random_layout` the cells ahead are drawn independently per cell (COCOA's
    `random_distractors`), so the next cell is a transition probability and the policy, which sees only the current
    cell, loses nothing by not seeing the rest. With the fixed layout the cell is a function of the position, except
    the last cell, which records whether the door was opened.
    """
    env = env.unwrapped
    length, scale = env.length, env.scale
    apple_law = {value * scale: 1.0 / len(APPLE_VALUES) for value in APPLE_VALUES}

    def next_cells(position: int, door: bool) -> list[tuple[int, float]]:
        if position == length - 1:
            return [(TREASURE if door else EMPTY, 1.0)]
        if position == length - 2 or not env.random_layout:
            return [(int(env.fixed_layout[position]), 1.0)]  # the door's cell is fixed in either layout
        return [(cell, float(p)) for cell, p in enumerate(middle_cell_probs(env.distractor_prob)) if p > 0]

    def successors(key: tuple[int, int, int], action: int):
        position, cell, has_key = key
        apple, took_key, door = cell_step(cell, bool(has_key), action)
        rewards = apple_law if apple else {TREASURE_VALUE * scale if cell == TREASURE else 0.0: 1.0}
        holds = int(bool(has_key) or took_key)
        if position + 1 == length:
            return [((length, EMPTY, holds), 1.0, rewards)]
        return [((position + 1, next_cell, holds), p, rewards) for next_cell, p in next_cells(position + 1, door)]

    start = (0, int(env.fixed_layout[0]), 0)
    return _Builder(env.action_space.n).build(start, lambda key: key[0] == length, successors, length)


def credit_tree_mdp(env: CreditTreeEnv) -> TabularMDP:
    """CreditTree-v0's exact MDP over its observation (the node): the aimed child with 1 - slip, the other with
    slip; the leaf's reward is paid on the step that reaches it (a law of (s, a, s'), so a slip changes it)."""
    env = env.unwrapped

    def successors(key: tuple[int], action: int):
        aimed, other = children(key[0])[action], children(key[0])[1 - action]
        reward = lambda node: float(env.leaf_rewards[node - env.first_leaf]) if node >= env.first_leaf else 0.0  # noqa: E731
        outcomes = [((aimed,), 1.0 - env.slip, {reward(aimed): 1.0}), ((other,), env.slip, {reward(other): 1.0})]
        return [outcome for outcome in outcomes if outcome[1] > 0]

    return _Builder(2).build((0,), lambda key: key[0] >= env.first_leaf, successors, env.depth)
