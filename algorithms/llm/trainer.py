"""LOOP and VCBM-blended LOOP on TRL's GRPOTrainer ("Visual Causal-chain Bookmarking" (Selvakumar, 2026, arXiv:2610.24032),
Sec. II-C, IV-B).

Two trainers:

- `MultiTurnGRPOTrainer` plays whole episodes of a Gymnasium text env as TRL rollouts and logs
  per-iteration metrics; advantages and loss are TRL's own GRPO (`--algo trl-grpo`, the external
  baseline: one group-normalised advantage per sequence).
- `LoopTrainer` (`--algo loop`, `--algo vcbm-loop`) changes, in reading order:

1. `rollout_func` (`_rollout`) plays K whole episodes per task of a Gymnasium text env; each
   episode is one sequence, environment tokens masked (algorithms.llm.rollout).
2. `_generate_and_score_completions` replaces TRL's per-sequence group advantage by per-token
   advantages from the run's credit rule (`credit`, `credit_kwargs`: `make_rule` on the batch's
   EpisodeBatch; loop: LOO (Eq. 6) broadcast to every generated token, vcbm-loop: LOO blended
   with VCBM's retrieval weights, Eq. 12-14). With several processes the rule sees the episodes
   of all of them (`gather_episode_batch`): a task's K rollouts may sit on different ranks.
   A stateful rule (vcbm_blend's episodic memory) observes the batch at the end of its iteration,
   and only if the iteration is kept.
3. `_compute_loss` is the per-token PPO-clip of Eq. 7-8 (eps 0.1, no critic, no KL penalty),
   averaged over the generated tokens of the generation batch, optionally with EMPO's shared
   ratios (docs/papers/empo.md). It estimates the KL to the rollout policy; above `kl_abort` nats the whole
   iteration is discarded: its remaining micro-batches contribute nothing and, at its end, the
   trainable weights and optimizer state return to their values before the iteration.
4. `_get_grad_norm` counts outlier-gradient events; `_save_checkpoint` adds the credit rule's
   state (`state_dict`: vcbm_blend's episodic memory) and the loop's counters to TRL's checkpoints (adapter, optimizer, RNG).

KL estimate (`kl_old_new`): KL(pi_old || pi_theta) per rollout, the sum over its generated tokens
of the k3 estimator r - 1 - log r with r = pi_theta / pi_old = exp(-d), d = logp_old - logp_new.
The tokens were sampled from pi_old, under which this estimator is unbiased for KL(pi_old || pi_theta)
and never negative. Averaged over the micro-batch's rollouts; the iteration's estimate is the
largest over its micro-batches.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import os
import time
from collections import defaultdict, deque
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from transformers import TrainerCallback
from trl import GRPOTrainer

from algorithms.common import cli
from algorithms.common.errors import ConfigError, VcbmGymError
from algorithms.llm.config import LoopConfig, rule_kwargs
from algorithms.llm.rollout import CachedGeneration, Episode, full_attention_only, hf_generate, play_episodes
from algorithms.registry import load_object
from vcbm_gym.credit.base import EpisodeBatch, make_rule

CREDIT_STATE_FILE = "credit_state.npz"  # the rule's state_dict arrays; the rest is in LOOP_STATE_FILE
LOOP_STATE_FILE = "loop_state.json"
COMPLETE_MARKER = "loop_checkpoint_complete"  # written last: a checkpoint without it was cut short


def kl_old_new(logp_old: torch.Tensor, logp_new: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-rollout KL(pi_old || pi_theta) from tokens sampled under pi_old: sum_t (r_t - 1 - log r_t) * mask_t.

    r_t = exp(logp_new - logp_old) is the importance ratio; E_old[r] = 1 and E_old[-log r] is the KL,
    so the k3 estimator is unbiased for this direction (and each term is >= 0).
    """
    log_r = (logp_new - logp_old) * mask
    return ((torch.exp(log_r) - 1.0 - log_r) * mask).sum(-1)


