"""Tabular VCBM bookmarks as a credit rule: the tabular analogue of Eq. 13-14 of
"Visual Causal-chain Bookmarking" (Selvakumar, 2026, arXiv:2610.24032).

The causal-role classifier of tabular VCBM (Eq. 9-10, causal_roles.py) decides which steps are
bookmarks: a step whose state, projected on the controlled and clock components, equals a context
seen immediately before a controlled component changed (Sec. IV-A3). Per episode k with n_k
trained steps and per-episode advantage A_k = G_k - b (broadcast.py, same baseline options):

    w_t = 1 at bookmarks, alpha elsewhere;   w~_t = w_t * n_k / sum_s w_s;   A_{k,t} = A_k * w~_t

the retrieval weights of Eq. 13 replaced by an exact, uniform match (tabular VCBM needs no
similarity) and Eq. 14 at beta = 1. Renormalising keeps sum_t A_{k,t} = n_k A_k, the broadcast
sum; alpha = 1, an episode without bookmarks, or roles not yet known (before `warmup_transitions`)
give exactly the broadcast advantage. `advantage="given"` weights the caller's per-step
advantages instead, A_{k,t} = A^given_{k,t} * w~_t from `batch.extras["advantages"]` (B, T), e.g.
an SB3 critic's GAE: the Monte Carlo return's noise then stays with the critic (no sum promise).

Inputs: `batch.observations` (B, T, n_components), integer-valued, and `batch.actions` (B, T) in
{0, 1}. Transitions are consecutive trained steps (t, t+1); if `batch.extras["next_observations"]`
(B, T, n_components) is given, every trained step t -> next_observations[t] is counted instead.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces

import vcbm_gym.credit.options as options
from vcbm_gym.credit.base import ADVANTAGES, REWARDS, EpisodeBatch, RewardRule
from vcbm_gym.credit.broadcast import DEFAULT_BASELINE, BroadcastRule
from vcbm_gym.credit.causal_roles import (
    ETA_CLOCK,
    FREQUENCY,
    WARMUP_TRANSITIONS,
    Z_THRESH,
    ChangeStatistics,
    Role,
    bookmark_contexts,
    context_components,
)
from vcbm_gym.credit.redistribute import return_equivalent_rewards

FLOOR_WEIGHT = 0.05  # alpha: the weight of a step that is no bookmark, before renormalising (vcbm_blend's too)


def record_transitions(stats: ChangeStatistics, states: np.ndarray, actions: np.ndarray, next_states: np.ndarray) -> None:
    """ChangeStatistics.update for N transitions at once: c[i, a], n[a] and the pre-change states."""
    stats.update_many(states, actions, next_states)


def bookmark_weights(mask: np.ndarray, is_bookmark: np.ndarray, alpha: float) -> np.ndarray:
    """(B, T) w~_t: 1 at bookmarks, alpha elsewhere, renormalised to sum to n_k per episode; 0 off-mask."""
    raw = np.where(mask, np.where(is_bookmark, 1.0, alpha), 0.0)
    totals = raw.sum(axis=1, keepdims=True)
    return np.divide(raw * mask.sum(axis=1, keepdims=True), totals, out=np.zeros_like(raw), where=totals > 0)


class VCBMBookmarkRule(RewardRule):
    name = "vcbm_bookmark"
    may_emit = (REWARDS, ADVANTAGES)  # an advantage with a baseline option (see `emission`)
    batch_needs = ("observations", "actions")

    def __init__(
        self,
        alpha: float = FLOOR_WEIGHT,
        baseline: str = DEFAULT_BASELINE,
        advantage: str = "return",
        warmup_transitions: int = WARMUP_TRANSITIONS,
        eta_clock: float = ETA_CLOCK,
        z_thresh: float = Z_THRESH,
    ) -> None:
        self.alpha = options.number("alpha", alpha, hi=1, above=0)
        if advantage not in ("return", "given"):
            raise ValueError(f"advantage={advantage!r}: expected 'return' (G - baseline) or 'given' (extras['advantages'])")
        self.advantage = advantage
        self.warmup_transitions = options.integer("warmup_transitions", warmup_transitions, 0)
        self.eta_clock = options.number("eta_clock", eta_clock, 0, 1)
        self.z_thresh = options.number("z_thresh", z_thresh, above=0)
        self.returns = BroadcastRule(baseline)
        self.stats: ChangeStatistics | None = None
        self.roles: list[Role] | None = None
        self.contexts: set[tuple[int, ...]] = set()

    def needs(self) -> tuple[str, ...]:
        return self.batch_needs + (("extras['advantages']",) if self.advantage == "given" else ())

    def emission(self) -> str:
        """Rewards (the return-equivalent form of its advantages); advantages when it weights the caller's own."""
        return ADVANTAGES if self.advantage == "given" else self.emits

    @classmethod
    def from_env(cls, env: Any, **kwargs: Any) -> VCBMBookmarkRule:
        """The rule for `env`, refused with one line unless its states are factored and discrete
        (MultiDiscrete, Discrete, MultiBinary, or an integer Box) and it has two actions."""
        obs_space, act_space = env.observation_space, env.action_space
        discrete = isinstance(obs_space, (spaces.MultiDiscrete, spaces.Discrete, spaces.MultiBinary)) or (
            isinstance(obs_space, spaces.Box) and np.issubdtype(obs_space.dtype, np.integer)
        )
        two_actions = isinstance(act_space, spaces.Discrete) and act_space.n == 2 and act_space.start == 0
        if not (discrete and two_actions):
            raise ValueError(
                f"observation space {obs_space} and action space {act_space}: vcbm_bookmark's causal-role test expects "
                "integer state components (MultiDiscrete, Discrete, MultiBinary or an integer Box) and Discrete(2) actions"
            )
        return cls(**kwargs)

    def observe(self, batch: EpisodeBatch) -> None:
        self.returns.observe(batch)
        obs, actions = self._inputs(batch)
        nxt = batch.extras.get("next_observations")
        if nxt is not None:
            keep = batch.mask
            record_transitions(self.stats, obs[keep], actions[keep], self._integers(nxt)[keep])
        else:
            keep = batch.mask[:, :-1] & batch.mask[:, 1:]
            record_transitions(self.stats, obs[:, :-1][keep], actions[:, :-1][keep], obs[:, 1:][keep])
        self._refresh()

    def _refresh(self) -> None:
        if self.stats is not None and self.stats.transitions >= self.warmup_transitions:
            self.roles = self.stats.roles(self.eta_clock, self.z_thresh, FREQUENCY)  # the paper's Eq. 9-10
            self.contexts = bookmark_contexts(self.stats.pre_change_states, self.roles)

    def bookmarks(self, batch: EpisodeBatch) -> np.ndarray:
        """(B, T) bool: trained steps whose controlled+clock projection is a bookmark context."""
        if self.roles is None or not self.contexts:
            return np.zeros_like(batch.mask)
        obs, _ = self._inputs(batch)
        projected = obs[:, :, context_components(self.roles)]
        contexts = np.array(sorted(self.contexts), dtype=np.int64)
        hits = np.zeros(batch.mask.shape, dtype=bool)
        for context in contexts:  # few contexts (WatchRepair: one), many steps
            hits |= (projected == context).all(axis=-1)
        return hits & batch.mask

    def advantages(self, batch: EpisodeBatch) -> np.ndarray:
        weights = bookmark_weights(batch.mask, self.bookmarks(batch), self.alpha)
        if self.advantage == "given":
            given = np.asarray(batch.extras.get("advantages", np.full(batch.mask.shape, np.nan)), dtype=np.float64)
            if given.shape != batch.mask.shape or not np.isfinite(given[batch.mask]).all():
                raise ValueError(f'advantage="given" reads batch.extras["advantages"]: expected finite {batch.mask.shape} values')
            return np.where(batch.mask, given, 0.0) * weights
        return self.returns.episode_advantages(batch)[:, None] * weights

    def rewards(self, batch: EpisodeBatch) -> np.ndarray:
        """r'_t = A_t + (G - sum_s A_s) / n: the return-equivalent rewards of the bookmark advantages, which sum
        to each episode's return and put G - b on the bookmarks (vcbm_gym/credit/redistribute.py)."""
        return return_equivalent_rewards(self.advantages(batch), batch.mask, batch.returns)

    def _integers(self, values: Any) -> np.ndarray:
        arr = np.asarray(values)
        as_int = np.rint(arr).astype(np.int64)
        if not np.array_equal(as_int, arr):
            raise ValueError("vcbm_bookmark reads discrete states: expected integer-valued observations")
        return as_int

    def _inputs(self, batch: EpisodeBatch) -> tuple[np.ndarray, np.ndarray]:
        if batch.observations is None or batch.actions is None:
            raise ValueError("vcbm_bookmark needs batch.observations (B, T, n_components) and batch.actions (B, T)")
        obs, actions = self._integers(batch.observations), self._integers(batch.actions)
        if obs.ndim != 3 or obs.shape[:2] != batch.mask.shape or actions.shape != batch.mask.shape:
            raise ValueError(
                f"observations {obs.shape}, actions {actions.shape}: expected (B, T, n) and (B, T), (B, T) = {batch.mask.shape}"
            )
        if np.any(batch.mask & ((actions < 0) | (actions > 1))):
            raise ValueError("vcbm_bookmark's causal-role test compares two actions: expected actions in {0, 1}")
        if self.stats is None:
            self.stats = ChangeStatistics(obs.shape[2], 2)
        return obs, actions

    def state_dict(self) -> dict[str, Any]:
        stats = self.stats
        return {
            "returns": self.returns.state_dict(),
            "change_counts": None if stats is None else stats.change_counts.copy(),
            "action_counts": None if stats is None else stats.action_counts.copy(),
            "pre_change_states": None
            if stats is None
            else [
                np.array(sorted(s), dtype=np.int64).reshape(len(s), stats.change_counts.shape[0]) for s in stats.pre_change_states
            ],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.returns.load_state_dict(state["returns"])
        self.stats, self.roles, self.contexts = None, None, set()
        if state["change_counts"] is not None:
            counts = np.asarray(state["change_counts"], dtype=np.int64)
            self.stats = ChangeStatistics(counts.shape[0], counts.shape[1])
            self.stats.change_counts[:] = counts
            self.stats.action_counts[:] = np.asarray(state["action_counts"], dtype=np.int64)
            self.stats.pre_change_states = [set(map(tuple, np.asarray(s).tolist())) for s in state["pre_change_states"]]
            self._refresh()
