"""Branch-based credit rules: rules whose credit needs continuations sampled from restored env snapshots.

VinePPO (vineppo.py) and RICE-PO (rice.py) do not read a batch alone: at some turn boundaries of each episode the
arm restores the env to its snapshot there (envs/snapshot.py), replays the same text prefix, samples
continuations with the current policy to the episode's end, and hands the rule their outcomes. The split:

- the rule says where to branch and how often (`branch_points`, a pure function of per-turn arrays: the number
  of turns, the mean token entropy of each turn, which turns were executable actions);
- the arm plays the continuations (algorithms/llm/training/branches.py) and puts what they gave into the batch's extras;
- the rule turns them into per-token credit (`advantages`), again a pure function of arrays.

What the arm puts in `EpisodeBatch.extras` (one entry per episode, turn order):

- `turn_rewards[b]`: (n_turns,) the env's reward at each turn of episode b;
- `branches[b]`: {turn: (outcomes, same_action)}: the outcome of each continuation branched at the start of
  that turn (the sum of the rewards it received from that turn to its end: a reward-to-go), and whether its
  action at that turn had the same executable effect as episode b's own (RICE's residual; a bool array);
- `turn_entropies[b]`, `executable[b]`: (n_turns,) each turn's mean token entropy under the sampling
  policy, and whether the env executed it as an action (RICE's anchors; the arm fills them when
  `needs_entropy`).

The rule also keeps the compute the arm spent on it (`record_compute`): extra env steps, model calls
(generated answers and forward passes), generated tokens and continuation episodes, summed over the run, so
that a run's summary and every iteration's metrics hold them (rule `summary()`).
"""

from __future__ import annotations

import abc
from typing import Any, ClassVar

import numpy as np

from vcbm_gym.credit.base import CreditRule, EpisodeBatch

COMPUTE_KEYS = ("extra_env_steps", "extra_model_calls", "extra_generated_tokens", "continuation_episodes")


def turn_ids_of(batch: EpisodeBatch, b: int) -> np.ndarray:
    """The turn ids of episode b's trained steps, in order, each once."""
    on = batch.mask[b] & (batch.step_turn[b] >= 0)
    return np.unique(batch.step_turn[b][on])


def spread_over_turns(batch: EpisodeBatch, per_turn: list[np.ndarray]) -> np.ndarray:
    """(B, T): per_turn[b][j] on every trained step of turn j of episode b, 0 elsewhere."""
    out = np.zeros(batch.rewards.shape)
    for b, values in enumerate(per_turn):
        values = np.asarray(values, float)
        for j in turn_ids_of(batch, b):
            if j < len(values):
                out[b, batch.mask[b] & (batch.step_turn[b] == j)] = values[j]
    return out


class BranchRule(CreditRule):
    """A credit rule fed by continuations branched from env snapshots (module docstring)."""

    batch_needs = ("extras['branches']",)
    needs_entropy: ClassVar[bool] = False  # the arm measures turn_entropies / executable for branch_points

    def __init__(self) -> None:
        self.compute = dict.fromkeys(COMPUTE_KEYS, 0)

    @abc.abstractmethod
    def branch_points(self, n_turns: int, entropies: np.ndarray | None, executable: np.ndarray | None) -> list[tuple[int, int]]:
        """[(turn, continuations)] for one episode of `n_turns` turns: branch that many times at the start of turn."""

    def record_compute(self, **counts: int) -> None:
        """Add what the arm spent on this rule's continuations (keys: COMPUTE_KEYS)."""
        unknown = sorted(set(counts) - set(COMPUTE_KEYS))
        if unknown:
            raise ValueError(f"record_compute({', '.join(unknown)}): expected keys among {', '.join(COMPUTE_KEYS)}")
        for key, value in counts.items():
            self.compute[key] += int(value)

    def summary(self) -> dict[str, Any]:
        return {f"total_{k}": v for k, v in self.compute.items()}

    def state_dict(self) -> dict[str, Any]:
        return {"compute": dict(self.compute)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        compute = state.get("compute") if isinstance(state, dict) else None
        if not isinstance(compute, dict) or set(compute) != set(COMPUTE_KEYS):
            raise ValueError(f"rule {self.name!r}: state {state!r}: expected {{'compute': {{{', '.join(COMPUTE_KEYS)}}}}}")
        self.compute = {k: int(v) for k, v in compute.items()}

    @staticmethod
    def episode_branches(batch: EpisodeBatch, b: int) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        branches = batch.extras["branches"][b]
        return {int(t): (np.asarray(o, float), np.asarray(s, bool)) for t, (o, s) in branches.items()}

    @staticmethod
    def turn_rewards(batch: EpisodeBatch, b: int) -> np.ndarray:
        """extras['turn_rewards'][b], else the episode's return on its last turn (the LLM arm's rewards)."""
        given = batch.extras.get("turn_rewards")
        if given is not None:
            return np.asarray(given[b], float)
        turns = turn_ids_of(batch, b)
        out = np.zeros(int(turns.max()) + 1 if len(turns) else 0)
        if len(turns):
            out[-1] = batch.returns[b]
        return out
