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

A multi-turn batch's completions differ in length by hundreds of tokens (a Sokoban episode solved in three moves
beside one played out for fifteen), and TRL pads them all to the longest. The pass therefore runs on chunks of
rows of similar length (`length_chunks`), each cut to its own longest completion: attention is causal, so the
positions cut off change no earlier token's log-prob, and they come back as 0 under a completion mask of 0.
"""

from __future__ import annotations

import contextlib

import torch

from algorithms.llm.generation.decode import CACHE

# A chunk's fixed cost in completion tokens: one pass with gradients over a 2-row chunk of the warm-started tiny model
# takes about 9 ms on one CPU thread, the time of about 90 completion tokens of a 48-row chunk (about 100 us each)
CALL_COST_TOKENS = 100


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


def completion_ends(completion_mask: torch.Tensor) -> torch.Tensor:
    """Per row, one past the last attended completion position (0 for a row with none)."""
    positions = torch.arange(1, completion_mask.size(1) + 1, device=completion_mask.device)
    return (completion_mask.bool() * positions).amax(dim=1)


def length_chunks(
    ends: list[int], prompts: list[int], prompt_width: int, max_rows: int, call_cost: int = CALL_COST_TOKENS
) -> list[tuple[int, int]]:
    """Contiguous chunks [start, stop) of rows sorted by completion end (longest first) that minimise the tokens the
    pass computes: each chunk's rows times its longest completion, plus its distinct prompts times the prompt width
    (each encoded once per chunk), plus `call_cost` a chunk. At most `max_rows` rows a chunk. `prompts`: each row's
    prompt id."""
    n = len(ends)
    best = [0.0] + [float("inf")] * n
    start_of = [0] * (n + 1)
    for stop in range(1, n + 1):
        seen: set[int] = set()
        for start in range(stop - 1, max(stop - max_rows, 0) - 1, -1):
            seen.add(prompts[start])
            cost = best[start] + (stop - start) * ends[start] + len(seen) * prompt_width + call_cost
            if cost < best[stop]:
                best[stop], start_of[stop] = cost, start
    chunks, stop = [], n
    while stop > 0:
        chunks.append((start_of[stop], stop))
        stop = start_of[stop]
    return chunks[::-1]


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


def trimmed_chunk_logps(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    logits_to_keep: int,
    temperature: float,
    compute_entropy: bool,
    max_rows: int,
    unshared_pass,
    autocast=contextlib.nullcontext,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`shared_prefix_logps` over `length_chunks` of the rows, each chunk cut to its longest completion, in the rows'
    order and padded back to `logits_to_keep` with 0 (positions no mask attends). A chunk whose rows share no prompt
    goes through `unshared_pass(ids, mask, keep) -> (log-probs, entropies or None)`; `autocast()` wraps the shared one."""
    width = input_ids.size(1) - logits_to_keep
    ends = completion_ends(attention_mask[:, width:])
    order = torch.argsort(ends, descending=True, stable=True)
    _, row_prompt = distinct_prompts(input_ids[:, :width], attention_mask[:, :width])
    chunks = length_chunks(ends[order].tolist(), row_prompt[order].tolist(), width, max_rows)
    logps, entropies = [], []
    for start, stop in chunks:
        rows = order[start:stop]
        keep = max(int(ends[rows].max()), 1)
        ids, mask = input_ids[rows, : width + keep], attention_mask[rows, : width + keep]
        with autocast():
            out = shared_prefix_logps(model, ids, mask, keep, temperature, compute_entropy)
        if out is None:  # no prompt shared within this chunk
            out = unshared_pass(ids, mask, keep)
        pad = (0, logits_to_keep - keep)
        logps.append(torch.nn.functional.pad(out[0], pad))
        entropies.append(torch.nn.functional.pad(out[1], pad) if compute_entropy else None)
    back = torch.argsort(order)
    return torch.cat(logps)[back], torch.cat(entropies)[back] if compute_entropy else None


class SharedPromptLogps:
    """Mixin for a GRPOTrainer, placed before it: TRL's log-probs and entropies, over chunks of rows of similar
    completion length each cut to its longest (`trimmed_chunk_logps`), with each distinct prompt of a chunk encoded
    once (`shared_prefix_logps`).

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

        def trl_pass(ids, mask, keep):
            return super(SharedPromptLogps, self)._get_per_token_logps_and_entropies(
                model, ids, mask, keep, ids.size(0), compute_entropy
            )[:2]

        logps, entropies = trimmed_chunk_logps(
            model,
            input_ids,
            attention_mask,
            logits_to_keep,
            self.temperature,
            compute_entropy,
            max_rows=batch_size or input_ids.size(0),
            unshared_pass=trl_pass,
            autocast=self.accelerator.autocast,
        )
        return logps, entropies, None

    def _can_share_prompts(self, model, extra_inputs: dict) -> bool:
        if self.accelerator.num_processes > 1:
            return False
        if any(value not in (None, False) for value in extra_inputs.values()):
            return False
        head = self.accelerator.unwrap_model(model).get_output_embeddings()
        return head is not None and head.weight.dtype == torch.float32
