"""A decoder forward pass over packed tokens and a gap-free key/value cache, for the rollout's sampling.

`CachedGeneration` (algorithms.llm.generation.decode) feeds each turn's new tokens, and then one token per
step, to a batch of episodes whose contexts have different lengths. Through transformers' forward
the batch is a rectangle: a turn's chunks are left-padded to the longest (padding that every
projection and MLP computes), the cache is a [rows, slots] rectangle with masked holes, the
grouped key/value heads are copied to every query head before attention, and each call builds its
masks and runs the model's wrappers anew. Here, for the Llama-style decoders it knows
(`packed_forward_supported`: Qwen2, Qwen3, Llama), the same layer modules are called on packed
tokens instead:

- projections, norms and MLPs see [1, tokens, hidden] with only the real tokens (no padding);
- row r's cache holds its tokens at slots 0 .. lengths[r] - 1, so a token's slot is its position
  id and causality is the whole mask (`slot <= position`): no holes, no 2-D mask to carry;
- attention is one `scaled_dot_product_attention` call per layer over [rows, heads, widest chunk]
  queries, with `enable_gqa` (the key/value heads are not copied per query head).

The arithmetic is the model's own (its modules, its rotary embedding and `apply_rotary_pos_emb`,
its `scaling`), so logits equal those of transformers' forward up to float rounding (the same
sums taken in other chunks); tests/test_llm_throughput_parity.py holds the sampled tokens and
log-probs to the re-encoding path's.
"""

from __future__ import annotations

import sys

import torch

# room kept ahead when the cache grows: the decoding steps of a turn fit without a copy when they are few; when
# they are many, the buffers grow every this many slots (attending over masked slots costs less than a copy per step)
_MAX_SLOTS_AHEAD = 64
_PACKED_MODEL_TYPES = ("qwen2", "qwen3", "llama")
_DECODER_PARTS = ("embed_tokens", "layers", "norm", "rotary_emb")
_LAYER_PARTS = ("input_layernorm", "self_attn", "post_attention_layernorm", "mlp")
_ATTENTION_PARTS = ("q_proj", "k_proj", "v_proj", "o_proj", "head_dim", "scaling")


def _base_model(model):
    """The causal LM itself (a PEFT wrapper's base model; LoRA layers stay in it and are called as modules)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def packed_forward_supported(model) -> bool:
    """Whether `PackedForward` computes `model`'s forward: a Llama-style decoder of a known type, full attention only."""
    base = _base_model(model)
    config = getattr(base, "config", None)
    decoder = getattr(base, "model", None)
    if getattr(config, "model_type", None) not in _PACKED_MODEL_TYPES or decoder is None:
        return False
    layer_types = getattr(config, "layer_types", None) or ["full_attention"]
    if any(t != "full_attention" for t in layer_types) or getattr(config, "use_sliding_window", False):
        return False
    if not all(hasattr(decoder, part) for part in _DECODER_PARTS) or base.get_output_embeddings() is None:
        return False
    return all(
        all(hasattr(layer, part) for part in _LAYER_PARTS) and all(hasattr(layer.self_attn, a) for a in _ATTENTION_PARTS)
        for layer in decoder.layers
    )


