"""Exact policy gradients of small episodic MDPs for a tabular softmax policy (COCOA's yardstick).

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
  vcbm_gym/gradient_estimators.py); `env_episodes`: the same arrays from episodes of a (vector) env itself, for an
  MDP that keeps only the expected reward of a continuous noise (WatchRepair), so that the estimators' variance
  includes the env's true noise.
- `key_to_door_mdp`, `credit_tree_mdp`, `watch_repair_mdp`: the exact MDPs of LinearKeyToDoor-v0, CreditTree-v0
  and WatchRepair-v0, built from the envs' own laws (docs/papers/cocoa.md says what each state holds and what is
  marginalised).

WatchRepair (`watch_repair_mdp`): the tabular policy sees (repaired flag, brand, t), `watch_repair_state` of the
observation [flag, counter1, counter2, brand, t]; the two counters are dropped. Only the action at t = 0 changes
anything (repair sets the flag; every later action is ignored by the env), and the repair cost (paid at t = 0),
the transport cost and the counters' penalties (paid at t = T - 1 if repaired) are drawn independently of
every action, from laws that depend only on the brand. Write the return as G = G_bar + eps, G_bar the same
episode with every noise replaced by its mean (cost mean, transport mean, counter_j = p_j T); then
E[eps | brand, a_0 .. a_{T-1}] = 0 (the flag multiplies the noise, but each noise has its mean subtracted whatever
the flag), and the counters are
independent of (flag, brand, t) and of the actions, so for the policy on (flag, brand, t)
Q(s_t, a_t) = E[G_t | s_t, a_t] is the Q of G_bar. The policy gradient theorem needs only Q and the state
visits, so J and dJ / dlogits are exact with the rewards replaced by their means: the MDP's reward law is a point
mass at E[r | s, a, s']. Its `sample_episodes` would therefore have no reward noise; the estimators are scored
on `env_episodes` of the env itself instead. The horizon T = 50 gives 8 T + 4 = 404 states (4 brands x
(1 start + 2 flags x (T - 1) + 2 ended)); a DP is 50 backups of a (404, 2, 404) array.
Pure array code (numpy); no I/O.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass, field
from functools import cached_property

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
from envs.watch_repair import REPAIR, WatchRepairEnv

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

    @cached_property
    def _row_table(self) -> np.ndarray:
        """table[key] = the key's row, -1 for no state: `rows`' lookup (the keys are tuples of ints >= 0)."""
        keys = np.array(self.states, dtype=np.int64).reshape(self.n_states, -1)
        table = np.full(tuple(keys.max(axis=0) + 1), -1, dtype=np.int64)
        table[tuple(keys.T)] = np.arange(self.n_states)
        return table

    def rows(self, keys) -> np.ndarray:
        """The rows of a batch of state keys, shape (N, k) ((N,) for one-int keys): `index` for many observations."""
        keys, table = np.asarray(keys, dtype=np.int64), self._row_table
        keys = keys[:, None] if keys.ndim == 1 else keys
        if keys.ndim != 2 or keys.shape[1] != table.ndim:
            raise ValueError(f"keys: expected shape (N, {table.ndim}), got {keys.shape}")
        inside = np.all((keys >= 0) & (keys < table.shape), axis=1)
        rows = np.full(len(keys), -1, dtype=np.int64)
        rows[inside] = table[tuple(keys[inside].T)]
        if np.any(rows < 0):
            raise KeyError(f"observation {tuple(keys[np.argmax(rows < 0)].tolist())} is not a state of this MDP")
        return rows

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


def env_episodes(env, mdp: TabularMDP, logits: np.ndarray, rng: np.random.Generator, state_of=None) -> Episodes:
    """One episode per sub-env of the Gymnasium vector env `env` under the softmax policy on `mdp`: the env's own
    law, its reward noise included; `state_of` maps a batch of observations to state keys (N, k) (default: the
    observation itself), `TabularMDP.rows` those to rows. Sub-env i is reset with its own seed drawn from `rng`,
    so the env's numpy vector version and a SyncVectorEnv of single envs give the same episodes."""
    policy = softmax_policy(np.asarray(logits, dtype=np.float64))
    state_of = state_of or (lambda observations: observations)
    shape = (env.num_envs, mdp.horizon)
    states, actions = np.zeros(shape, dtype=np.int64), np.zeros(shape, dtype=np.int64)
    rewards, mask = np.zeros(shape), np.zeros(shape, dtype=bool)
    observations, _ = env.reset(seed=rng.integers(2**31, size=env.num_envs).tolist())
    live = np.ones(env.num_envs, dtype=bool)
    for t in range(mdp.horizon):
        state = mdp.rows(state_of(observations))
        action = _draw(policy[state], rng)
        observations, reward, terminated, truncated, _ = env.step(action)
        if np.any(live & truncated):
            raise ValueError("an env episode was truncated: the MDP's law has no truncation")
        states[:, t], actions[:, t], mask[:, t] = np.where(live, state, 0), np.where(live, action, 0), live
        rewards[:, t] = np.where(live, reward, 0.0)  # a finished sub-env's next step is its autoreset
        live &= ~terminated
    if live.any():
        raise ValueError(f"{live.sum()} env episodes outlived horizon={mdp.horizon}: not this MDP's episodes")
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

    def build(self, initial: dict[tuple[int, ...], float], terminal, successors, horizon: int) -> TabularMDP:
        """initial: {start key: probability}; successors(key, action) -> [(next key, probability,
        {reward: probability})], each next key once."""
        for key in initial:
            self.state(key)
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
        start = np.array([initial.get(key, 0.0) for key in keys])
        return TabularMDP(transitions, values, reward_probs, start, np.array([terminal(k) for k in keys]), horizon, keys)


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
    return _Builder(env.action_space.n).build({start: 1.0}, lambda key: key[0] == length, successors, length)


