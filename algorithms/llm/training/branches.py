"""The continuations a branch-based credit rule asks for (vcbm_gym/credit/branch.py: VinePPO, RICE-PO), played by
the current policy from the env snapshots of the iteration's episodes and put into the batch's extras.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from trl import GRPOTrainer

from algorithms.llm.generation.rollout import NO_EFFECT, Episode, play_continuations, turn_entropies
from vcbm_gym.credit.base import CreditRule
from vcbm_gym.credit.branch import COMPUTE_KEYS, BranchRule


class BranchContinuations:
    """LoopTrainer's continuations for a branch-based credit rule (put before MultiTurnGRPOTrainer in the bases): after
    each rollout the continuations the rule asks for are played and kept as the extras of the iteration's batch
    (`_branch_extras`, which LoopTrainer._score_episodes puts into the EpisodeBatch)."""

    credit_rule: CreditRule
    _branch_extras: dict[str, list] | None

    def _rollout(self, prompts: list[str], trainer: GRPOTrainer) -> dict[str, list]:
        out = super()._rollout(prompts, trainer)
        if isinstance(self.credit_rule, BranchRule):
            start = time.perf_counter()
            self._branch_extras = self._play_branches(self._episodes)
            self._iter_stats["branch_time_s"] += time.perf_counter() - start
        return out

    def _play_branches(self, episodes: list[Episode]) -> dict[str, list]:
        """The continuations the branch rule asks for, played by the current policy from the env snapshots of this
        process's episodes, as the batch extras the rule reads (vcbm_gym/credit/branch.py); their compute is counted
        (summed over processes) into the iteration's metrics and the rule's totals."""
        rule: BranchRule = self.credit_rule
        model = self.accelerator.unwrap_model(self.model)
        counts = dict.fromkeys(COMPUTE_KEYS, 0)
        executable = [np.array([x not in NO_EFFECT for x in e.effects], bool) for e in episodes]
        entropies: list[Any] = [None] * len(episodes)
        if rule.needs_entropy:
            entropies = turn_entropies(model, episodes, self.args.temperature)
            counts["extra_model_calls"] += len(episodes)  # one forward pass per episode
        starts = []  # (episode index, turn)
        for b, e in enumerate(episodes):
            for turn, k in rule.branch_points(len(e.turn_rewards), entropies[b], executable[b]):
                starts += [(b, int(turn))] * int(k)
        seeds = self._branch_outcome_seeds(len(starts))
        continuations = play_continuations(
            self._rollout_generation(),
            self.processing_class,
            self._envs(len(starts)),
            [(episodes[b], turn, seed) for (b, turn), seed in zip(starts, seeds)],
            self.args.max_turns,
            self.args.truncation_chars,
            lockstep=(self.use_vllm and self.accelerator.num_processes > 1) or self._sharded,
            max_episode_tokens=self.episode_token_bound,
        )
        branches: list[dict[int, tuple[list[float], list[bool]]]] = [{} for _ in episodes]
        for (b, turn), c in zip(starts, continuations):
            outcomes, same = branches[b].setdefault(turn, ([], []))
            outcomes.append(float(c.episode_return))
            same.append(len(c.effects) > turn and _action_key(c, turn) == _action_key(episodes[b], turn))
            counts["extra_env_steps"] += len(c.turn_rewards)
            counts["extra_model_calls"] += len(c.turn_rewards)  # one generated answer per turn played
            counts["extra_generated_tokens"] += c.n_generated - sum(episodes[b].env_mask[: episodes[b].turn_starts[turn][0]])
        counts["continuation_episodes"] = len(continuations)
        counts = self._summed_over_processes(counts)
        rule.record_compute(**counts)
        for key, value in counts.items():
            self._iter_stats[key] += value
        extras: dict[str, list] = {
            "branches": [{t: (np.array(o), np.array(s, bool)) for t, (o, s) in row.items()} for row in branches],
            "turn_rewards": [np.array(e.turn_rewards, float) for e in episodes],
        }
        if rule.needs_entropy:
            extras.update(turn_entropies=entropies, executable=executable)
        return extras

    def _branch_outcome_seeds(self, n: int) -> list[int | None]:
        """Each continuation's own outcome draw (from the run seed, the optimizer step, the process; apart from the
        rollouts' own seeds); under `shared_outcomes` none: a continuation keeps its episode's draw."""
        if self.args.shared_outcomes:
            return [None] * n
        entropy = [int(self.args.seed), int(self.state.global_step), int(self.accelerator.process_index), 1]
        return [int(s) for s in np.random.SeedSequence(entropy).generate_state(n, dtype=np.uint32)]

    def _summed_over_processes(self, counts: dict[str, int]) -> dict[str, int]:
        parts = self._every_process(counts)
        return {k: sum(int(p[k]) for p in parts) for k in counts}


def _action_key(episode: Episode, turn: int) -> Any:
    """What RICE's residual compares at an anchor: the turn's executable effect, else its answer text."""
    effect = episode.effects[turn]
    return effect if effect is not None else episode.messages[2 + 2 * turn]["content"]
