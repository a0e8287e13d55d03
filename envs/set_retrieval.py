"""SetRetrieval: submit m candidate actions at once, get one reward for the set.

A synthetic analogue of the sponsored-search setting of "CASI: Credit Assignment via Set Intervention
for Agentic Retrieval" (docs/papers/casi.md, where the choices are). Each request has a pool of
P candidate retrieval actions and K information facets with importance weights w_k (Dirichlet(1),
so the best sets are worth about 1). Like the queries an LLM proposes, candidates are paraphrases
of a few *intents*: each of the T = `n_intents` intent types gets, per request, a profile that
covers facet k with probability `coverage_prob` and strength ~ U(coverage_range); each candidate
takes a uniformly random intent and covers that intent's facets with the strength scaled by
U(paraphrase_range). With c_ik candidate i's coverage of facet k and I(S) the intents present in
S, the exact expected value of a set (the "replay reference") is

    v(S) = sum_k w_k * (1 - prod_{i in S} (1 - c_ik))  +  sum_{(a, b) in complementary_intents,
                                                               a in I(S), b in I(S)} b_ab

- Redundancy: paraphrases, and more generally candidates covering the same facet, saturate it
  (diminishing returns), so a redundant item's leave-one-out marginal is near 0 while its
  singleton value is large.
- Complementarity: the intent pairs in `complementary_intents` (the same for every request, e.g.
  a "brand" and a "category" query) earn a bonus b_ab ~ U(bonus_range) per request only together
  (a multi-hop answer), so a member's singleton value misses the bonus and its leave-one-out
  marginal takes all of it; Shapley splits it.
With both, Singleton, leave-one-out, Banzhaf and Shapley credit all differ (m >= 3).

The training-time evaluator (the "snapshot", CASI's pr_filter analogue) scores any subset under
one frozen, imperfect model of the request: facet weights and intent-pair bonuses misestimated by
a log-normal factor exp(N(0, eval_bias_sd^2)) each, plus independent N(0, eval_noise_sd^2) noise
on every subset's score, drawn once per request so that re-scoring a subset gives the same
number (common conditions for all subsets); v0({}) = 0. Defaults, set before any credit rule was
measured: the per-subset noise sd 0.1 is about one typical single-item marginal (10% of a good
set's value); the bias sd 0.5 misjudges a facet's weight by a factor of 0.6-1.6 (one sd).

Observation: (P, 2K + T) per candidate: its facet coverage seen with N(0, feature_noise_sd^2)
noise (clipped to [0, 1]), the K facet weights, and the one-hot of its intent. The policy
submits m slot indices into the pool (`MultiDiscrete([P] * m)`). A repeated index is the same
retrieval twice: the set's value counts it once, so coalition values over the m *slots* stay
well defined (duplicate slots are perfectly redundant players). The one-step episode's reward is
the snapshot value of the set (what training sees); `info["set_value"]` is the reference value
(for evaluation only) and `info["coalition_values"]` the snapshot's 2^m table over slots, indexed
by bitmask (CASI's set intervention, for the CASI credit rule).

`TextSetRetrievalEnv` is the same task as text for an LLM: the prompt lists the candidates as
c0..c{P-1}; the answer is parsed for up to m candidate ids in order, and `info["item_spans"]` has
the (start, end) character span of each parsed item in the answer (map them to tokens with the
tokenizer's offsets, e.g. `vcbm_gym.credit.set_credit.token_span_ids`).

Both offer `snapshot()` / `restore(state, outcome_seed)` (envs/snapshot.py). The episode has no outcome noise
to redraw: the request is drawn at reset and the snapshot evaluator is frozen per request (re-scoring a set
gives the same number), so every outcome seed gives the same continuation.
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass
from typing import Any, Sequence

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from envs.snapshot import SnapshotMixin


class InvalidSetError(ValueError):
    """A set action of the wrong length or with an index outside the pool."""


@dataclass(frozen=True)
class SetRetrievalParams:
    pool_size: int = 10
    set_size: int = 5
    n_facets: int = 4
    n_intents: int = 6
    complementary_intents: tuple[tuple[int, int], ...] = ((0, 1), (2, 3))
    paraphrase_range: tuple[float, float] = (0.7, 1.0)
    coverage_prob: float = 0.35
    coverage_range: tuple[float, float] = (0.3, 0.9)
    bonus_range: tuple[float, float] = (0.1, 0.3)
    eval_noise_sd: float = 0.1
    eval_bias_sd: float = 0.5
    feature_noise_sd: float = 0.1

    def __post_init__(self) -> None:
        for name in ("pool_size", "set_size", "n_facets", "n_intents"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise ValueError(f"{name}={value!r}: expected an integer")
        for name in (
            "paraphrase_range",
            "coverage_prob",
            "coverage_range",
            "bonus_range",
            "eval_noise_sd",
            "eval_bias_sd",
            "feature_noise_sd",
        ):
            value = getattr(self, name)
            try:
                finite = bool(np.all(np.isfinite(np.asarray(value, dtype=float))))
            except (TypeError, ValueError):
                finite = False
            if not finite or isinstance(value, bool):
                raise ValueError(f"{name}={value!r}: expected finite real numbers")
        for name in ("paraphrase_range", "coverage_range", "bonus_range"):
            if len(getattr(self, name)) != 2:
                raise ValueError(f"{name}={getattr(self, name)!r}: expected a (low, high) pair")
        if not 1 <= self.set_size <= self.pool_size <= 16:
            raise ValueError(f"set_size={self.set_size}, pool_size={self.pool_size}: expected 1 <= set_size <= pool_size <= 16")
        if self.n_facets < 1 or self.n_intents < 1:
            raise ValueError(f"n_facets={self.n_facets}, n_intents={self.n_intents}: expected >= 1 each")
        for pair in self.complementary_intents:
            if len(pair) != 2 or pair[0] == pair[1] or not all(0 <= x < self.n_intents for x in pair):
                raise ValueError(f"complementary_intents entry {pair}: expected two different intents in [0, {self.n_intents})")
        lo, hi = self.coverage_range
        if not 0 <= lo <= hi < 1 or not 0 <= self.coverage_prob <= 1:
            raise ValueError(
                f"coverage_range={self.coverage_range}, coverage_prob={self.coverage_prob}: "
                "expected 0 <= lo <= hi < 1 and a probability"
            )
        if not 0 < self.paraphrase_range[0] <= self.paraphrase_range[1] <= 1:
            raise ValueError(f"paraphrase_range={self.paraphrase_range}: expected 0 < lo <= hi <= 1")
        if min(self.eval_noise_sd, self.eval_bias_sd, self.feature_noise_sd) < 0:
            raise ValueError(
                f"eval_noise_sd={self.eval_noise_sd!r}, eval_bias_sd={self.eval_bias_sd!r}, "
                f"feature_noise_sd={self.feature_noise_sd!r}: expected values >= 0"
            )
        if not 0 <= self.bonus_range[0] <= self.bonus_range[1]:
            raise ValueError(f"bonus_range={self.bonus_range}: expected 0 <= lo <= hi")

    @property
    def feature_dim(self) -> int:
        return 2 * self.n_facets + self.n_intents


def _set_values(
    masks: np.ndarray, weights: np.ndarray, coverage: np.ndarray, intents: np.ndarray, pairs: np.ndarray, bonus: np.ndarray
) -> np.ndarray:
    """v(S) for every bitmask in `masks` (vectorised over subsets)."""
    members = (masks[:, None] >> np.arange(len(coverage))[None, :]) & 1  # (n_masks, P)
    uncovered = np.exp(members @ np.log1p(-coverage))  # prod over members of (1 - c_ik)
    value = (1.0 - uncovered) @ weights
    present = members @ np.eye(int(max(intents.max(), pairs.max(initial=0))) + 1)[intents] > 0  # (n_masks, T)
    for (a, b), bonus_ab in zip(pairs, bonus):
        value += bonus_ab * (present[:, a] & present[:, b])
    return value


@dataclass(frozen=True)
class SetRequest:
    """One request: the true task, the frozen snapshot evaluator, and the policy's features."""

    weights: np.ndarray  # (K,)
    coverage: np.ndarray  # (P, K)
    intents: np.ndarray  # (P,) intent of each candidate
    pairs: np.ndarray  # (n_pairs, 2) complementary intents
    bonus: np.ndarray  # (n_pairs,)
    reference_table: np.ndarray  # (2^P,) exact v over pool subsets
    snapshot_table: np.ndarray  # (2^P,) training-time evaluator over pool subsets
    features: np.ndarray  # (P, 2K + T): noisy coverage, facet weights, intent one-hot

    @property
    def pool_size(self) -> int:
        return len(self.coverage)

    def item_mask(self, items: Sequence[int]) -> int:
        mask = 0
        for i in items:
            mask |= 1 << int(i)
        return mask

    def reference_value(self, items: Sequence[int]) -> float:
        """Exact expected value of the set of pool items (the replay reference)."""
        return float(self.reference_table[self.item_mask(items)])

    def snapshot_value(self, items: Sequence[int]) -> float:
        """Training-time (noisy, biased, but repeatable) evaluation of the set of pool items."""
        return float(self.snapshot_table[self.item_mask(items)])

    def slot_coalition_values(self, slots: Sequence[int], evaluator: str = "snapshot") -> np.ndarray:
        """(2^m,) value of every subset of the m submitted slots, indexed by bitmask over slots."""
        if evaluator not in ("snapshot", "reference"):
            raise ValueError(f"evaluator={evaluator!r}: expected 'snapshot' or 'reference'")
        table = self.snapshot_table if evaluator == "snapshot" else self.reference_table
        slots = np.asarray(slots, dtype=np.int64)
        slot_masks = np.arange(1 << len(slots))
        item_bits = (1 << slots)[None, :] * ((slot_masks[:, None] >> np.arange(len(slots))[None, :]) & 1)
        return table[np.bitwise_or.reduce(item_bits, axis=1)]