def _single_query_attention(query, keys, values, bias, scaling: float) -> torch.Tensor:
    """Attention of one query per row, [rows, heads, dim], over the rows' cached keys and values [rows, kv heads, slots, dim].

    Two batched matmuls with the query heads grouped by the key/value head they read (query head h
    reads key/value head h // (heads / kv heads), as transformers' `repeat_kv` arranges them).
    `bias` [rows, 1, 1, slots]: 0 where a slot may be attended to, -inf elsewhere. Measured faster
    than `scaled_dot_product_attention`'s CPU kernel for a single query, which tiles for long query blocks.
    """
    rows, heads, dim = query.shape
    grouped = query.reshape(rows, keys.shape[1], heads // keys.shape[1], dim) * scaling
    scores = torch.matmul(grouped, keys.transpose(-1, -2)) + bias  # [rows, kv heads, group, slots]
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(values.dtype)  # float32 softmax, as transformers' eager
    return torch.matmul(weights, values).reshape(rows, heads, dim)


class PackedForward:
    """Rows of episodes with a gap-free key/value cache each; `feed` and `step` return each row's next-token logits.

    The interface of the rollout's cache engines (algorithms.llm.generation.decode): `reset`, `select` (rows
    reordered, repeated or dropped), `feed` (a chunk of new tokens per row, with `room`: the decoding
    steps that may follow) and `step` (one token per row; a row whose token is not `kept`,
    an episode that already ended, does not advance: its slot is overwritten by its next real token).
    """

    def __init__(self, model) -> None:
        base = _base_model(model)
        self.decoder, self.lm_head = base.model, base.get_output_embeddings()
        self.layers = list(self.decoder.layers)
        attention = self.layers[0].self_attn
        self.rotate = sys.modules[type(attention).__module__].apply_rotary_pos_emb
        self.head_dim = attention.head_dim
        self.device = next(model.parameters()).device
        self.reset()

    def reset(self) -> None:
        self.keys: list[torch.Tensor | None] = [None] * len(self.layers)  # per layer: [rows, kv heads, capacity, head dim]
        self.values: list[torch.Tensor | None] = [None] * len(self.layers)
        self.lengths = torch.zeros(0, dtype=torch.long, device=self.device)  # per row: tokens held (its next position)
        self.capacity = 0  # slots per row in the buffers; every pass attends over all of them (masked past a row's tokens)
        self.ahead = 0  # slots added beyond what a pass needs when the buffers grow

    def select(self, index: list[int]) -> None:
        index_t = torch.tensor(index, dtype=torch.long, device=self.device)
        self.lengths = self.lengths[index_t]
        self.keys = [None if k is None else k[index_t] for k in self.keys]
        self.values = [None if v is None else v[index_t] for v in self.values]

    def feed(self, chunks: list[list[int]], room: int) -> torch.Tensor:
        """Append chunk r to row r (rows are created on an empty cache); [rows, vocab] logits after each chunk."""
        if not len(self.lengths):
            self.lengths = torch.zeros(len(chunks), dtype=torch.long, device=self.device)
        sizes = torch.tensor([len(c) for c in chunks], dtype=torch.long)
        ids = torch.tensor([t for c in chunks for t in c], dtype=torch.long, device=self.device)
        starts = sizes.cumsum(0) - sizes
        row_ids = torch.repeat_interleave(torch.arange(len(chunks)), sizes).to(self.device)
        offsets = torch.arange(len(ids), device=self.device) - starts.to(self.device)[row_ids]
        positions = self.lengths[row_ids] + offsets
        self.ahead = min(room, _MAX_SLOTS_AHEAD)
        logits = self._forward(ids, row_ids, offsets, positions, int(sizes.max()), (starts + sizes - 1).to(self.device))
        self.lengths = self.lengths + sizes.to(self.device)
        return logits

    def step(self, tokens: torch.Tensor, kept: torch.Tensor) -> torch.Tensor:
        """Feed one token per row; rows where `kept` is False do not keep theirs. [rows, vocab] logits."""
        rows = torch.arange(len(self.lengths), device=self.device)
        logits = self._forward(tokens.to(self.device), rows, None, self.lengths, 1, rows)
        self.lengths = self.lengths + kept.to(self.device, torch.long)
        return logits

    def _slots(self, layer: int, keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer `layer`'s cache buffers, grown to `capacity` slots (allocated on first use, shaped as `keys`)."""
        held = self.keys[layer]
        if held is None or held.shape[2] < self.capacity:
            shape = (len(self.lengths), keys.shape[1], self.capacity, keys.shape[3])
            # zeros, not empty: a slot past a row's length is masked, but 0 x NaN garbage would still be NaN
            grown_keys, grown_values = keys.new_zeros(shape), keys.new_zeros(shape)
            if held is not None:
                grown_keys[:, :, : held.shape[2]] = held
                grown_values[:, :, : held.shape[2]] = self.values[layer]
            self.keys[layer], self.values[layer] = grown_keys, grown_values
        return self.keys[layer], self.values[layer]

    def _forward(self, ids, row_ids, offsets, positions, width: int, last) -> torch.Tensor:
        """One pass over packed tokens: token i of row row_ids[i] at `positions[i]` (slot of its chunk: offsets[i];
        None: one token per row). Returns the logits at the packed indices `last`."""
        rows, tokens = len(self.lengths), len(ids)
        needed = int(positions.max()) + 1
        if needed > self.capacity:
            self.capacity = needed + self.ahead
        # attention spans the buffers whole: contiguous (the kernels copy a view of part of them), at most `ahead` slots masked
        span = self.capacity
        hidden = self.decoder.embed_tokens(ids)[None]  # [1, tokens, hidden]
        cos, sin = self.decoder.rotary_emb(hidden, positions[None])
        if offsets is None:
            query_positions = positions[:, None]  # [rows, 1]
        else:
            query_positions = torch.zeros((rows, width), dtype=torch.long, device=self.device)  # padding: position 0
            query_positions[row_ids, offsets] = positions
        causal = (torch.arange(span, device=self.device) <= query_positions[..., None])[:, None]  # [rows, 1, width, span]
        if offsets is None:  # additive form for the single-query attention below
            causal = torch.zeros(causal.shape, dtype=hidden.dtype, device=self.device).masked_fill_(~causal, float("-inf"))
        for index, layer in enumerate(self.layers):
            attention = layer.self_attn
            normed = layer.input_layernorm(hidden)
            query = attention.q_proj(normed).view(1, tokens, -1, self.head_dim)
            key = attention.k_proj(normed).view(1, tokens, -1, self.head_dim)
            value = attention.v_proj(normed).view(1, tokens, -1, self.head_dim)
            if hasattr(attention, "q_norm"):  # Qwen3: RMSNorm over each head's dims before the rotation
                query, key = attention.q_norm(query), attention.k_norm(key)
            query, key = self.rotate(query.transpose(1, 2), key.transpose(1, 2), cos, sin)  # [1, heads, tokens, dim]
            keys, values = self._slots(index, key)
            keys[row_ids, :, positions] = key[0].transpose(0, 1)
            values[row_ids, :, positions] = value[0]
            if offsets is None:
                out = _single_query_attention(query[0].transpose(0, 1), keys, values, causal, attention.scaling)
            else:
                queries = query.new_zeros((rows, query.shape[1], width, self.head_dim))
                queries[row_ids, :, offsets] = query[0].transpose(0, 1)
                out = torch.nn.functional.scaled_dot_product_attention(
                    queries, keys[:, :, :span], values[:, :, :span], attn_mask=causal, scale=attention.scaling, enable_gqa=True
                )[row_ids, :, offsets]  # [tokens, heads, dim]
            hidden = hidden + attention.o_proj(out.reshape(1, tokens, -1))
            hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
        return self.lm_head(self.decoder.norm(hidden[0, last]))
