"""VCBM for language agents: bookmarks, hashed embeddings, retrieval weights and the LOO blend.

"Visual Causal-chain Bookmarking" (Selvakumar, 2026, arXiv:2610.24032), Sec. IV-B, Eq. 12-14;
choices in docs/papers/vcbm.md ("LOOP and VCBM-blended LOOP"). A *bookmark* is a turn whose tool call mutated
environment state; its key is the raw execution output of that call. Per rollout, the terminal
observation is embedded (z_H), compared by cosine to the rollout's own bookmarks, and the top-k
bookmarked turns share a softmax weight; every other generated token gets the floor alpha. The
weights are renormalised to sum to the generated-token count and blended with the rollout's
leave-one-out advantage.

Edge cases (docs/papers/vcbm.md): with 0 bookmarks the rollout gets plain LOO; with <= k bookmarks the
paper skips retrieval and gives every bookmarked turn the floor alpha, so every token weighs alpha
and the renormalised weights are all 1: again plain LOO. `few_bookmarks="retrieve"` is an opt-in
alternative (not the paper's) that ranks however many bookmarks there are (softmax over all of
them), for short-horizon tasks such as TextWatchRepair where an episode never has more than k.
"""

from __future__ import annotations

import hashlib
import re
from functools import lru_cache
from typing import Any, Sequence

import numpy as np

import vcbm_gym.credit.options as options
from vcbm_gym.credit.base import CreditRule, EpisodeBatch
from vcbm_gym.credit.loo import loo_advantages
from vcbm_gym.credit.vcbm_bookmark import FLOOR_WEIGHT

_TOKEN = re.compile(r"[a-z0-9]+")
FEW_BOOKMARK_MODES = ("floor", "retrieve")
# Eq. 13's settings, written once for `retrieval_weights` and VCBMBlendRule (the floor weight alpha: FLOOR_WEIGHT)
TOP_K = 6
TAU = 0.5
FEW_BOOKMARKS = "floor"  # the paper's rule: <= top_k bookmarks leave every step at the floor
EMBEDDING_DIM = 256  # width of the hashed embedding of a bookmark's text


@lru_cache(maxsize=65536)
def _bucket(token: str, dim: int) -> int:
    return int(hashlib.md5(token.encode("utf-8")).hexdigest()[:8], 16) % dim


def hash_embed(text: str, d: int = EMBEDDING_DIM) -> np.ndarray:
    """Eq. 12: g(x)_j = #{tokens of x with h(token) = j} / ||counts||_2, h = int(md5(token)[:8], 16) mod d.

    Tokens are the lowercase alphanumeric regex matches of the text. Text without tokens embeds
    to the zero vector.
    """
    return _cached_embed(text, d).copy()


@lru_cache(maxsize=8192)
def _cached_embed(text: str, d: int) -> np.ndarray:
    # cached by text: a batch's bookmark outputs are embedded for the memory and for Eq. 13
    buckets = [_bucket(token, d) for token in _TOKEN.findall(text.lower())]
    counts = np.bincount(np.asarray(buckets, dtype=np.int64), minlength=d).astype(np.float64)
    norm = np.linalg.norm(counts)
    return counts / norm if norm > 0 else counts