def sample_request(params: SetRetrievalParams, rng: np.random.Generator) -> SetRequest:
    """Draw one request (task, snapshot and features) from `rng`."""
    p, k, t = params.pool_size, params.n_facets, params.n_intents
    weights = rng.dirichlet(np.ones(k))
    covers = rng.random((t, k)) < params.coverage_prob
    profiles = np.where(covers, rng.uniform(*params.coverage_range, size=(t, k)), 0.0)
    intents = rng.integers(t, size=p)
    coverage = profiles[intents] * rng.uniform(*params.paraphrase_range, size=(p, k))
    pairs = np.array(params.complementary_intents, dtype=np.int64).reshape(-1, 2)
    bonus = rng.uniform(*params.bonus_range, size=len(pairs))
    masks = np.arange(1 << p)
    reference = _set_values(masks, weights, coverage, intents, pairs, bonus)
    snapshot_weights = weights * np.exp(params.eval_bias_sd * rng.standard_normal(k))
    snapshot_bonus = bonus * np.exp(params.eval_bias_sd * rng.standard_normal(len(bonus)))
    snapshot = _set_values(masks, snapshot_weights, coverage, intents, pairs, snapshot_bonus)
    snapshot = snapshot + params.eval_noise_sd * rng.standard_normal(len(masks))
    snapshot[0] = 0.0
    noisy_coverage = np.clip(coverage + params.feature_noise_sd * rng.standard_normal((p, k)), 0.0, 1.0)
    features = np.hstack([noisy_coverage, np.broadcast_to(weights, (p, k)), np.eye(t)[intents]])
    return SetRequest(weights, coverage, intents, pairs, bonus, reference, snapshot, features.astype(np.float32))


