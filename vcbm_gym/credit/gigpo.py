"""GiGPO step-level credit (Feng et al. 2025, "Group-in-Group Policy Optimization"; EMPO's base).

Two nested groups over the K rollouts of one task (`batch.group_ids`):

- episode level:  A^E_k = (G_k - mean_group G) / (std_group G + eps)            (GRPO)
- step level:     all visits (k, t) of rollouts of the same task whose anchor observation is
                  identical form a step group; each visit's discounted return
                  R_{k,t} = sum_{t' >= t} gamma^(t' - t) r_{k,t'} is normalised inside its group:
                  A^S_{k,t} = (R_{k,t} - mean_stepgroup R) / (std_stepgroup R + eps)
- combined:       A_{k,t} = A^E_k + w * A^S_{k,t}

A step group of one visit has no comparison: A^S = 0 (as does an episode group of one). Repeated
visits of the same observation within one rollout are separate members, as in GiGPO. The std is
the unbiased sample std (ddof=1), like `grpo.py`; `normalise_std=False` gives GiGPO's mean-only
variant for both levels.

Steps and turns: GiGPO's "step" is one agent decision, i.e. a *turn* of the EpisodeBatch
(`step_turn`). For tabular agents every step is its own turn; for an LLM all tokens of a
response share the turn's step advantage, and a turn's reward is the sum of its steps' rewards.
Anchor observations: `batch.extras["anchor_keys"][b][j]` (a hashable key for turn j of episode
b, e.g. the observation text) if given, else `batch.observations[b, t]` at the turn's first
step (its bytes are the key).
"""

from __future__ import annotations

from collections.abc import Hashable

import numpy as np

import vcbm_gym.credit.options as options
from vcbm_gym.credit.base import CreditRule, EpisodeBatch
from vcbm_gym.credit.grpo import NORMALISE_STD, STD_EPS, group_relative_advantages


def discounted_returns(rewards: np.ndarray, gamma: float) -> np.ndarray:
    """R_t = sum_{t' >= t} gamma^(t' - t) r_t' for one episode's per-turn rewards."""
    out = np.zeros(len(rewards))
    running = 0.0
    for t in range(len(rewards) - 1, -1, -1):
        running = rewards[t] + gamma * running
        out[t] = running
    return out


def step_group_advantages(
    keys: list[list[Hashable]],
    turn_returns: list[np.ndarray],
    group_ids: np.ndarray,
    normalise_std: bool = NORMALISE_STD,
    eps: float = STD_EPS,
) -> list[np.ndarray]:
    """A^S per turn: returns normalised within groups of (task group, anchor key)."""
    members: dict[tuple, list[tuple[int, int]]] = {}
    for b, episode_keys in enumerate(keys):
        for j, key in enumerate(episode_keys):
            members.setdefault((group_ids[b], key), []).append((b, j))
    advantages = [np.zeros(len(r)) for r in turn_returns]
    for visits in members.values():
        if len(visits) < 2:
            continue
        values = np.array([turn_returns[b][j] for b, j in visits])
        centred = values - values.mean()
        scaled = centred / (values.std(ddof=1) + eps) if normalise_std else centred
        for (b, j), a in zip(visits, scaled):
            advantages[b][j] = a
    return advantages


class GiGPORule(CreditRule):
    """A_{k,t} = A^E_k + w * A^S_{k,turn(t)} on every trained step (module docstring)."""

    name = "gigpo"
    batch_needs = ("group_ids", "extras['anchor_keys'] | observations")

    def __init__(
        self, step_weight: float = 1.0, gamma: float = 0.95, normalise_std: bool = NORMALISE_STD, eps: float = STD_EPS
    ) -> None:
        self.step_weight = options.number("step_weight", step_weight)
        self.gamma = options.number("gamma", gamma, 0, 1)
        self.normalise_std = options.flag("normalise_std", normalise_std)
        self.eps = options.number("eps", eps, 0)

    def _turns(self, batch: EpisodeBatch, b: int) -> np.ndarray:
        return np.unique(batch.step_turn[b][batch.mask[b] & (batch.step_turn[b] >= 0)])

    def anchor_keys(self, batch: EpisodeBatch) -> list[list[Hashable]]:
        """Per episode, the anchor key of each of its turns (in turn order)."""
        given = batch.extras.get("anchor_keys")
        keys = []
        for b in range(batch.batch_size):
            turns = self._turns(batch, b)
            if given is not None:
                if len(given[b]) <= (turns.max() if len(turns) else -1):
                    raise ValueError(
                        f"anchor_keys[{b}] has {len(given[b])} keys: expected one per turn (turn ids up to {turns.max()})"
                    )
                keys.append([given[b][j] for j in turns])
            elif batch.observations is not None:
                first_step = [int(np.flatnonzero(batch.mask[b] & (batch.step_turn[b] == j))[0]) for j in turns]
                keys.append([np.ascontiguousarray(batch.observations[b, t]).tobytes() for t in first_step])
            else:
                raise ValueError("GiGPO needs anchor observations: batch.observations or batch.extras['anchor_keys']")
        return keys

    def advantages(self, batch: EpisodeBatch) -> np.ndarray:
        episode = group_relative_advantages(batch.returns, batch.group_ids, self.normalise_std, self.eps)
        keys = self.anchor_keys(batch)
        turn_returns = []
        for b in range(batch.batch_size):
            turn_rewards = [batch.rewards[b][batch.mask[b] & (batch.step_turn[b] == j)].sum() for j in self._turns(batch, b)]
            turn_returns.append(discounted_returns(np.array(turn_rewards), self.gamma))
        step = step_group_advantages(keys, turn_returns, batch.group_ids, self.normalise_std, self.eps)
        out = batch.broadcast(episode)
        for b in range(batch.batch_size):
            for position, j in enumerate(self._turns(batch, b)):
                steps = batch.mask[b] & (batch.step_turn[b] == j)
                out[b, steps] += self.step_weight * step[b][position]
        return out
