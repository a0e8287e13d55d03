"""The LLM arm's EpisodeBatch: one row per episode over its completion tokens, built from rollouts and
gathered over processes, and the per-turn context keys EMPO's cells compare."""

from __future__ import annotations

import hashlib

import numpy as np

from algorithms.llm.generation.rollout import Episode
from vcbm_gym.credit.base import EpisodeBatch


def episode_batch(episodes: list[Episode], width: int) -> EpisodeBatch:
    """Token-level EpisodeBatch of the completion part of each sequence, padded to `width`."""
    n = len(episodes)
    rewards, mask, turns = np.zeros((n, width)), np.zeros((n, width), bool), np.full((n, width), -1)
    for b, e in enumerate(episodes):
        m = np.asarray(e.env_mask, bool)
        mask[b, : len(m)] = m
        turns[b, : len(m)] = e.turn_ids
        generated = np.flatnonzero(m)
        if len(generated):
            rewards[b, generated[-1]] = e.episode_return
    return EpisodeBatch(
        rewards=rewards,
        mask=mask,
        group_ids=np.array([e.task_seed for e in episodes]),
        step_turn=turns,
        turn_flags={"state_mutating": [np.asarray(e.state_mutating, bool) for e in episodes]},
        turn_texts=[e.turn_texts for e in episodes],
        final_texts=[e.final_text for e in episodes],
        extras={"anchor_keys": [anchor_keys(e) for e in episodes]},
    )


def anchor_keys(episode: Episode) -> list[str]:
    """GiGPO's anchor of each turn: the observation the turn answers ("" where the episode has no record)."""
    n_turns = max(len(episode.turn_texts), max(episode.turn_ids, default=-1) + 1)
    messages = episode.messages
    return [messages[1 + 2 * t]["content"] if 1 + 2 * t < len(messages) else "" for t in range(n_turns)]


def concat_episode_batches(batches: list[EpisodeBatch]) -> EpisodeBatch:
    """One EpisodeBatch of the episodes of `batches`, in order, padded to the widest (the LLM arm's fields)."""
    if len(batches) == 1:
        return batches[0]
    width = max(b.rewards.shape[1] for b in batches)

    def pad(array: np.ndarray, value) -> np.ndarray:
        return np.pad(array, ((0, 0), (0, width - array.shape[1])), constant_values=value)

    def cat(values):
        return None if any(v is None for v in values) else [x for v in values for x in v]

    return EpisodeBatch(
        rewards=np.concatenate([pad(b.rewards, 0.0) for b in batches]),
        mask=np.concatenate([pad(b.mask, False) for b in batches]),
        group_ids=np.concatenate([b.group_ids for b in batches]),
        step_turn=np.concatenate([pad(b.step_turn, -1) for b in batches]),
        turn_flags={k: cat([b.turn_flags[k] for b in batches]) for k in batches[0].turn_flags},
        turn_texts=cat([b.turn_texts for b in batches]),
        final_texts=cat([b.final_texts for b in batches]),
        extras={k: cat([b.extras[k] for b in batches]) for k in batches[0].extras},
    )


def gather_episode_batch(accelerator, batch: EpisodeBatch) -> tuple[EpisodeBatch, int]:
    """All processes' episodes as one batch (rank order) and where this process's rows start.

    LOO, GRPO and GiGPO compare the K rollouts of a task, which TRL's sampler may place on
    different ranks, so every rank computes the rule over the gathered batch and keeps its rows.
    """
    if accelerator.num_processes == 1:
        return batch, 0
    from accelerate.utils import gather_object

    batches = gather_object([batch])
    start = sum(b.batch_size for b in batches[: accelerator.process_index])
    return concat_episode_batches(batches), start


def context_keys(episodes: list[Episode]) -> list[list[str]]:
    """EMPO context of every turn: the task, the turn index and the whole conversation before it."""
    keys = []
    for e in episodes:
        digest, row = hashlib.md5(str(e.task_seed).encode()), []
        for t in range(len(e.effects)):
            digest.update(e.messages[1 + 2 * t]["content"].encode())  # the observation answered at turn t
            row.append(f"{e.task_seed}:{t}:{digest.hexdigest()}")
            digest.update(e.messages[2 + 2 * t]["content"].encode())  # then that turn's answer
        keys.append(row)
    return keys