class SetRetrievalEnv(SnapshotMixin, gym.Env):
    """One-step set-action env: observe P candidates' features, submit m of them (module docstring)."""

    metadata = {"render_modes": ["ansi"], "render_fps": 1}
    snapshot_fields = ("request", "_done", "_last_items")

    def __init__(self, render_mode: str | None = None, **params: Any) -> None:
        self.params = SetRetrievalParams(**params)
        p, m = self.params.pool_size, self.params.set_size
        self.observation_space = spaces.Box(0.0, 1.0, shape=(p, self.params.feature_dim), dtype=np.float32)
        self.action_space = spaces.MultiDiscrete([p] * m, dtype=np.int64)
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode={render_mode!r}: expected one of {self.metadata['render_modes']}")
        self.render_mode = render_mode
        self.request: SetRequest | None = None
        self._done = False
        self._last_items: list[int] | None = None

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.request = sample_request(self.params, self.np_random)
        self._last_items = None
        self._done = False
        return self.request.features.copy(), {}

    def _check_slots(self, action: Any) -> np.ndarray:
        raw = np.asarray(action)
        m, p = self.params.set_size, self.params.pool_size
        bad = InvalidSetError(f"action {raw.tolist()!r}: expected {m} integer pool indices in [0, {p})")
        # a float like 1.5 is not an item: truncating it would submit a set the policy never chose
        if raw.dtype == bool or not (np.issubdtype(raw.dtype, np.integer) or np.issubdtype(raw.dtype, np.floating)):
            raise bad
        if np.issubdtype(raw.dtype, np.floating) and not np.all(np.isfinite(raw) & (raw == np.round(raw))):
            raise bad
        slots = raw.astype(np.int64).ravel()
        if slots.shape != (m,) or slots.min() < 0 or slots.max() >= p:
            raise bad
        return slots

    def step(self, action):
        if self.request is None:
            raise RuntimeError("step() before reset()")
        slots = self._check_slots(action)
        if self._done:
            raise RuntimeError("step() after the episode ended: call reset() first")
        self._done = True
        self._last_items = slots.tolist()
        return self.request.features.copy(), float(self.request.snapshot_value(slots)), True, False, self._info(slots)

    def _info(self, slots: np.ndarray) -> dict[str, Any]:
        return {
            "items": slots.tolist(),
            "n_unique": len(set(slots.tolist())),
            "set_value": self.request.reference_value(slots),
            "coalition_values": self.request.slot_coalition_values(slots, "snapshot"),
        }

    def redraw_outcome(self, rng: np.random.Generator) -> None:
        pass  # no outcome noise (module docstring)

    def snapshot_value(self, items: Sequence[int]) -> float:
        """The training-time evaluator on the current request (any subset of pool items)."""
        return self.request.snapshot_value(items)

    def reference_value(self, items: Sequence[int]) -> float:
        """The exact expected value on the current request (evaluation only)."""
        return self.request.reference_value(items)

    def render(self):
        if self.render_mode == "ansi" and self.request is not None:
            return describe_request(self.request, self.params.set_size) + (
                f"\nsubmitted: {self._last_items}" if self._last_items is not None else ""
            )
        return None


