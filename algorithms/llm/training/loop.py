"""LOOP and VCBM-blended LOOP (`--algo loop`, `--algo vcbm-loop`): where the credit rule enters the LLM arm
("Visual Causal-chain Bookmarking" (Selvakumar, 2026, arXiv:2610.24032), Sec. II-C, IV-B).

`LoopTrainer` changes MultiTurnGRPOTrainer (trainer.py), in reading order:

1. `_score_episodes` (the hook `MultiTurnGRPOTrainer._generate_and_score_completions` calls after TRL's
   scoring) replaces TRL's per-sequence group advantage by per-token advantages from the run's credit
   rule (`credit`, `credit_kwargs`: `make_rule` on the batch's EpisodeBatch; loop: LOO (Eq. 6)
   broadcast to every generated token, vcbm-loop: LOO blended with VCBM's retrieval weights, Eq. 12-14).
   With several processes the rule sees the episodes of all of them (`gather_episode_batch`): a task's
   K rollouts may sit on different ranks. A stateful rule (vcbm_blend's episodic memory) observes the
   batch at the end of its iteration, and only if the iteration is kept. A branch-based rule (VinePPO,
   RICE-PO) first gets the continuations it asks for (branches.py).
2. `_compute_loss` is the per-token PPO-clip of Eq. 7-8 (eps 0.1, no critic, no KL penalty unless `beta` > 0
   adds GRPO's toward the starting model), averaged over the generated tokens of the generation batch, optionally
   with EMPO's shared ratios (docs/papers/empo.md); `objective` (`_policy_loss`) replaces it by GSPO's sequence ratio, or
   normalises the rule's advantages over the whole batch first for REINFORCE++ (`token_advantages`;
   docs/papers/base_objectives.md). It estimates the KL to the rollout policy; above `kl_abort` nats the whole
   iteration is discarded: its remaining micro-batches contribute nothing and, at its end, the
   trainable weights and optimizer state return to their values before the iteration.
3. `_get_grad_norm` counts outlier-gradient events; `_save_checkpoint` adds the credit rule's
   state (`state_dict`: vcbm_blend's episodic memory) and the loop's counters to TRL's checkpoints (adapter, optimizer,
   RNG; checkpoints.py). The loss and KL estimate live in loss.py.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import time
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np
import torch

from algorithms.common.credit_slot import credit_of
from algorithms.llm.config import LoopConfig, credit_slot
from algorithms.llm.generation.rollout import NO_EFFECT, Episode
from algorithms.llm.training.batch import context_keys, gather_episode_batch
from algorithms.llm.training.branches import BranchContinuations
from algorithms.llm.training.checkpoints import load_loop_state, save_loop_state
from algorithms.llm.training.loss import (
    global_normalized_advantages,
    gspo_token_ratios,
    kl_old_new,
    kl_to_reference,
    ppo_clip_token_loss,
    sequence_mean_loss,
    token_ratios,
)
from algorithms.llm.training.metrics import rule_numbers
from algorithms.llm.training.trainer import MultiTurnGRPOTrainer
from vcbm_gym.credit.base import CreditRule, EpisodeBatch
from vcbm_gym.credit.branch import BranchRule


class LoopTrainer(BranchContinuations, MultiTurnGRPOTrainer):
    """MultiTurnGRPOTrainer with a credit rule's per-token advantages and LOOP's PPO-clip loss."""

    def __init__(self, model, args: LoopConfig, *trainer_args, credit_rule: CreditRule | None = None, **trainer_kwargs) -> None:
        """As MultiTurnGRPOTrainer; `args` carries the LOOP settings and names the credit rule (`credit`,
        `credit_kwargs`). `credit_rule`: that rule as the run built it (algorithms.llm.resolve); built here if None."""
        if credit_rule is None:
            credit_rule = credit_slot(args.credit, args.credit_kwargs).build(args.CREDIT_FIT)
        self.credit_rule = credit_rule
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

        effects = [[None if x in NO_EFFECT else x for x in e.effects] for e in episodes]
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
        if self.beta != 0.0:  # GRPO's penalty toward the starting model, added after the correction as TRL does
            kl = kl_to_reference(inputs["ref_per_token_logps"], logps)
            self._record_reference_kl(kl.detach(), mask)
            if self.args.use_bias_correction_kl:  # TRL's default: the unbiased reverse-KL gradient (DeepSeek-V3.2)
                kl = kl * ratio
            per_token = per_token + self.beta * kl
        if self.args.objective == "gspo":  # every micro-batch holds per_device_train_batch_size of the sequences
            return sequence_mean_loss(per_token, mask) / self.current_gradient_accumulation_steps
        normalizer = inputs["num_items_in_batch"].clamp(min=1.0) / self.accelerator.num_processes
        normalizer = normalizer * self.current_gradient_accumulation_steps / self.args.steps_per_generation
        return (per_token * mask).sum() / normalizer

    @torch.no_grad()
    def _record_reference_kl(self, kl: torch.Tensor, mask: torch.Tensor) -> None:
        """The micro-batch's mean KL penalty per generated token; the iteration keeps the largest (over processes)."""
        mean = (kl * mask).sum() / mask.sum().clamp(min=1.0)
        mean = self.accelerator.gather(mean.reshape(1)).max().item()
        self._iter_stats["kl_to_reference"] = max(self._iter_stats["kl_to_reference"], mean)

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
        if self.beta != 0.0:
            metrics["kl_to_reference"] = s["kl_to_reference"]
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