def credit_tree_mdp(env: CreditTreeEnv) -> TabularMDP:
    """CreditTree-v0's exact MDP over its observation (the node): the aimed child with 1 - slip, the other with
    slip; the leaf's reward is paid on the step that reaches it (a law of (s, a, s'), so a slip changes it)."""
    env = env.unwrapped

    def successors(key: tuple[int], action: int):
        aimed, other = children(key[0])[action], children(key[0])[1 - action]
        reward = lambda node: float(env.leaf_rewards[node - env.first_leaf]) if node >= env.first_leaf else 0.0  # noqa: E731
        outcomes = [((aimed,), 1.0 - env.slip, {reward(aimed): 1.0}), ((other,), env.slip, {reward(other): 1.0})]
        return [outcome for outcome in outcomes if outcome[1] > 0]

    return _Builder(2).build({(0,): 1.0}, lambda key: key[0] >= env.first_leaf, successors, env.depth)


WATCH_REPAIR_STATE = (0, 3, 4)  # the observation's repaired flag, brand and t: the tabular policy's state


def watch_repair_state(observations: np.ndarray) -> np.ndarray:
    """(flag, brand, t) of WatchRepair observations [flag, counter1, counter2, brand, t] (..., 5): the state
    `watch_repair_mdp`'s rows are keyed by (the counters are action-independent noise)."""
    return np.asarray(observations)[..., WATCH_REPAIR_STATE]


def watch_repair_mdp(env: WatchRepairEnv) -> TabularMDP:
    """WatchRepair-v0's exact MDP over (flag, brand, t), with each reward's noise replaced by its mean.

    The brand is drawn at reset (brand_probs); at t = 0 repairing (action 0) costs E[cost] = repair_cost_mean[b]
    and sets the flag; nothing else any action does changes anything; at t = T - 1 a repaired watch pays
    price[b] - transport_mean[b] - sum_j counter_penalties[j] counter_probs[j] T (counter j rises with
    probability p_j at each of the T steps). Exact for J and the gradient: the noise is mean zero given the brand
    and all actions (module docstring)."""
    params = env.unwrapped.params
    horizon, penalty = params.horizon, float(np.dot(params.counter_probs, params.counter_penalties))
    payout = np.asarray(params.price, float) - np.asarray(params.transport_mean, float) - penalty * horizon

    def successors(key: tuple[int, int, int], action: int):
        flag, brand, t = key
        repairs = t == 0 and action == REPAIR
        repaired = int(bool(flag) or repairs)
        reward = (-float(params.repair_cost_mean[brand]) if repairs else 0.0) + (
            float(payout[brand]) if repaired and t == horizon - 1 else 0.0
        )
        return [((repaired, brand, t + 1), 1.0, {reward: 1.0})]

    starts = {(0, brand, 0): float(p) for brand, p in enumerate(params.brand_probs) if p > 0}
    return _Builder(2).build(starts, lambda key: key[2] == horizon, successors, horizon)