def decision_advantage_sums(advantages: np.ndarray, mask: np.ndarray, decision: np.ndarray) -> list[float]:
    """[|advantage| mass on the tokens of deciding turns, all |advantage| mass]: summable over processes."""
    weight = np.abs(advantages) * mask
    return [float((weight * decision).sum()), float(weight.sum())]


def decision_advantage_mass(advantages: np.ndarray, mask: np.ndarray, decision: np.ndarray) -> float:
    """Share of the batch's |advantage| mass on the tokens of deciding turns (an evaluation metric)."""
    on_decision, total = decision_advantage_sums(advantages, mask, decision)
    return on_decision / total if total > 0 else 0.0


def episode_return_reward(prompts, completions, episode_return, **kwargs) -> list[float]:
    """TRL reward function: the return the rollout function recorded for each episode."""
    return [float(r) for r in episode_return]


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


def split_state(obj: Any, arrays: dict[str, np.ndarray], path: str = "") -> Any:
    """A rule's state_dict as JSON-able values, its numpy arrays moved into `arrays` (by path)."""
    if isinstance(obj, dict):
        return {str(k): split_state(v, arrays, f"{path}/{k}" if path else str(k)) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [split_state(v, arrays, f"{path}/{i}") for i, v in enumerate(obj)]
    if isinstance(obj, np.ndarray):
        arrays[path] = obj
        return {"__array__": path}
    return obj.item() if isinstance(obj, np.generic) else obj


def join_state(obj: Any, arrays: dict[str, np.ndarray]) -> Any:
    """The inverse of split_state."""
    if isinstance(obj, dict):
        if set(obj) == {"__array__"}:
            return arrays[obj["__array__"]]
        return {k: join_state(v, arrays) for k, v in obj.items()}
    if isinstance(obj, list):
        return [join_state(v, arrays) for v in obj]
    return obj


def vllm_answers(completion_ids, logprobs) -> list[tuple[list[int], list[float]]]:
    """(token ids, sampled-token log-probs) per completion from TRL's vLLM engine (`logprobs[j][i][0]`).

    A missing log-prob (no list, a None, a NaN, or fewer than the tokens) raises: a stand-in value
    such as 0.0 would make the importance ratio and the KL estimate of that token silently wrong.
    """
    if logprobs is None or len(logprobs) != len(completion_ids):
        raise VcbmGymError(
            f"vLLM returned log-probs for {0 if logprobs is None else len(logprobs)} of "
            f"{len(completion_ids)} completions; expected one per completion (logprobs enabled)"
        )
    out = []
    for j, (ids, seq) in enumerate(zip(completion_ids, logprobs)):
        values = []
        for i in range(len(ids)):
            lp = seq[i] if seq is not None and i < len(seq) else None
            value = lp[0] if isinstance(lp, (list, tuple)) and lp else None
            if value is None or not math.isfinite(float(value)):
                raise VcbmGymError(
                    f"vLLM returned no log-prob for token {i} of completion {j} ({lp!r}); expected the "
                    "sampled token's log-prob for every generated token"
                )
            values.append(float(value))
        out.append((list(ids), values))
    return out


def gather_counts(n: int) -> list[int]:
    """Every process's number of contexts this turn, in rank order (a collective: every process calls it)."""
    from accelerate.utils import gather_object

    return [int(c) for c in gather_object([n])]


def vllm_turn(gen, contexts: list[list[int]], counts=gather_counts, dummy: list[int] | None = None):
    """One turn of TRL's vLLM generation for this process's contexts, one answer per context.

    TRL 1.16's `VLLMGeneration.generate` gathers every rank's prompts (server mode: all processes;
    colocate with tensor parallelism: the TP group) and hands rank r back the completions at
    [r * len(prompts), (r + 1) * len(prompts)): right only when every rank passes as many prompts.
    In a multi-turn rollout the ranks' live episodes differ, so with `counts` (every process's
    count, a collective) each process pads its contexts to the largest count with `dummy` prompts
    and drops their answers; when no process has a context, nothing is generated. `counts=None`
    (one process, or colocate without tensor parallelism: no gather) passes the contexts as they are.
    """
    n = len(contexts)
    width = max(counts(n)) if counts is not None else n
    if width == 0:
        return []
    prompts = list(contexts) + [list(dummy or [0])] * (width - n)
    _, completion_ids, logprobs, _ = gen.generate(prompts=prompts, images=None, num_generations=1)
    return vllm_answers(completion_ids[:n], None if logprobs is None else logprobs[:n])


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


class _IterationEnd(TrainerCallback):
    def __init__(self, trainer: MultiTurnGRPOTrainer) -> None:
        self.trainer = trainer

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step % self.trainer.args.optimizer_steps_per_iteration == 0:
            self.trainer._end_iteration()


class MultiTurnGRPOTrainer(GRPOTrainer):
    """GRPOTrainer over whole episodes of a Gymnasium text env, with per-iteration metrics.

    Advantages and loss are TRL's own; this class only supplies rollouts (`rollout_func`) and
    records, per iteration: return, task goal completion (for the embedded text envs: the optimal
    decision rate), invalid-turn rate, the share of advantage mass on deciding turns, tokens.
    """

    def __init__(
        self,
        model,
        args,
        train_dataset,
        processing_class,
        env_id: str,
        env_kwargs: dict[str, Any] | None = None,
        peft_config=None,
        writer=None,
    ) -> None:
        self.env_id, self.env_kwargs = env_id, dict(env_kwargs or {})
        self.reencode_rollouts = False  # True: the earlier rollout path (hf_generate every turn), for comparisons
        self._env_pool: list[gym.Env] = []
        check_turn_limits(args.max_turns, self._envs(1)[0], env_id)
        self.writer = writer
        self._episodes: list[Episode] = []
        self._iter_stats: dict[str, Any] = defaultdict(float)
        self._iter_start = time.perf_counter()
        self.history: list[dict[str, float]] = []
        self._system_prompt = load_object(args.system_prompt)(args.one_shot) if args.system_prompt else None
        # the training sequence's bound: max_episode_tokens, else the model's context length (None: unbounded)
        context = getattr(getattr(model, "config", None), "max_position_embeddings", None)
        self.episode_token_bound = args.max_episode_tokens if args.max_episode_tokens is not None else context
        super().__init__(
            model=model,
            reward_funcs=[episode_return_reward],
            args=args,
            train_dataset=train_dataset,
            processing_class=processing_class,
            peft_config=peft_config,
            rollout_func=self._rollout,
        )
        self.add_callback(_IterationEnd(self))

    # --- rollouts ------------------------------------------------------------------------------
    def _envs(self, n: int) -> list[gym.Env]:
        while len(self._env_pool) < n:
            self._env_pool.append(gym.make(self.env_id, **self.env_kwargs))
        return self._env_pool[:n]

    def _generate_answers(self, contexts: list[list[int]]) -> list[tuple[list[int], list[float]]]:
        if self.use_vllm:
            return self._vllm_generate(contexts)
        model = self.accelerator.unwrap_model(self.model)
        return hf_generate(
            model, self.processing_class, contexts, self.args.max_new_tokens_per_turn, self.args.temperature, self._sharded
        )

    def _rollout_generation(self):
        """The generation of one rollout: vLLM, else transformers with each episode's keys and values kept across turns.

        `CachedGeneration` (algorithms.llm.rollout) feeds only a turn's new tokens; `hf_generate`
        re-encodes every context each turn, and stays for sharded models (synced generation), models
        with sliding-window or linear attention, and `reencode_rollouts` (the earlier path, which
        benchmarks/llm_throughput.py measures side by side).
        """
        model = self.accelerator.unwrap_model(self.model)
        if self.use_vllm or self._sharded or self.reencode_rollouts or not full_attention_only(model):
            return self._generate_answers
        return CachedGeneration(model, self.processing_class, self.args.max_new_tokens_per_turn, self.args.temperature)

    @property
    def _sharded(self) -> bool:
        """FSDP shards the weights: each forward pass is a collective that every process must join.

        transformers turns on `synced_gpus` by itself only for modules it recognises as FSDP-managed,
        which accelerate's FSDP2 does not mark, so the rollout asks for it (and for lockstep turns).
        """
        from accelerate.utils import DistributedType

        return self.accelerator.num_processes > 1 and self.accelerator.distributed_type == DistributedType.FSDP

    def _vllm_generate(self, contexts: list[list[int]]) -> list[tuple[list[int], list[float]]]:
        """One turn through TRL's vLLM engine (server or colocate); unverified here (no GPU, no vllm)."""
        gen = self.vllm_generation  # GRPOTrainer._generate synced its weights before calling _rollout
        gen.max_completion_length = self.args.max_new_tokens_per_turn  # per turn, not per episode
        if self.accelerator.num_processes > 1 and (gen.mode == "server" or gen.tensor_parallel_size > 1):
            return vllm_turn(gen, contexts, gather_counts, [self.processing_class.eos_token_id or 0])  # TRL gathers: pad
        return vllm_turn(gen, contexts, None)

    def _rollout(self, prompts: list[str], trainer: GRPOTrainer) -> dict[str, list]:
        """TRL rollout_func: the dataset's prompt column carries each task's env seed."""
        seeds = [int(p) for p in prompts]
        start = time.perf_counter()
        episodes = play_episodes(
            self._rollout_generation(),
            self.processing_class,
            self._envs(len(seeds)),
            seeds,
            self.args.max_turns,
            self.args.truncation_chars,
            self.args.one_shot,
            self._system_prompt,
            lockstep=(self.use_vllm and self.accelerator.num_processes > 1) or self._sharded,
            max_episode_tokens=self.episode_token_bound,
        )
        self._iter_stats["rollout_time_s"] += time.perf_counter() - start
        self._episodes = episodes
        return {
            "prompt_ids": [e.prompt_ids for e in episodes],
            "completion_ids": [e.completion_ids for e in episodes],
            "logprobs": [e.logprobs for e in episodes],
            "env_mask": [e.env_mask for e in episodes],
            "episode_return": [e.episode_return for e in episodes],
        }

    def _generate_and_score_completions(self, inputs):
        self._begin_iteration()
        output = super()._generate_and_score_completions(inputs)
        batch = episode_batch(self._episodes, output["completion_ids"].shape[1])
        self._record_rollouts(self._episodes, batch, output["advantages"])
        return output

    # --- iteration bookkeeping ---------------------------------------------------------------
    def _begin_iteration(self) -> None:
        if not self.model.training:
            return
        self._iter_stats = defaultdict(float)
        self._iter_start = time.perf_counter()

    def _record_rollouts(self, episodes: list[Episode], batch: EpisodeBatch, advantages: torch.Tensor) -> None:
        """The iteration's rollout metrics over every process's episodes (each process holds only its share)."""
        # advantage mass on deciding turns (evaluation-only `is_decision_turn`), as the loss sees it
        decision = np.zeros(batch.mask.shape, bool)
        for b, e in enumerate(episodes):
            for t, flag in enumerate(e.decision_turns):
                if flag:
                    decision[b] |= batch.step_turn[b] == t
        advantages = advantages.detach().float().cpu().numpy()
        if advantages.ndim == 1:
            advantages = advantages[:, None] * batch.mask
        local = {
            "returns": [e.episode_return for e in episodes],
            "generated": [e.n_generated for e in episodes],
            "token_bound": [e.token_bound_reached for e in episodes],
            "turn_effects": [x for e in episodes for x in e.effects],
            "last_infos": [e.last_info for e in episodes],
            "mass": decision_advantage_sums(advantages, batch.mask, decision),
            "tokens": [float((decision * batch.mask).sum()), float(batch.mask.sum())],
        }
        if self.accelerator.num_processes == 1:
            parts = [local]
        else:
            from accelerate.utils import gather_object

            parts = gather_object([local])
        every = {
            k: [x for part in parts for x in part[k]]
            for k in ("returns", "generated", "token_bound", "turn_effects", "last_infos")
        }
        mass = np.sum([part["mass"] for part in parts], axis=0)
        tokens = np.sum([part["tokens"] for part in parts], axis=0)
        s = self._iter_stats
        s["mean_return"] = float(np.mean(every["returns"]))
        s["mean_output_tokens"] = float(np.mean(every["generated"]))
        s["token_bound_rate"] = float(np.mean(every["token_bound"]))
        turns = every["turn_effects"]
        s["invalid_turn_rate"] = float(np.mean([x == "invalid" for x in turns])) if turns else 0.0
        s["decision_advantage_mass"] = float(mass[0] / mass[1]) if mass[1] > 0 else 0.0
        s["decision_token_share"] = float(tokens[0] / max(tokens[1], 1))
        s.update(task_goal_completion(every["last_infos"]))

    def _iteration_metrics(self) -> dict[str, float]:
        s = self._iter_stats
        metrics = {
            "mean_return": s["mean_return"],
            "mean_output_tokens": s["mean_output_tokens"],
            "return_per_1k_tokens": s["mean_return"] / (s["mean_output_tokens"] / 1000.0) if s["mean_output_tokens"] else 0.0,
            "invalid_turn_rate": s["invalid_turn_rate"],
            "decision_advantage_mass": s["decision_advantage_mass"],
            "decision_token_share": s["decision_token_share"],
            "token_bound_rate": s["token_bound_rate"],
            "iteration_time_s": time.perf_counter() - self._iter_start,
            "rollout_time_s": s["rollout_time_s"],
        }
        for key in ("task_goal_completion", "empo_cell_coverage", "max_sampling_logprob_diff"):
            if key in s:
                metrics[key] = s[key]
        metrics.update({k: v for k, v in s.items() if k.startswith("task_goal_completion/")})
        return metrics

    def _end_iteration(self) -> None:
        iteration = self.state.global_step // self.args.optimizer_steps_per_iteration
        metrics = self._iteration_metrics()
        self.history.append({"iteration": iteration, **metrics})
        if self.writer is not None and self.accelerator.is_main_process:
            for key, value in metrics.items():
                self.writer.add_scalar(f"loop/{key}", value, iteration)
            self.writer.flush()


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


def latest_complete_checkpoint(folder: str | Path) -> str | None:
    """The newest checkpoint-N under `folder` that carries the completion marker (None if none does)."""
    found = []
    for path in Path(folder).glob("checkpoint-*"):
        step = path.name.removeprefix("checkpoint-")
        if step.isdigit() and (path / COMPLETE_MARKER).is_file():
            found.append((int(step), str(path)))
    return max(found)[1] if found else None


def check_turn_limits(trainer_max_turns: int, env: gym.Env, env_id: str) -> None:
    """Refuse a trainer turn limit below the env's: every episode would be cut before its reward."""
    core = env.unwrapped
    env_turns = getattr(core, "max_turns", getattr(core, "max_interactions", None))
    if env_turns is not None and trainer_max_turns < int(env_turns):
        raise ConfigError(
            f"max_turns={trainer_max_turns} is below {env_id}'s own turn limit ({int(env_turns)}): every episode would "
            f"end before its reward; expected max_turns >= {int(env_turns)} (set env_kwargs to change the env's)"
        )


class LoopTrainer(MultiTurnGRPOTrainer):
    """MultiTurnGRPOTrainer with a credit rule's per-token advantages and LOOP's PPO-clip loss."""

    def __init__(self, model, args: LoopConfig, *trainer_args, **trainer_kwargs) -> None:
        """As MultiTurnGRPOTrainer; `args` carries the LOOP settings and the credit rule (`credit`, `credit_kwargs`)."""
        self.credit_rule = make_rule(args.credit, **rule_kwargs(args.credit, args.credit_kwargs))
        self._pending_observe: EpisodeBatch | None = None
        self._grad_norms: deque[float] = deque(maxlen=args.outlier_grad_window)
        self.outlier_grad_events = 0
        self.aborted_iterations = 0
        self._aborted = False
        self._snapshot: dict[str, Any] | None = None
        self._empo_rng = np.random.default_rng(args.seed)
        super().__init__(model, args, *trainer_args, **trainer_kwargs)

    # --- per-token advantages ----------------------------------------------------------------
    def _generate_and_score_completions(self, inputs):
        self._begin_iteration()
        output = GRPOTrainer._generate_and_score_completions(self, inputs)
        episodes = self._episodes
        start = time.perf_counter()
        batch = episode_batch(episodes, output["completion_ids"].shape[1])
        advantages = self.token_advantages(batch)
        self._iter_stats["credit_time_s"] += time.perf_counter() - start
        device = output["completion_ids"].device
        output["advantages"] = torch.as_tensor(advantages, dtype=torch.float32, device=device)
        output["turn_ids"] = torch.as_tensor(batch.step_turn, device=device)
        if self.args.ratio_sharing != "none":
            output["cell_ids"] = torch.as_tensor(self._cells(episodes), device=device)
        self._record_rollouts(episodes, batch, output["advantages"])
        sampled, old = output.get("sampling_per_token_logps"), output.get("old_per_token_logps")
        if sampled is not None and old is not None:  # rollout engine vs trainer, on the generated tokens
            on = (output["completion_mask"] * output.get("tool_mask", 1)).bool() & ~torch.isnan(sampled)
            if on.any():
                self._iter_stats["max_sampling_logprob_diff"] = (old - sampled)[on].abs().max().item()
        return output

    def token_advantages(self, batch: EpisodeBatch) -> np.ndarray:
        """(B, T) advantages of this process's episodes: the credit rule over all processes' episodes.

        The rule observes the (gathered) batch at the end of the iteration, and only if the
        iteration is kept (an aborted iteration's rollouts are dropped): in the LLM arm a batch's
        advantages come from the rule's state before that batch.
        """
        full, start = gather_episode_batch(self.accelerator, batch)
        self._pending_observe = full
        advantages = self.credit_rule.advantages(full)
        return advantages[start : start + batch.batch_size, : batch.rewards.shape[1]]

    def _cells(self, episodes: list[Episode]) -> np.ndarray:
        """EMPO cells (docs/papers/empo.md) over the generation batch; an "invalid" action has no effect (no cell)."""
        from vcbm_gym.credit.empo import cell_coverage, effect_cell_ids

        effects = [[None if x in (None, "invalid") else x for x in e.effects] for e in episodes]
        cells = effect_cell_ids(context_keys(episodes), effects, mode=self.args.ratio_sharing, rng=self._empo_rng)
        valid = np.zeros(cells.shape, bool)
        for b, e in enumerate(episodes):
            valid[b, : len(e.effects)] = True
        self._iter_stats["empo_cell_coverage"] = cell_coverage(cells, valid)
        return cells

    # --- the loss ----------------------------------------------------------------------------
    def _compute_loss(self, model, inputs):
        prompt_ids, prompt_mask = inputs["prompt_ids"], inputs["prompt_mask"]
        completion_ids, completion_mask = inputs["completion_ids"], inputs["completion_mask"]
        input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
        attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)
        mask = completion_mask if "tool_mask" not in inputs else completion_mask * inputs["tool_mask"]
        mask = mask.float()
        logps, _, _ = self._get_per_token_logps_and_entropies(model, input_ids, attention_mask, completion_ids.size(1))
        old = inputs.get("old_per_token_logps")
        old = logps.detach() if old is None else old
        advantages = inputs["advantages"]

        ratio = self._ratios(logps, old, mask, inputs)  # Eq. 7 (or EMPO's shared ratios)
        eps = self.args.epsilon
        per_token = -torch.min(ratio * advantages, torch.clamp(ratio, 1 - eps, 1 + eps) * advantages)  # Eq. 8
        if self.use_vllm and self.vllm_importance_sampling_correction:
            per_token = per_token * inputs["importance_sampling_ratio"]
        normalizer = inputs["num_items_in_batch"].clamp(min=1.0) / self.accelerator.num_processes
        normalizer = normalizer * self.current_gradient_accumulation_steps / self.args.steps_per_generation
        loss = (per_token * mask).sum() / normalizer

        with torch.no_grad():
            kl = kl_old_new(old, logps.detach(), mask).mean()
            kl = self.accelerator.gather(kl.reshape(1)).max().item()
            diff = (old - logps.detach()) * mask
            on = mask.bool()
            if on.any():
                self._iter_stats["max_importance_weight"] = max(
                    self._iter_stats["max_importance_weight"], torch.exp(-diff[on]).max().item()
                )
                self._iter_stats["max_logprob_diff"] = max(self._iter_stats["max_logprob_diff"], diff[on].abs().max().item())
            self._iter_stats["kl_estimate"] = max(self._iter_stats["kl_estimate"], kl)
        if kl > self.args.kl_abort and not self._aborted:
            self._aborted = True
        if self._aborted:
            return loss * 0.0  # the iteration is discarded; _end_iteration restores the weights
        return loss

    def _ratios(self, logps, old, mask, inputs) -> torch.Tensor:
        if self.args.ratio_sharing == "none":
            return torch.exp(logps - old)
        from vcbm_gym.credit.empo import shared_ratios

        return shared_ratios(logps, old, mask, inputs["turn_ids"], inputs["cell_ids"], length_norm=self.args.length_norm)

    # --- iteration bookkeeping, outliers, checkpoints ----------------------------------------
    def _trainable(self) -> dict[str, torch.nn.Parameter]:
        return {n: p for n, p in self.model.named_parameters() if p.requires_grad}

    def _begin_iteration(self) -> None:
        if not self.model.training:
            return
        super()._begin_iteration()
        self._aborted = False
        self._pending_observe = None
        self._snapshot = {
            "params": {n: p.detach().clone() for n, p in self._trainable().items()},
            "optimizer": copy.deepcopy(self.optimizer.state_dict()) if self.optimizer is not None else None,
        }

    def _get_grad_norm(self, model, grad_norm=None):
        norm = super()._get_grad_norm(model, grad_norm)
        value = float(norm.item() if hasattr(norm, "item") else norm)
        if len(self._grad_norms) >= 5 and value > self.args.outlier_grad_factor * float(np.median(self._grad_norms)):
            self.outlier_grad_events += 1
        if math.isfinite(value) and not self._aborted:
            self._grad_norms.append(value)
        return norm

    def _iteration_metrics(self) -> dict[str, float]:
        s = self._iter_stats
        metrics = {
            **super()._iteration_metrics(),
            "kl_estimate": s["kl_estimate"],
            "max_importance_weight": s["max_importance_weight"],
            "max_logprob_diff": s["max_logprob_diff"],
            "outlier_gradient_events": float(self.outlier_grad_events),
            "iteration_aborted": float(self._aborted),
            "aborted_iterations": float(self.aborted_iterations),
            "credit_time_s": s["credit_time_s"],
            "memory_size": float(self.credit_rule.summary().get("memory_size", 0)),
        }
        return self._max_over_processes(metrics, ("max_importance_weight", "max_logprob_diff", "max_sampling_logprob_diff"))

    def _max_over_processes(self, metrics: dict[str, float], keys: tuple[str, ...]) -> dict[str, float]:
        """Each process measures these maxima on its own tokens; the run's value is the largest of them."""
        if self.accelerator.num_processes == 1:
            return metrics
        local = torch.tensor([metrics.get(k, float("nan")) for k in keys], dtype=torch.float64, device=self.accelerator.device)
        every = self.accelerator.gather(local.reshape(1, -1)).cpu().numpy()
        for k, column in zip(keys, every.T):
            if not np.isnan(column).all():
                metrics[k] = float(np.nanmax(column))
        return metrics

    def _end_iteration(self) -> None:
        if self._aborted and self._snapshot is not None:
            with torch.no_grad():
                for n, p in self._trainable().items():
                    p.copy_(self._snapshot["params"][n])
            if self._snapshot["optimizer"] is not None:
                self.optimizer.load_state_dict(self._snapshot["optimizer"])
            self.aborted_iterations += 1
        elif self._pending_observe is not None:
            self.credit_rule.observe(self._pending_observe)
        self._pending_observe = None
        super()._end_iteration()

    def loop_state_dict(self) -> dict[str, Any]:
        return {
            "outlier_grad_events": self.outlier_grad_events,
            "aborted_iterations": self.aborted_iterations,
            "grad_norms": list(self._grad_norms),
            "empo_rng": self._empo_rng.bit_generator.state,
            "history": self.history,
        }

    def _save_checkpoint(self, model, trial):
        super()._save_checkpoint(model, trial)
        if self.args.should_save:
            folder = Path(self._get_output_dir(trial=trial)) / f"checkpoint-{self.state.global_step}"
            arrays: dict[str, np.ndarray] = {}
            credit_state = split_state(self.credit_rule.state_dict(), arrays)
            with open(folder / f".{CREDIT_STATE_FILE}.tmp", "wb") as f:
                np.savez(f, **arrays)
            os.replace(folder / f".{CREDIT_STATE_FILE}.tmp", folder / CREDIT_STATE_FILE)
            state = {**self.loop_state_dict(), "credit": self.args.credit, "credit_state": credit_state}
            cli.atomic_write_text(folder / LOOP_STATE_FILE, json.dumps(state))
            (folder / COMPLETE_MARKER).write_text("")

    def load_loop_checkpoint(self, folder: str | Path) -> None:
        """Restore the credit rule's state and the loop's counters saved beside a TRL checkpoint."""
        folder = Path(folder)
        try:
            with np.load(folder / CREDIT_STATE_FILE) as data:
                arrays = {k: data[k] for k in data.files}
            state = json.loads((folder / LOOP_STATE_FILE).read_text())
            if state.get("credit") != self.args.credit:
                raise ValueError(f"saved by credit rule {state.get('credit')!r}, this run's is {self.args.credit!r}")
            bad = [k for k, v in arrays.items() if v.dtype.kind == "f" and not np.isfinite(v).all()]
            if bad:
                raise ValueError(f"non-finite values in {', '.join(bad)}")
            self.credit_rule.load_state_dict(join_state(state["credit_state"], arrays))
        except (OSError, ValueError, KeyError, TypeError, EOFError) as exc:  # zip and JSON errors are ValueErrors too
            raise VcbmGymError(
                f"checkpoint {str(folder)!r}: unreadable credit-rule state or loop state ({exc}); "
                "expected the files a completed checkpoint writes"
            ) from None
        self.outlier_grad_events = state["outlier_grad_events"]
        self.aborted_iterations = state["aborted_iterations"]
        self._grad_norms.extend(state["grad_norms"])
        self._empo_rng.bit_generator.state = state["empo_rng"]
        self.history = state["history"]
