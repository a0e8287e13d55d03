"""CreditTree-v0: a few-step binary tree with one delayed reward (docs/papers/cocoa.md).

A test bed for exact policy gradients, small enough to enumerate by hand (COCOA's own tree task,
`ccoa/envs/tree.py`, is the same idea with more branches). The agent starts at the root of a binary tree of
`depth` levels and takes `depth` binary actions; action a at node i moves to child 2i + 1 + a (heap order), or,
with probability `slip`, to the other child. The step that reaches a leaf pays that leaf's reward,
`leaf_rewards[leaf - (2^depth - 1)]`; every other step pays 0, so the first action's credit arrives `depth` steps
late. Observation: the node index, `Discrete(2^(depth + 1) - 1)`; the episode ends on a leaf.

The default, depth 2 with leaf rewards (0, 1, 0.5, 0) and no slip, has J = sum over leaves of P(leaf) x reward,
P(leaf) a product of two action probabilities: checkable by hand (tests/test_exact_gradient.py does).

`info` on the last step: `first_decision_optimal` (the root's action is a best one under optimal play after
it, by backward induction over the tree) and `is_success` (the leaf reached pays the largest reward); both
evaluation only (the env contract, vcbm_gym/contract.py).
"""

from __future__ import annotations

import math
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

DEFAULT_LEAF_REWARDS = (0.0, 1.0, 0.5, 0.0)


def children(node: int) -> tuple[int, int]:
    """The nodes actions 0 and 1 aim at (heap order)."""
    return 2 * node + 1, 2 * node + 2


def optimal_values(depth: int, leaf_rewards: np.ndarray, slip: float) -> np.ndarray:
    """V*(node) for every node, by backward induction (leaves: their reward; inner: the best action's mean)."""
    n_nodes = 2 ** (depth + 1) - 1
    values = np.zeros(n_nodes)
    values[2**depth - 1 :] = leaf_rewards
    for node in range(2**depth - 2, -1, -1):
        left, right = children(node)
        values[node] = max((1 - slip) * values[left] + slip * values[right], (1 - slip) * values[right] + slip * values[left])
    return values


class CreditTreeEnv(gym.Env):
    """The task of the module docstring; every constant is a constructor argument."""

    metadata = {"render_modes": ["ansi"], "render_fps": 4}

    def __init__(
        self,
        depth: int = 2,
        leaf_rewards: tuple[float, ...] | list[float] | np.ndarray = DEFAULT_LEAF_REWARDS,
        slip: float = 0.0,
        render_mode: str | None = None,
    ) -> None:
        if isinstance(depth, bool) or not isinstance(depth, (int, np.integer)) or not 1 <= depth <= 12:
            raise ValueError(f"depth={depth!r}: expected an integer in [1, 12]")
        rewards = np.asarray(leaf_rewards, dtype=np.float64)
        if rewards.shape != (2**depth,) or not np.all(np.isfinite(rewards)):
            raise ValueError(f"leaf_rewards: expected {2**depth} finite numbers (2^depth), got {leaf_rewards!r}")
        if isinstance(slip, bool) or not isinstance(slip, (int, float)) or not (math.isfinite(slip) and 0 <= slip <= 0.5):
            raise ValueError(f"slip={slip!r}: expected a number in [0, 0.5]")
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode={render_mode!r}: expected one of {self.metadata['render_modes']}")
        self.depth, self.leaf_rewards, self.slip, self.render_mode = int(depth), rewards, float(slip), render_mode
        self.n_nodes = 2 ** (self.depth + 1) - 1
        self.first_leaf = 2**self.depth - 1
        self.observation_space = spaces.Discrete(self.n_nodes)
        self.action_space = spaces.Discrete(2)
        self._best = optimal_values(self.depth, self.leaf_rewards, self.slip)
        self._node, self._first_action, self._started = 0, 0, False

    def _aimed_value(self, action: int) -> float:
        aimed, other = children(0)[action], children(0)[1 - action]
        return (1 - self.slip) * self._best[aimed] + self.slip * self._best[other]

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self._node, self._first_action, self._started = 0, 0, True
        return 0, {}

    def step(self, action):
        if not self._started or self._node >= self.first_leaf:
            raise RuntimeError("step() called before reset() or after the episode ended")
        if isinstance(action, (bool, np.bool_)) or not self.action_space.contains(action):
            raise ValueError(f"invalid action {action!r}: expected 0 or 1")
        action = int(action)
        if self._node == 0:
            self._first_action = action
        slipped = self.slip > 0 and self.np_random.random() < self.slip
        self._node = children(self._node)[1 - action if slipped else action]
        terminated = self._node >= self.first_leaf
        reward, info = 0.0, {}
        if terminated:
            reward = float(self.leaf_rewards[self._node - self.first_leaf])
            info: dict[str, Any] = {
                # A tie between the two first actions makes either one optimal.
                "first_decision_optimal": bool(
                    self._aimed_value(self._first_action) >= self._aimed_value(1 - self._first_action)
                ),
                "is_success": bool(reward == self.leaf_rewards.max()),
            }
        return self._node, reward, terminated, False, info

    def render(self):
        if self.render_mode == "ansi" and self._started:
            return f"node={self._node}, leaf={self._node >= self.first_leaf}"
        return None
