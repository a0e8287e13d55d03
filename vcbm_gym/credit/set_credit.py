"""Set-level credit for m jointly chosen actions: CASI, "CASI: Credit Assignment via Set Intervention
for Agentic Retrieval"; formulas and choices in docs/papers/casi.md.

A policy emits a set N = {0..m-1} of actions and gets one reward v(N). Given the coalition
values v(S) for subsets S of N (CASI's "snapshot-grounded set intervention": the cached
retrievals recombined into subsets and scored under one frozen evaluator), each rule maps them to
per-action credit phi_i:

- Broadcast  phi_i = (v(N) - v({})) / m          (no within-set attribution; centred it is 0)
- Singleton  phi_i = v({i}) - v({})
- LOO        phi_i = v(N) - v(N minus {i})
- Banzhaf    phi_i = 2^-(m-1) sum_{S in N\\i} [v(S+i) - v(S)]
- Shapley    phi_i = sum_{S in N\\i} |S|!(m-|S|-1)!/m! [v(S+i) - v(S)]   (exact, m <= 10), or the
             mean marginal over sampled permutations with a stated standard error (m > 10).

Coalition values are given either as a table indexed by bitmask (entry `mask` holds v of the
actions whose bits are set, so table[0] = v({}) and table[2^m - 1] = v(N)) or as a callable on a
`frozenset` of action indices. Callables are evaluated once per subset and must be deterministic
for a fixed snapshot (common conditions for all subsets is what makes the marginals comparable).

Shaping (CASI Fig. 1): z = bounded, zero-sum version of phi; tokens of action i get
A^(g) + beta * z_i, tokens shared by all actions keep A^(g).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

import vcbm_gym.credit.options as options
from vcbm_gym.credit.base import CreditRule, EpisodeBatch

CoalitionValues = np.ndarray | Sequence[float] | Callable[[frozenset], float]
EXACT_SHAPLEY_MAX_M = 10
COALITION_RULES = ("broadcast", "singleton", "loo", "banzhaf", "shapley")


def coalition_table(values: CoalitionValues, m: int | None = None) -> np.ndarray:
    """(2^m,) table of v over all subsets, indexed by bitmask, from a table or a callable."""
    if callable(values):
        if m is None or m < 1:
            raise ValueError(f"m={m}: a callable value function needs the number of actions m >= 1")
        if m > 20:
            raise ValueError(f"m={m}: a full coalition table needs 2^m evaluations; expected m <= 20")
        return np.array([values(_subset(mask, m)) for mask in range(1 << m)], dtype=np.float64)
    table = np.asarray(values, dtype=np.float64)
    n = table.shape[0] if table.ndim == 1 else -1
    size = int(round(math.log2(n))) if n > 0 else -1
    if table.ndim != 1 or (1 << size) != n or size < 1:
        raise ValueError(f"coalition table of shape {table.shape}: expected a 1-D table of 2^m >= 2 values")
    if m is not None and size != m:
        raise ValueError(f"coalition table has 2^{size} entries: expected 2^{m} for m={m}")
    return table


def _subset(mask: int, m: int) -> frozenset:
    return frozenset(i for i in range(m) if mask >> i & 1)


def _marginal_pairs(m: int) -> tuple[np.ndarray, np.ndarray]:
    """(m, 2^(m-1)) bitmasks S (not containing i) and S + i, for every action i."""
    masks = np.arange(1 << m)
    without, with_i = [], []
    for i in range(m):
        s = masks[(masks >> i & 1) == 0]
        without.append(s)
        with_i.append(s | (1 << i))
    return np.array(without), np.array(with_i)


def _popcount(masks: np.ndarray) -> np.ndarray:
    return np.array([bin(int(x)).count("1") for x in masks.ravel()]).reshape(masks.shape)


def broadcast_credit(values: CoalitionValues, m: int | None = None) -> np.ndarray:
    """Equal split of v(N) - v({}): what Broadcast implies per action (zero once centred)."""
    table = coalition_table(values, m)
    m = int(math.log2(len(table)))
    return np.full(m, (table[-1] - table[0]) / m)


def singleton_credit(values: CoalitionValues, m: int | None = None) -> np.ndarray:
    """phi_i = v({i}) - v({})."""
    table = coalition_table(values, m)
    m = int(math.log2(len(table)))
    return table[1 << np.arange(m)] - table[0]


def loo_credit(values: CoalitionValues, m: int | None = None) -> np.ndarray:
    """phi_i = v(N) - v(N minus {i})."""
    table = coalition_table(values, m)
    m = int(math.log2(len(table)))
    full = (1 << m) - 1
    return table[full] - table[full ^ (1 << np.arange(m))]


def banzhaf_credit(values: CoalitionValues, m: int | None = None) -> np.ndarray:
    """phi_i = mean over the 2^(m-1) subsets S without i of v(S + i) - v(S)."""
    table = coalition_table(values, m)
    m = int(math.log2(len(table)))
    without, with_i = _marginal_pairs(m)
    return (table[with_i] - table[without]).mean(axis=1)


def shapley_exact(values: CoalitionValues, m: int | None = None) -> np.ndarray:
    """phi_i = sum_S |S|!(m-|S|-1)!/m! [v(S+i) - v(S)] over all S without i (2^m evaluations)."""
    table = coalition_table(values, m)
    m = int(math.log2(len(table)))
    if m > EXACT_SHAPLEY_MAX_M:
        raise ValueError(f"m={m}: exact Shapley is limited to m <= {EXACT_SHAPLEY_MAX_M}; use shapley_sampled")
    without, with_i = _marginal_pairs(m)
    sizes = _popcount(without)
    weights = np.array([math.factorial(s) * math.factorial(m - s - 1) for s in range(m)]) / math.factorial(m)
    return ((table[with_i] - table[without]) * weights[sizes]).sum(axis=1)


def shapley_sampled(
    value_fn: Callable[[frozenset], float],
    m: int,
    target_se: float,
    rng: np.random.Generator,
    pilot: int = 32,
    max_permutations: int = 100_000,
) -> tuple[np.ndarray, np.ndarray, int]:
    """Permutation-sampling Shapley with a requested standard error.

    Each uniformly random permutation gives every action one marginal v(pred + i) - v(pred); the
    Shapley value is their expectation. A pilot of `pilot` permutations estimates the per-action
    variance s_i^2 of the marginals; the total number of permutations is then
    n = ceil(max_i s_i^2 / target_se^2) (at least the pilot, at most `max_permutations`), so the
    Monte-Carlo standard error of every phi_i is about target_se. Each permutation's marginals sum
    to v(N) - v({}), so the estimate is exactly efficient. Values are cached per subset.

    Returns (phi, se, n): the estimate, the stated per-action standard error s_i / sqrt(n)
    (recomputed from all n permutations), and the number of permutations used.
    """
    if m < 1 or target_se <= 0 or pilot < 2:
        raise ValueError(f"m={m}, target_se={target_se}, pilot={pilot}: expected m >= 1, target_se > 0, pilot >= 2")
    cache: dict[int, float] = {}

    def value(mask: int) -> float:
        if mask not in cache:
            cache[mask] = float(value_fn(_subset(mask, m)))
        return cache[mask]

    def draw(n: int) -> np.ndarray:
        out = np.empty((n, m))
        for row in range(n):
            mask, previous = 0, value(0)
            for i in rng.permutation(m):
                mask |= 1 << int(i)
                current = value(mask)
                out[row, i] = current - previous
                previous = current
        return out

    marginals = draw(pilot)
    var = marginals.var(axis=0, ddof=1).max()
    n = int(min(max_permutations, max(pilot, math.ceil(var / target_se**2))))
    if n > pilot:
        marginals = np.vstack([marginals, draw(n - pilot)])
    se = marginals.std(axis=0, ddof=1) / math.sqrt(n)
    return marginals.mean(axis=0), se, n


def shapley(
    values: CoalitionValues, m: int | None = None, target_se: float = 1e-3, rng: np.random.Generator | None = None
) -> np.ndarray:
    """Exact Shapley for m <= 10 (or any table), permutation sampling for a callable with m > 10."""
    if callable(values) and m is not None and m > EXACT_SHAPLEY_MAX_M:
        return shapley_sampled(values, m, target_se, rng if rng is not None else np.random.default_rng())[0]
    return shapley_exact(values, m)


def set_credit(rule: str, values: CoalitionValues, m: int | None = None) -> np.ndarray:
    """Per-action credit of one of COALITION_RULES."""
    funcs = {
        "broadcast": broadcast_credit,
        "singleton": singleton_credit,
        "loo": loo_credit,
        "banzhaf": banzhaf_credit,
        "shapley": shapley,
    }
    if rule not in funcs:
        raise ValueError(f"credit rule {rule!r}: expected one of {', '.join(COALITION_RULES)}")
    return funcs[rule](values, m)


SHAPING_MODE = "project"  # zero_sum_shaping's and CASI's default: the Euclidean projection
SHAPING_MODES = ("project", "scale")


def zero_sum_shaping(credit: np.ndarray, bound: float, mode: str = SHAPING_MODE) -> np.ndarray:
    """Bounded zero-sum offsets z from per-action credit (CASI's bounded zero-sum shaping).

    Centre within the set (z = phi - mean phi), then bound |z_i| <= bound while keeping sum z = 0:
    - "project" (default): the Euclidean projection of phi onto {sum z = 0, |z_i| <= bound}, i.e.
      z_i = clip(phi_i - lam, -bound, bound) with the shift lam found by bisection so that the
      clipped values sum to 0. Credits already inside the bound after centring are unchanged;
      clipping an outlier re-centres the others rather than shrinking them.
    - "scale": z = (phi - mean) * min(1, bound / max|phi - mean|), which keeps the ratios.
    Both keep the order of the actions (clipping can tie actions at the bound).
    """
    phi = np.asarray(credit, dtype=np.float64)
    if phi.ndim != 1 or bound <= 0:
        raise ValueError(f"credit of shape {phi.shape}, bound={bound}: expected a 1-D credit vector and bound > 0")
    z = phi - phi.mean()
    if np.abs(z).max(initial=0.0) <= bound:
        return z
    if mode == "scale":
        return z * (bound / np.abs(z).max())
    if mode not in SHAPING_MODES:
        raise ValueError(f"mode={mode!r}: expected one of {', '.join(SHAPING_MODES)}")
    low, high = phi.min() - bound, phi.max() + bound  # total(low) >= 0 >= total(high)
    for _ in range(100):
        lam = 0.5 * (low + high)
        if np.clip(phi - lam, -bound, bound).sum() > 0:
            low = lam
        else:
            high = lam
    z = np.clip(phi - 0.5 * (low + high), -bound, bound)
    free = np.abs(z) < bound  # absorb the bisection's last ~1e-15 of residual where it cannot break the bound
    if free.any():
        z[free] -= z.sum() / free.sum()
    return z


def shape_step_advantages(base_advantage: np.ndarray | float, span_ids: np.ndarray, z: np.ndarray, beta: float) -> np.ndarray:
    """A_t = A^(g) + beta * z[span_ids[t]] on steps (tokens) of action span_ids[t] >= 0; shared
    steps (span id -1) keep A^(g). `base_advantage` is a scalar or per-step array."""
    span_ids = np.asarray(span_ids, dtype=np.int64)
    z = np.asarray(z, dtype=np.float64)
    if span_ids.size and span_ids.max(initial=-1) >= len(z):
        raise ValueError(f"span id {span_ids.max()} out of range: expected -1 or an action index < {len(z)}")
    offset = np.where(span_ids >= 0, z[np.clip(span_ids, 0, None)], 0.0) if len(z) else np.zeros(span_ids.shape)
    return np.broadcast_to(np.asarray(base_advantage, float), span_ids.shape) + beta * offset


def token_span_ids(token_offsets: np.ndarray, char_spans: Sequence[tuple[int, int]]) -> np.ndarray:
    """Map character spans of the m items to tokens: (T, 2) offsets -> (T,) item index or -1.

    A token belongs to item i if its character range overlaps item i's span (first match wins);
    tokens outside every span (separators, reasoning) are shared: -1.
    """
    offsets = np.asarray(token_offsets, dtype=np.int64).reshape(-1, 2)
    ids = np.full(len(offsets), -1, dtype=np.int64)
    for i, (start, end) in reversed(list(enumerate(char_spans))):
        overlap = (offsets[:, 0] < end) & (offsets[:, 1] > start)
        ids[overlap] = i
    return ids


class CASIShapingRule(CreditRule):
    """CASI: A_t = A^(g) + beta * z_i on the steps of action i (the CASI paper, Fig. 1).

    Steps are tokens (or env steps); `batch.step_turn[b, t]` is the index i of the action that
    step t belongs to, -1 for shared steps. A^(g) is the base rule's advantage (`base`, default
    "loo"), broadcast over the episode. The coalition values of episode b come from
    `batch.extras["coalition_values"][b]` (a 2^m table by bitmask, or a callable on frozensets of
    action indices), or, if absent, from `evaluator(batch, b)` returning one of those. m is the
    table size, else `batch.extras["n_actions"][b]`, else max(step_turn[b]) + 1. `credit` selects
    the coalition rule (default Shapley; the others give the paper's comparison rules).
    """

    name = "casi"
    batch_needs = ("extras['coalition_values']",)
    info_needs = ("coalition_values",)

    def __init__(
        self,
        beta: float = 1.0,
        bound: float = 1.0,
        base: str = "loo",
        credit: str = "shapley",
        shaping_mode: str = SHAPING_MODE,
        evaluator: Callable[[EpisodeBatch, int], CoalitionValues] | None = None,
        rule_factory: Callable[[str], CreditRule] | None = None,
    ) -> None:
        """`rule_factory` builds the base rule by name; `make_rule` passes its own (this module names no rule table)."""
        if credit not in COALITION_RULES:
            raise ValueError(f"credit={credit!r}: expected one of {', '.join(COALITION_RULES)}")
        if rule_factory is None:
            raise ValueError("rule_factory=None: build casi with vcbm_gym.credit.registry.make_rule('casi', ...)")
        if not isinstance(base, str) or base == self.name:
            raise ValueError(f"base={base!r}: expected a broadcast-style base rule such as 'loo' or 'grpo'")
        try:
            self.base_rule = rule_factory(base)
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"base={base!r}: expected a broadcast-style base rule such as 'loo' or 'grpo'") from None
        if shaping_mode not in SHAPING_MODES:
            raise ValueError(f"shaping_mode={shaping_mode!r}: expected one of {', '.join(SHAPING_MODES)}")
        self.beta = options.number("beta", beta)
        self.bound = options.number("bound", bound, above=0)
        self.base, self.credit = base, credit
        self.shaping_mode, self.evaluator = shaping_mode, evaluator

    def needs(self) -> tuple[str, ...]:
        own = () if self.evaluator is not None else self.batch_needs
        return own + tuple(n for n in self.base_rule.needs() if n not in own)

    def advantages(self, batch: EpisodeBatch) -> np.ndarray:
        advantages = self.base_rule.advantages(batch)
        sources: Any = batch.extras.get("coalition_values")
        if sources is None and self.evaluator is None:
            raise ValueError("CASI needs batch.extras['coalition_values'] or an evaluator(batch, b)")
        n_actions = batch.extras.get("n_actions")
        for b in range(batch.batch_size):
            values = sources[b] if sources is not None else self.evaluator(batch, b)
            m = (
                None
                if not callable(values)
                else (int(n_actions[b]) if n_actions is not None else int(batch.step_turn[b].max()) + 1)
            )
            table = coalition_table(values, m)
            z = zero_sum_shaping(set_credit(self.credit, table), self.bound, self.shaping_mode)
            steps = batch.mask[b]
            advantages[b, steps] = shape_step_advantages(advantages[b, steps], batch.step_turn[b, steps], z, self.beta)
        return advantages
