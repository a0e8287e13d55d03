"""Measurements of the LLM arm: advantage mass on deciding turns, task goal completion, an iteration's
rollout metrics over all processes, and the log-prob memory estimate printed at start-up."""

from __future__ import annotations

import math
import numbers
from collections import defaultdict
from typing import Any

import numpy as np

from algorithms.llm.generation.rollout import NO_EFFECT, Episode
from vcbm_gym.credit.base import CreditRule, EpisodeBatch


def decision_advantage_sums(advantages: np.ndarray, mask: np.ndarray, decision: np.ndarray) -> list[float]:
    """[|advantage| mass on the tokens of deciding turns, all |advantage| mass]: summable over processes."""
    weight = np.abs(advantages) * mask
    return [float((weight * decision).sum()), float(weight.sum())]


def decision_advantage_mass(advantages: np.ndarray, mask: np.ndarray, decision: np.ndarray) -> float:
    """Share of the batch's |advantage| mass on the tokens of deciding turns (an evaluation metric)."""
    on_decision, total = decision_advantage_sums(advantages, mask, decision)
    return on_decision / total if total > 0 else 0.0


def task_goal_completion(last_infos: list[dict[str, Any]]) -> dict[str, float]:
    """Mean task goal completion of a batch of episodes, overall and per difficulty level.

    From each episode's last `info`: `task_goal_completion`, else AppWorld's `success`. Once any
    episode of the batch reports one, an episode that does not (cut short, never decided) counts
    as a failure (0), so completion is never measured on the finished episodes alone. Empty when
    the env reports neither.
    """
    if not any("task_goal_completion" in i or "success" in i for i in last_infos):
        return {}
    values = [float(i.get("task_goal_completion", i.get("success", 0.0))) for i in last_infos]
    out = {"task_goal_completion": float(np.mean(values))}
    by_level: dict[Any, list[float]] = defaultdict(list)
    for info, v in zip(last_infos, values):
        if info.get("difficulty") is not None:
            by_level[info["difficulty"]].append(v)
    out.update({f"task_goal_completion/difficulty_{k}": float(np.mean(v)) for k, v in by_level.items()})
    return out


def _size(n_bytes: float) -> str:
    if n_bytes >= 2**30:
        return f"{n_bytes / 2**30:.1f} GiB"
    return f"{n_bytes / 2**20:.1f} MiB" if n_bytes >= 2**20 else f"{n_bytes / 2**10:.1f} KiB"


def logprob_memory_line(bound: int | None, vocab: int, batch: int, rollout_episodes: int, use_vllm: bool) -> str:
    """The start-up estimate of the log-prob paths' peak memory (fp32), formulas stated.

    Full logits ([batch, sequence, vocab], what a log_softmax over the whole sequence takes) is the
    reference; this arm computes less: rollouts keep one step's [episodes, vocab] scores at a time
    (hf_generate; vLLM returns the sampled tokens' log-probs), and TRL's fused LM head scores the
    training sequence in tiles of at most 4,096 tokens x 32,768 vocabulary entries.
    """
    if bound is None:
        full = "full logits: sequence unbounded (max_episode_tokens unset, the model reports no context length), no estimate"
    else:
        full = (
            f"full logits would take sequence bound x vocab x batch x 4 B = {bound:,} x {vocab:,} x {batch} x 4 B = "
            f"{_size(bound * vocab * batch * 4)}"
        )
    rollout = (
        "rollout: vLLM's sampled-token log-probs"
        if use_vllm
        else f"rollout ~5 x episodes x vocab x 4 B = 5 x {rollout_episodes} x {vocab:,} x 4 B = "
        f"{_size(5 * rollout_episodes * vocab * 4)} per generated token"
    )
    tokens = 4096 if bound is None else min(batch * bound, 4096)
    tile = tokens * min(vocab, 32768) * 4
    return (
        f"log-prob memory estimate: {full}; this run: {rollout}, training (TRL fused LM head) "
        f"min(batch x bound, 4096) x min(vocab, 32768) x 4 B = {_size(tile)} per tile"
    )


def local_rollout_record(episodes: list[Episode], batch: EpisodeBatch, advantages: np.ndarray) -> dict[str, list]:
    """What one process measures of its episodes, to be summed with the other processes' (`rollout_metrics`).

    `advantages` as the loss sees them: (B, T) per token, or (B,) per sequence (TRL's own)."""
    # advantage mass on deciding turns (evaluation-only `is_decision_turn`)
    decision = np.zeros(batch.mask.shape, bool)
    for b, e in enumerate(episodes):
        for t, flag in enumerate(e.decision_turns):
            if flag:
                decision[b] |= batch.step_turn[b] == t
    if advantages.ndim == 1:
        advantages = advantages[:, None] * batch.mask
    return {
        "returns": [e.episode_return for e in episodes],
        "generated": [e.n_generated for e in episodes],
        "token_bound": [e.token_bound_reached for e in episodes],
        "turn_effects": [x for e in episodes for x in e.effects],
        "optimal_turns": [x for e in episodes for x in e.optimal_turns if x is not None],
        "last_infos": [e.last_info for e in episodes],
        "mass": decision_advantage_sums(advantages, batch.mask, decision),
        "tokens": [float((decision * batch.mask).sum()), float(batch.mask.sum())],
    }


def rollout_metrics(parts: list[dict[str, list]]) -> dict[str, float]:
    """The iteration's rollout metrics over every process's `local_rollout_record`. `optimal_action_rate` (where the
    env reports `action_optimal`, as Sokoban does) is the share of turns whose action starts a shortest solution, over
    the turns whose state has one (a deadlocked board's turns have no optimal move and are left out): it moves with the
    policy's reading of the state, where the success rate also counts a wandering policy that solves the task by
    chance within its turns."""
    keys = ("returns", "generated", "token_bound", "turn_effects", "optimal_turns", "last_infos")
    every = {k: [x for part in parts for x in part[k]] for k in keys}
    mass = np.sum([part["mass"] for part in parts], axis=0)
    tokens = np.sum([part["tokens"] for part in parts], axis=0)
    turns = every["turn_effects"]
    return {
        "mean_return": float(np.mean(every["returns"])),
        "mean_output_tokens": float(np.mean(every["generated"])),
        "token_bound_rate": float(np.mean(every["token_bound"])),
        "invalid_turn_rate": float(np.mean([x in NO_EFFECT for x in turns])) if turns else 0.0,
        "decision_advantage_mass": float(mass[0] / mass[1]) if mass[1] > 0 else 0.0,
        "decision_token_share": float(tokens[0] / max(tokens[1], 1)),
        **task_goal_completion(every["last_infos"]),
        **({"optimal_action_rate": float(np.mean(every["optimal_turns"]))} if every["optimal_turns"] else {}),
    }


def rule_numbers(rule: CreditRule | None) -> dict[str, int | float]:
    """The finite numbers of the rule's own `summary()` (vcbm_blend: its memory's size), under the rule's names.

    The trainer logs them with its metrics and the run's summary holds them, whatever the rule; a rule's other
    entries (text, NaN before it has trained) are left out, as a metric must be a number."""
    if rule is None:
        return {}
    summary = rule.summary()
    return {k: v for k, v in summary.items() if isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v)}