def describe_request(request: SetRequest, set_size: int) -> str:
    """The prompt of the text form: facets, candidates c0..c{P-1} and the answer format."""
    lines = ["Facets of the request (importance): " + ", ".join(f"f{k} ({w:.2f})" for k, w in enumerate(request.weights))]
    lines.append("Candidates:")
    k = len(request.weights)
    for i, row in enumerate(request.features):
        covered = ", ".join(f"f{f} ({row[f]:.2f})" for f in range(k) if row[f] > 0.05) or "nothing"
        lines.append(f"c{i} (intent {int(request.intents[i])}): covers {covered}")
    lines.append(
        f"Answer with a comma-separated list of exactly {set_size} candidate ids, e.g. "
        + ", ".join(f"c{i}" for i in range(set_size))
        + "."
    )
    return "\n".join(lines)


_ITEM = re.compile(r"\bc(\d+)\b", re.IGNORECASE)
TEXT_CHARSET = string.printable


def parse_items(answer: str, pool_size: int, set_size: int) -> tuple[list[int], list[tuple[int, int]]]:
    """The first `set_size` valid candidate ids in the answer, with their character spans."""
    items, spans = [], []
    for match in _ITEM.finditer(answer):
        index = int(match.group(1))
        if index < pool_size:
            items.append(index)
            spans.append(match.span())
            if len(items) == set_size:
                break
    return items, spans


class TextSetRetrievalEnv(SnapshotMixin, gym.Env):
    """The same task as text: the prompt describes the pool, the answer lists up to m ids.

    `info` after the step: "items" and "item_spans" (character spans in the answer), the
    reference "set_value", and "coalition_values" (snapshot, 2^m' over the m' parsed items).
    An answer with fewer than m ids submits only those; with none, the empty set (value 0).
    """

    metadata = {"render_modes": ["ansi"], "render_fps": 1}
    snapshot_fields = ("request", "_done", "_prompt")

    def __init__(self, render_mode: str | None = None, max_length: int = 4096, **params: Any) -> None:
        self.params = SetRetrievalParams(**params)
        self.observation_space = spaces.Text(max_length=max_length, charset=TEXT_CHARSET)
        self.action_space = spaces.Text(max_length=max_length, charset=TEXT_CHARSET)
        self.render_mode = render_mode
        self.request: SetRequest | None = None
        self._done = False
        self._prompt = ""

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.request = sample_request(self.params, self.np_random)
        self._prompt = describe_request(self.request, self.params.set_size)
        self._done = False
        return self._prompt, {}

    def step(self, action: str):
        if self.request is None:
            raise RuntimeError("step() before reset()")
        if not isinstance(action, str):
            raise InvalidSetError(f"action of type {type(action).__name__}: expected the answer text (str)")
        if self._done:
            raise RuntimeError("step() after the episode ended: call reset() first")
        self._done = True
        items, spans = parse_items(action, self.params.pool_size, self.params.set_size)
        info = {
            "items": items,
            "item_spans": spans,
            "set_value": self.request.reference_value(items),
            "coalition_values": self.request.slot_coalition_values(items, "snapshot"),
        }
        return self._prompt, float(self.request.snapshot_value(items)), True, False, info

    def snapshot_identity(self) -> tuple:
        return (self.params, self.observation_space.max_length)

    def redraw_outcome(self, rng: np.random.Generator) -> None:
        pass  # no outcome noise (module docstring)

    def render(self):
        return self._prompt if self.render_mode == "ansi" else None
