"""VinePPO's Monte Carlo values at turn boundaries (Kazemnejad et al., "VinePPO: Refining Credit Assignment in
RL Training of LLMs", ICML 2025; code McGill-NLP/VinePPO), per turn of a multi-turn episode.

The paper's Eq. for the value of a reasoning-step prefix (its Sec. 4) and PPO's one-step advantage:

    V(s_t) = (1 / K) sum_{k=1..K} R(tau_k),  tau_k ~ pi(. | s_t)     (K = 9: the paper's default)
    A_t    = r_t + gamma V(s_{t+1}) - V(s_t),  gamma = 1

Here a step is a turn: s_t is the state at the start of turn t (the env restored from its snapshot there,
and the same text prefix), R(tau_k) the reward-to-go of the k-th continuation (the sum of the env rewards
it received from turn t to its end), V at the terminal state 0, so at the last turn A = r_T - V(s_T), the
episode's reward there minus the value of the prefix before it. Every generated token of turn t gets A_t.
The choices the paper leaves open for this setting are in docs/papers/vineppo.md.
"""

from __future__ import annotations

import numpy as np

import vcbm_gym.credit.options as options
from vcbm_gym.credit.base import EpisodeBatch
from vcbm_gym.credit.branch import BranchRule, spread_over_turns, turn_ids_of

DEFAULT_CONTINUATIONS = 9  # K of the paper


def vineppo_advantages(values: np.ndarray, rewards: np.ndarray) -> np.ndarray:
    """A_t = r_t + V(s_{t+1}) - V(s_t) for t = 0..n-1, with V(s_n) = 0 (the terminal), gamma = 1.

    values: (n,) the Monte Carlo value at the start of each turn; rewards: (n,) the env reward of each turn.
    The advantages telescope: sum_t A_t = sum_t r_t - V(s_0).
    """
    values, rewards = np.asarray(values, float), np.asarray(rewards, float)
    if values.shape != rewards.shape or values.ndim != 1:
        raise ValueError(f"values {values.shape} and rewards {rewards.shape}: expected two equal (n_turns,) shapes")
    following = np.append(values[1:], 0.0)
    return rewards + following - values


def monte_carlo_values(branches: dict[int, tuple[np.ndarray, np.ndarray]], n_turns: int) -> np.ndarray:
    """(n_turns,) V(s_t): the mean outcome of the continuations branched at turn t; one line when a turn has none."""
    values = np.zeros(n_turns)
    for t in range(n_turns):
        outcomes = branches.get(t, (np.zeros(0), None))[0]
        if len(outcomes) == 0:
            raise ValueError(f"turn {t} has no continuations: expected K >= 1 continuations at every turn boundary")
        values[t] = float(np.mean(outcomes))
    return values


class VinePPORule(BranchRule):
    """Per-turn VinePPO advantages from K continuations at every turn boundary (module docstring)."""

    name = "vineppo"

    def __init__(self, continuations: int = DEFAULT_CONTINUATIONS) -> None:
        super().__init__()
        self.continuations = options.integer("continuations", continuations, 1)

    def branch_points(self, n_turns: int, entropies: np.ndarray | None = None, executable: np.ndarray | None = None):
        return [(t, self.continuations) for t in range(n_turns)]

    def advantages(self, batch: EpisodeBatch) -> np.ndarray:
        per_turn = []
        for b in range(batch.batch_size):
            rewards = self.turn_rewards(batch, b)
            n_turns = max(len(rewards), int(turn_ids_of(batch, b).max()) + 1 if batch.mask[b].any() else 0)
            rewards = np.pad(rewards, (0, n_turns - len(rewards)))
            values = monte_carlo_values(self.episode_branches(batch, b), n_turns)
            per_turn.append(vineppo_advantages(values, rewards))
        return spread_over_turns(batch, per_turn)