class EpisodicMemory:
    """The (turn_idx, embedding, return) tuples of past bookmarks, kept across iterations.

    `capacity=None` keeps everything (storage doubles as needed); otherwise a ring buffer drops
    the oldest entries first. The arrays read back in insertion order.
    """

    def __init__(self, dim: int = EMBEDDING_DIM, capacity: int | None = None) -> None:
        if capacity is not None and capacity < 1:
            raise ValueError(f"capacity={capacity}: expected None or an integer >= 1")
        self.dim, self.capacity = int(dim), capacity
        self._clear(capacity or 64)

    def _clear(self, size: int) -> None:
        self._turn = np.zeros(size, dtype=np.int64)
        self._emb = np.zeros((size, self.dim), dtype=np.float32)
        self._ret = np.zeros(size, dtype=np.float64)
        self._count = 0  # entries ever added (the ring's write position is _count % capacity)

    def __len__(self) -> int:
        return min(self._count, len(self._turn))

    def _order(self) -> np.ndarray:
        n = len(self)
        start = self._count - n
        return (start + np.arange(n)) % len(self._turn)

    @property
    def turn_idx(self) -> np.ndarray:
        return self._turn[self._order()]

    @property
    def embeddings(self) -> np.ndarray:
        return self._emb[self._order()]

    @property
    def returns(self) -> np.ndarray:
        return self._ret[self._order()]

    def add(self, turn_idx: Sequence[int], embeddings: np.ndarray, returns: Sequence[float]) -> None:
        embeddings = np.asarray(embeddings, dtype=np.float32).reshape(-1, self.dim)
        if not len(turn_idx) == len(embeddings) == len(returns):
            raise ValueError(
                f"{len(turn_idx)} turn indices, {len(embeddings)} embeddings, {len(returns)} returns: expected equal counts"
            )
        n = len(embeddings)
        if self.capacity is None and self._count + n > len(self._turn):
            size = max(2 * len(self._turn), self._count + n)
            for name in ("_turn", "_emb", "_ret"):
                old = getattr(self, name)
                grown = np.zeros((size,) + old.shape[1:], dtype=old.dtype)
                grown[: self._count] = old[: self._count]
                setattr(self, name, grown)
        if self.capacity is not None and n > self.capacity:  # only the newest `capacity` can stay
            turn_idx, embeddings, returns = turn_idx[-self.capacity :], embeddings[-self.capacity :], returns[-self.capacity :]
            self._count += n - self.capacity
            n = self.capacity
        slots = (self._count + np.arange(n)) % len(self._turn)
        self._turn[slots] = np.asarray(turn_idx, dtype=np.int64)
        self._emb[slots] = embeddings
        self._ret[slots] = np.asarray(returns, dtype=np.float64)
        self._count += n

    def state_dict(self) -> dict[str, Any]:
        return {
            "dim": self.dim,
            "capacity": self.capacity,
            "turn_idx": self.turn_idx,
            "embeddings": self.embeddings,
            "returns": self.returns,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if int(state["dim"]) != self.dim:
            raise ValueError(f"memory of dimension {state['dim']}: expected {self.dim}")
        self.capacity = state.get("capacity", self.capacity)
        turns = np.asarray(state["turn_idx"], dtype=np.int64)
        self._clear(self.capacity or max(64, len(turns)))
        self.add(turns, np.asarray(state["embeddings"], dtype=np.float32), np.asarray(state["returns"], dtype=np.float64))


def retrieves(n_bookmarks: int, top_k: int = TOP_K, few_bookmarks: str = FEW_BOOKMARKS) -> bool:
    """Whether Eq. 13's retrieval ranks a rollout's bookmarks: it has some, and more than top_k of them unless
    `few_bookmarks="retrieve"`; otherwise every step weighs 1 (plain LOO)."""
    return n_bookmarks > 0 and (n_bookmarks > top_k or few_bookmarks == "retrieve")


def retrieval_weights(
    step_turn: np.ndarray,
    mask: np.ndarray,
    bookmark_turns: Sequence[int],
    bookmark_embeddings: np.ndarray,
    query_embedding: np.ndarray,
    top_k: int = TOP_K,
    tau: float = TAU,
    alpha: float = FLOOR_WEIGHT,
    few_bookmarks: str = FEW_BOOKMARKS,
) -> np.ndarray:
    """Eq. 13 for one rollout: (T,) per-step weights w~_t, summing to the number of masked steps.

    sim_i = cos(z_H, k_i) over the rollout's bookmarks; w_i = softmax(sim_i / tau) over the top-k;
    the masked steps of a retrieved bookmarked turn get w_i, every other masked step gets alpha;
    the vector is then scaled to sum to mask.sum(). Unmasked steps weigh 0. With no bookmarks, or
    with <= top_k of them under `few_bookmarks="floor"` (the paper's rule), every step weighs 1.
    """
    mask = np.asarray(mask, dtype=bool)
    n_steps = int(mask.sum())
    weights = np.where(mask, float(alpha), 0.0)
    n_bookmarks = len(bookmark_turns)
    if n_steps == 0:
        return weights
    if not retrieves(n_bookmarks, top_k, few_bookmarks):
        return mask.astype(np.float64)  # every token at the floor: renormalised, all ones (plain LOO)
    keys = np.asarray(bookmark_embeddings, dtype=np.float64).reshape(n_bookmarks, -1)
    query = np.asarray(query_embedding, dtype=np.float64)
    norms = np.linalg.norm(keys, axis=1) * np.linalg.norm(query)
    sims = np.divide(keys @ query, norms, out=np.zeros(n_bookmarks), where=norms > 0)
    top = np.argsort(-sims, kind="stable")[: min(top_k, n_bookmarks)]
    logits = sims[top] / tau
    w = np.exp(logits - logits.max())
    w /= w.sum()
    step_turn = np.asarray(step_turn)
    for i, wi in zip(top, w):
        weights[mask & (step_turn == bookmark_turns[i])] = wi
    return weights * (n_steps / weights.sum())


def blend(loo_advantage: float | np.ndarray, weights: np.ndarray, beta: float) -> np.ndarray:
    """Eq. 14: A_t = (1 - beta) A_k + beta A_k w~_t (beta = 0 is LOOP, beta = 1 is pure VCBM)."""
    a = np.asarray(loo_advantage, dtype=np.float64)
    if a.ndim == 1:
        a = a[:, None]
    return (1.0 - beta) * a + beta * a * np.asarray(weights, dtype=np.float64)


class VCBMBlendRule(CreditRule):
    """VCBM-blended LOO over token-level episodes (Eq. 12-14).

    Reads from the batch: `step_turn` (turn id per token), `turn_flags["state_mutating"]`
    (per-episode bools over turns), `turn_texts` (per-episode execution output per turn) and
    `final_texts` (terminal observation per episode). `observe` stores every bookmark of the batch
    in the episodic memory (turn index, embedding, episode return); the memory persists through
    `state_dict` / `load_state_dict`. Eq. 13 ranks the rollout's own (docs/papers/vcbm.md)
    bookmarks; the memory is kept for persistence and analysis and does not change the weights.
    """

    name = "vcbm_blend"
    batch_needs = ("group_ids", "turn_flags['state_mutating']", "turn_texts", "final_texts")
    info_needs = ("state_mutating", "execution_output")

    def __init__(
        self,
        beta: float = 1.0,
        tau: float = TAU,
        top_k: int = TOP_K,
        alpha: float = FLOOR_WEIGHT,
        dim: int = EMBEDDING_DIM,
        memory_capacity: int | None = None,
        few_bookmarks: str = FEW_BOOKMARKS,
    ) -> None:
        self.beta = options.number("beta", beta, 0, 1)
        self.tau = options.number("tau", tau, above=0)
        self.top_k = options.integer("top_k", top_k, 1)
        self.alpha = options.number("alpha", alpha, above=0, below=1)
        self.dim = options.integer("dim", dim, 1)
        if few_bookmarks not in FEW_BOOKMARK_MODES:
            raise ValueError(f"few_bookmarks={few_bookmarks!r}: expected one of {FEW_BOOKMARK_MODES}")
        self.few_bookmarks = few_bookmarks
        self.memory = EpisodicMemory(self.dim, options.optional_integer("memory_capacity", memory_capacity, 1))
        self.retrieval_share = float("nan")  # of the last batch's rollouts, those whose bookmarks were ranked

    def _bookmarks(self, batch: EpisodeBatch, b: int) -> tuple[list[int], np.ndarray]:
        flags = batch.turn_flags.get("state_mutating")
        if flags is None or batch.turn_texts is None:
            raise ValueError("VCBMBlendRule needs turn_flags['state_mutating'] and turn_texts in the batch")
        turns = [int(t) for t in np.flatnonzero(np.asarray(flags[b], dtype=bool))]
        keys = np.array([hash_embed(batch.turn_texts[b][t], self.dim) for t in turns]).reshape(len(turns), self.dim)
        return turns, keys

    def observe(self, batch: EpisodeBatch) -> None:
        turns, keys, returns, episode_returns = [], [], [], batch.returns
        for b in range(batch.batch_size):
            bookmark_turns, bookmark_keys = self._bookmarks(batch, b)
            turns += bookmark_turns
            keys.append(bookmark_keys)
            returns += [episode_returns[b]] * len(bookmark_turns)
        self.memory.add(turns, np.concatenate(keys) if keys else np.zeros((0, self.dim)), returns)

    def token_weights(self, batch: EpisodeBatch) -> np.ndarray:
        """(B, T) renormalised Eq. 13 weights of every episode."""
        if batch.final_texts is None:
            raise ValueError("VCBMBlendRule needs final_texts (terminal observations) in the batch")
        out = np.zeros(batch.rewards.shape)
        ranked = 0
        for b in range(batch.batch_size):
            turns, keys = self._bookmarks(batch, b)
            ranked += retrieves(len(turns), self.top_k, self.few_bookmarks)
            out[b] = retrieval_weights(
                batch.step_turn[b],
                batch.mask[b],
                turns,
                keys,
                hash_embed(batch.final_texts[b], self.dim),
                self.top_k,
                self.tau,
                self.alpha,
                self.few_bookmarks,
            )
        self.retrieval_share = ranked / max(batch.batch_size, 1)
        return out

    def advantages(self, batch: EpisodeBatch) -> np.ndarray:
        loo = loo_advantages(batch.returns, batch.group_ids)
        return np.where(batch.mask, blend(loo, self.token_weights(batch), self.beta), 0.0)

    def summary(self) -> dict[str, Any]:
        """The memory's size, and the share of the last batch's rollouts whose bookmarks Eq. 13 ranked (at 0 the
        rule was plain LOO on that batch)."""
        return {"memory_size": len(self.memory), "retrieval_share": self.retrieval_share}

    def state_dict(self) -> dict[str, Any]:
        return {"memory": self.memory.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.memory.load_state_dict(state["memory"])
