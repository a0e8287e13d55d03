"""PPO's old log-probs (pi_old, Eq. 7 of arXiv:2610.24032) from the first epoch's own forward pass.

TRL scores a batch a second time, without gradients, before training on it, to get the log-probs of the
policy that sampled it whenever it trains more than one epoch on it. Here one epoch is one optimizer step
over the whole batch (gradient accumulation spans the batch's micro-batches), so every micro-batch of the
first epoch is scored by the sampling weights themselves: its own forward pass gives pi_old, and TRL's pass
is one forward pass per iteration spent for nothing (tests/test_llm_old_logps.py: the same numbers).
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any

import torch


class FirstEpochOldLogps:
    """Mixin for a GRPOTrainer, placed before it and before any mixin that computes the training pass.

    Its one flag, `_first_epoch_logps`, is None outside the shortcut. Inside it (TRL's scoring of a batch, and
    the loss of a micro-batch's first epoch) it collects the log-probs of each pass with gradients, and a pass
    without them is TRL's pass for pi_old: it is answered with None, TRL's own value for "no old log-probs",
    so the batch leaves the scoring without them and the first epoch's loss takes its own (detached).
    """

    _first_epoch_logps: list[torch.Tensor] | None = None

    def _old_policy_is_first_epoch(self) -> bool:
        """TRL's pass stays where it is not the same computation: an optimizer step that does not span the
        batch, a KL penalty and importance-sampling correction against vLLM (both need passes in its place)."""
        return (
            self.num_iterations > 1
            and self.args.gradient_accumulation_steps == self.args.steps_per_generation
            and self.beta == 0.0
            and not (self.use_vllm and self.vllm_importance_sampling_correction)
        )

    def _on_old_logps(self, inputs: dict[str, Any], old: torch.Tensor) -> None:
        """Hook: the old log-probs of `inputs` are known (TRL's pass, or a micro-batch's first epoch)."""

    @contextmanager
    def _first_epoch_scope(self):
        self._first_epoch_logps = []
        try:
            yield self._first_epoch_logps
        finally:
            self._first_epoch_logps = None

    def _generate_and_score_completions(self, inputs):
        if self._old_policy_is_first_epoch():
            with self._first_epoch_scope():
                return super()._generate_and_score_completions(inputs)
        output = super()._generate_and_score_completions(inputs)
        if "old_per_token_logps" in output:
            self._on_old_logps(output, output["old_per_token_logps"])
        return output

    def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, *args, **kwargs):
        if self._first_epoch_logps is None:
            return super()._get_per_token_logps_and_entropies(model, input_ids, attention_mask, logits_to_keep, *args, **kwargs)
        if not torch.is_grad_enabled():
            return None, None, None
        out = super()._get_per_token_logps_and_entropies(model, input_ids, attention_mask, logits_to_keep, *args, **kwargs)
        self._first_epoch_logps.append(out[0].detach())
        return out

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        """A micro-batch without `old_per_token_logps` is in its first epoch: the loss (TRL's or LOOP's) takes
        the detached log-probs of its own pass as pi_old, and they are kept as pi_old of the later epochs."""
        if not self._old_policy_is_first_epoch() or "old_per_token_logps" in inputs:
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        with self._first_epoch_scope() as passes:
            loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        if len(passes) != 1:
            raise RuntimeError(f"{len(passes)} training passes in one loss: expected 1")
        inputs["old_per_token_logps"] = passes[0]  # TRL reuses this micro-batch's dict in every epoch
        self._on_old_logps(inputs, passes[0])
        return loss
