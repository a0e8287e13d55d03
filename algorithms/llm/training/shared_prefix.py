"""The training pass's log-probs with each distinct prompt encoded once (the K rollouts of a task share it).

A GRPO/LOOP batch holds K rollouts of every task, and the K share their prompt token for token
(the same left padding included). TRL's `_get_per_token_logps_and_entropies` runs the model over
[prompt, completion] of every row, so each prompt is encoded K times, and on a CPU it also scores
every prompt position with the output layer. Here the distinct prompts go through the model once,
their keys and values are copied to their rows (`reorder_cache`, an index_select that autograd
sums back over the copies), and the completions run on that cache: the same log-probs, up to float
rounding (the same sums in other chunks), and the same gradients, for about 1/K of the prompt's cost.

Rotary position embeddings make attention depend only on relative positions, and both paths give
row r's token j the position j of the padded [prompt, completion] rectangle, so they agree.
"""

from __future__ import annotations

import torch

from algorithms.llm.generation.decode import CACHE


def distinct_prompts(prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(first row of each distinct (prompt, mask) pair, the index of each row's pair among them)."""
    keys = torch.cat([prompt_ids, prompt_mask.to(prompt_ids.dtype)], dim=1)
    _, inverse = torch.unique(keys, dim=0, return_inverse=True)
    first = torch.full((int(inverse.max()) + 1,), keys.size(0), dtype=torch.long, device=keys.device)
    first = first.scatter_reduce(0, inverse, torch.arange(keys.size(0), device=keys.device), reduce="amin")
    # order the distinct prompts by first appearance, so that inverse is a plain lookup into them
    order = torch.argsort(first)
    rank = torch.empty_like(order)
    rank[order] = torch.arange(order.numel(), device=order.device)
    return first[order], rank[inverse]


def shared_prefix_logps(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    logits_to_keep: int,
    temperature: float,
    compute_entropy: bool,
) -> tuple[torch.Tensor, torch.Tensor | None] | None:
    """(log-probs, entropies or None), each (rows, logits_to_keep), of the last `logits_to_keep` tokens of each
    row under the model's sampling distribution at `temperature`; None when no two rows share their prompt."""
    width = input_ids.size(1) - logits_to_keep
    if width < 1 or logits_to_keep < 1:
        return None
    prompt_ids, prompt_mask = input_ids[:, :width], attention_mask[:, :width]
    first, row_prompt = distinct_prompts(prompt_ids, prompt_mask)
    if first.numel() == input_ids.size(0):
        return None
    head = model(input_ids=prompt_ids[first], attention_mask=prompt_mask[first], use_cache=True, logits_to_keep=1)
    cache = getattr(head, CACHE)
    cache.reorder_cache(row_prompt)
    tail = model(input_ids=input_ids[:, width:], attention_mask=attention_mask, use_cache=True, **{CACHE: cache})
    # token j of the completion is scored by the output at the position before it: the prompt's last for j = 0
    logits = torch.cat([head.logits[:, -1:][row_prompt], tail.logits[:, :-1]], dim=1).float() / temperature
    log_probs = torch.log_softmax(logits, dim=-1)
    logps = log_probs.gather(-1, input_ids[:, width:].unsqueeze(-1)).squeeze(-1)
    entropies = -(log_probs.exp() * log_probs).sum(-1) if compute_entropy else None
    return logps, entropies


class SharedPromptLogps:
    """Mixin for a GRPOTrainer, placed before it: TRL's log-probs and entropies, with each distinct prompt of a
    chunk encoded once (`shared_prefix_logps`).

    TRL's own pass stays where the shortcut is not the same computation or not known to be safe: extra model
    inputs (images, MoE router losses), several processes (a second forward before backward under DDP/FSDP),
    an output layer that is not float32 (TRL scores in float32).
    """

    def _get_per_token_logps_and_entropies(
        self, model, input_ids, attention_mask, logits_to_keep, batch_size=None, compute_entropy=False, **kwargs
    ):
        if not self._can_share_prompts(model, kwargs):
            return super()._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy, **kwargs
            )
        size, logps, entropies = batch_size or input_ids.size(0), [], []
        for start in range(0, input_ids.size(0), size):
            ids, mask = input_ids[start : start + size], attention_mask[start : start + size]
            with self.accelerator.autocast():
                shared = shared_prefix_logps(model, ids, mask, logits_to_keep, self.temperature, compute_entropy)
            if shared is None:  # no prompt shared within this chunk
                shared = super()._get_per_token_logps_and_entropies(model, ids, mask, logits_to_keep, size, compute_entropy)[:2]
            logps.append(shared[0])
            entropies.append(shared[1])
        return torch.cat(logps), torch.cat(entropies) if compute_entropy else None, None

    def _can_share_prompts(self, model, extra_inputs: dict) -> bool:
        if self.accelerator.num_processes > 1:
            return False
        if any(value not in (None, False) for value in extra_inputs.values()):
            return False
        head = self.accelerator.unwrap_model(model).get_output_embeddings()
        return head is not None and head.weight.dtype == torch.float32
