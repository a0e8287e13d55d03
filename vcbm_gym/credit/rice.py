"""RICE-PO as its abstract states it: anchors at uncertain executable actions, local counterfactual branches scored
by the outcome, credit passed back to earlier steps only under strong influence and a stable residual.

RICE-PO's abstract (quoted in docs/papers/rice.md) gives four parts and no equations. This module's reading
of them, every open choice listed with its reason in docs/papers/rice.md:

1. Anchors (`choose_anchors`): of an episode's turns that the env executed as an action (its `effect` is a
   parsed tool call, not "invalid"), the `top_m` with the highest policy entropy, the mean over the turn's
   generated tokens of the entropy of the sampling distribution (ties: the earlier turn).
2. Local counterfactual branches: at the start of each anchor turn a, the env is restored from its snapshot
   and the same text prefix replayed; the anchor turn is resampled M times by the current policy and each
   branch rolled out to the end. A branch's score is its outcome o_m: the sum of the env rewards from turn a
   to its end (the arm plays them; the rule reads their outcomes).
3. The anchor's credit (`anchor_statistics`): advantage A_a = G_a - mean_m o_m, G_a the episode's own outcome
   from turn a (its reward-to-go); influence I_a = the sample standard deviation of the M branch outcomes (how
   much resampling the anchor moves the outcome); residual variance V_a = the sample variance of the outcomes
   that kept the anchor's action: the episode's own G_a and the branches whose anchor turn had the same
   executable effect (unmeasured, +inf, when no branch repeated it).
4. Passing back (`rice_turn_credit`): the anchor's tokens get A_a. The turns before it (back to the previous
   anchor) get A_a too only when the gate is open, I_a > `influence_threshold` and V_a < `residual_threshold`;
   otherwise, and on every turn after the last anchor, 0.
"""

from __future__ import annotations

import math

import numpy as np

import vcbm_gym.credit.options as options
from vcbm_gym.credit.base import EpisodeBatch
from vcbm_gym.credit.branch import BranchRule, spread_over_turns

DEFAULT_TOP_M = 1
DEFAULT_BRANCHES = 4
DEFAULT_INFLUENCE_THRESHOLD = 0.05
DEFAULT_RESIDUAL_THRESHOLD = 0.1


def choose_anchors(entropies: np.ndarray, executable: np.ndarray, top_m: int) -> np.ndarray:
    """Part 1: the (sorted) turns among the executable ones with the `top_m` highest mean token entropies (ties:
    the earlier turn). Fewer when fewer turns are executable; none when none is."""
    entropies, executable = np.asarray(entropies, float), np.asarray(executable, bool)
    if entropies.shape != executable.shape or entropies.ndim != 1:
        raise ValueError(f"entropies {entropies.shape} and executable {executable.shape}: expected two equal (n_turns,) shapes")
    candidates = np.flatnonzero(executable)
    order = candidates[np.lexsort((candidates, -entropies[candidates]))]  # entropy descending, then turn ascending
    return np.sort(order[:top_m])


def anchor_statistics(own_outcome: float, branch_outcomes: np.ndarray, same_action: np.ndarray) -> tuple[float, float, float]:
    """Part 3: (advantage, influence, residual variance) of one anchor.

    advantage = own_outcome - mean(branch_outcomes); influence = the sample std (ddof 1) of branch_outcomes;
    residual = the sample variance (ddof 1) of own_outcome and the branch outcomes whose `same_action` is True
    (+inf when none is: the residual after the anchor was not measured)."""
    outcomes, same = np.asarray(branch_outcomes, float), np.asarray(same_action, bool)
    if outcomes.ndim != 1 or len(outcomes) < 2 or same.shape != outcomes.shape:
        raise ValueError(
            f"branch outcomes {outcomes.shape} and same_action {same.shape}: expected two equal (M,) shapes with M >= 2"
        )
    advantage = float(own_outcome - outcomes.mean())
    influence = float(outcomes.std(ddof=1))
    kept = np.append(outcomes[same], own_outcome)
    residual = float(kept.var(ddof=1)) if len(kept) >= 2 else math.inf
    return advantage, influence, residual


def gate_open(influence: float, residual: float, influence_threshold: float, residual_threshold: float) -> bool:
    """Part 4's condition: strong influence and a stable residual."""
    return influence > influence_threshold and residual < residual_threshold


def rice_turn_credit(n_turns: int, anchors: np.ndarray, advantages: np.ndarray, gates: np.ndarray) -> np.ndarray:
    """Part 4: (n_turns,) credit per turn. Anchor a gets advantages[i]; the turns after the previous anchor and
    before a get it too when gates[i]; every other turn 0."""
    credit = np.zeros(n_turns)
    previous = -1
    for a, advantage, open_ in zip(np.asarray(anchors, int), np.asarray(advantages, float), np.asarray(gates, bool)):
        if not previous < a < n_turns:
            raise ValueError(f"anchors {list(anchors)}: expected increasing turns in [0, {n_turns})")
        credit[a] = advantage
        if open_:
            credit[previous + 1 : a] = advantage
        previous = a
    return credit


class RICERule(BranchRule):
    """RICE-PO's anchored, gated credit (module docstring) from M branches at each of the top-m anchors."""

    name = "rice"
    needs_entropy = True

    def __init__(
        self,
        top_m: int = DEFAULT_TOP_M,
        branches: int = DEFAULT_BRANCHES,
        influence_threshold: float = DEFAULT_INFLUENCE_THRESHOLD,
        residual_threshold: float = DEFAULT_RESIDUAL_THRESHOLD,
    ) -> None:
        super().__init__()
        self.top_m = options.integer("top_m", top_m, 1)
        self.branches = options.integer("branches", branches, 2)
        self.influence_threshold = options.number("influence_threshold", influence_threshold, 0)
        self.residual_threshold = options.number("residual_threshold", residual_threshold, 0)
        self.gates_seen = 0  # anchors scored, and how many of them passed credit back
        self.gates_opened = 0

    def branch_points(self, n_turns: int, entropies: np.ndarray | None, executable: np.ndarray | None):
        if entropies is None or executable is None:
            raise ValueError("rice needs each turn's mean token entropy and executable flag to choose its anchors")
        return [(int(a), self.branches) for a in choose_anchors(entropies[:n_turns], executable[:n_turns], self.top_m)]

    def turn_credit(self, batch: EpisodeBatch, b: int) -> tuple[np.ndarray, np.ndarray]:
        """(per-turn credit, gates) of episode b: its anchors are the turns the arm branched at."""
        rewards = self.turn_rewards(batch, b)
        branches = self.episode_branches(batch, b)
        anchors = np.array(sorted(branches), int)
        stats = [anchor_statistics(rewards[a:].sum(), *branches[a]) for a in anchors]
        advantages = np.array([s[0] for s in stats])
        gates = np.array([gate_open(i, r, self.influence_threshold, self.residual_threshold) for _, i, r in stats], bool)
        n_turns = max(len(rewards), int(anchors.max()) + 1 if len(anchors) else 0)
        return rice_turn_credit(n_turns, anchors, advantages, gates), gates

    def advantages(self, batch: EpisodeBatch) -> np.ndarray:
        per_turn = []
        for b in range(batch.batch_size):
            credit, gates = self.turn_credit(batch, b)
            per_turn.append(credit)
        return spread_over_turns(batch, per_turn)

    def observe(self, batch: EpisodeBatch) -> None:
        for b in range(batch.batch_size):
            gates = self.turn_credit(batch, b)[1]
            self.gates_seen += len(gates)
            self.gates_opened += int(gates.sum())

    def summary(self):
        return {**super().summary(), "anchors_scored": self.gates_seen, "anchor_gates_opened": self.gates_opened}

    def state_dict(self):
        return {**super().state_dict(), "gates": [self.gates_seen, self.gates_opened]}

    def load_state_dict(self, state):
        gates = state.get("gates") if isinstance(state, dict) else None
        if not (isinstance(gates, list) and len(gates) == 2):
            raise ValueError(f"rule 'rice': state {state!r}: expected keys compute and gates ([scored, opened])")
        super().load_state_dict({"compute": state["compute"]})
        self.gates_seen, self.gates_opened = int(gates[0]), int(gates[1])
