"""Tabular VCBM, read top to bottom: "Visual Causal-chain Bookmarking" (Selvakumar, 2026, arXiv:2610.24032),
Sec. IV-A; choices in docs/papers/vcbm.md ("Tabular VCBM").

1. Warm-up: act uniformly for `warmup_transitions`, counting which component changed under which
   action (`ChangeStatistics`).
2. Causal roles (Eq. 9-10, `classify_roles`), refreshed every `refresh_every` transitions. The
   causal test is a setting: `causal_test: frequency` is the paper's; "frequency+value" also finds
   decisions that set a value (docs/papers/vcbm.md, "The value test"); the default
   "frequency+value+context" also finds effects that depend on a context ("The context test").
   A run whose roles give no bookmark after the warm-up says so once (one stderr line) and logs
   `vcbm/no_bookmarks` = 1 at every refresh that finds none.
3. Bookmarks: states whose controlled+clock projection was seen just before a controlled change;
   key = static + controlled + clock components (noise marginalised out).
4. Welford estimate (Eq. 11) of the full return G per (key, action).
5. Policy at a bookmark: balanced forced sampling to `forced_visits` each, then the two-sample z-test
   gates greedy (z > z_action: residual epsilon_min) versus decaying epsilon-greedy. Elsewhere: uniform.

`vcbm-plus` (beyond the paper, at the end of this file) keeps 1-3 and replaces 4-5 at bookmarks:
control-variate estimates and a sequential two-sample test (ARCHITECTURE.md, "vcbm-plus").
"""

from __future__ import annotations

import math
import sys
from collections import defaultdict
from dataclasses import dataclass
from operator import itemgetter
from typing import Any, Callable

import numpy as np
from gymnasium import spaces

from algorithms.common.errors import ConfigError
from algorithms.common.validation import (
    AT_LEAST_ONE,
    NON_NEGATIVE,
    POSITIVE,
    UNIT,
    UNIT_POSITIVE,
    Range,
    Validated,
)
from algorithms.tabular.base import TabularAgent
from vcbm_gym.credit.causal_roles import (
    CAUSAL_TESTS,
    DEFAULT_CAUSAL_TEST,
    ETA_CLOCK,
    WARMUP_TRANSITIONS,
    Z_THRESH,
    ChangeStatistics,
    Role,
    bookmark_contexts,
    context_components,
    key_components,
)
from vcbm_gym.credit.welford import RegressionWelford, Welford, two_sample_z, z_statistic

# Shared by vcbm's and vcbm-plus's bookmark policies, which read them alike.
N_MIN = 8  # visits of each action before a bookmark decision may be greedy
EPSILON_MIN = 0.005  # the residual exploration of a decided bookmark


@dataclass
class VCBMRolesConfig(Validated):
    """Causal-role discovery (Eq. 9-10), shared by vcbm and vcbm-plus."""

    RANGES = {
        "warmup_transitions": NON_NEGATIVE,
        "refresh_every": AT_LEAST_ONE,
        "eta_clock": UNIT_POSITIVE,
        "z_thresh": NON_NEGATIVE,
    }  # 0 is allowed: every component that ever changes counts as controlled

    warmup_transitions: int = WARMUP_TRANSITIONS
    refresh_every: int = 500
    eta_clock: float = ETA_CLOCK
    z_thresh: float = Z_THRESH
    causal_test: str = DEFAULT_CAUSAL_TEST  # "frequency": the paper's Eq. 10 alone

    def __post_init__(self) -> None:
        if self.causal_test not in CAUSAL_TESTS:
            raise ConfigError(f"hyperparameter causal_test={self.causal_test!r}: expected one of {', '.join(CAUSAL_TESTS)}")
        super().__post_init__()


@dataclass
class VCBMConfig(VCBMRolesConfig):
    """Role discovery plus the paper's bookmark policy (Sec. IV-A4)."""

    RANGES = {
        "forced_visits": NON_NEGATIVE,
        "n_min": NON_NEGATIVE,
        "z_action": NON_NEGATIVE,
        "epsilon_start": UNIT,
        "epsilon_decay": UNIT_POSITIVE,
        "epsilon_min": UNIT,
    }

    forced_visits: int = 60
    n_min: int = N_MIN
    z_action: float = 2.0
    epsilon_start: float = 0.20
    epsilon_decay: float = 0.995
    epsilon_min: float = EPSILON_MIN


def exploration_epsilon(episode: int, cfg: VCBMConfig) -> float:
    """Sec. IV-A4: epsilon = max(epsilon_min, epsilon_start * epsilon_decay ** episode)."""
    return max(cfg.epsilon_min, cfg.epsilon_start * cfg.epsilon_decay**episode)


def balanced_action(n0: int, n1: int, rng: np.random.Generator) -> int:
    """Sec. IV-A4 forced sampling: the less-visited action; a tie is broken uniformly."""
    if n0 != n1:
        return 0 if n0 < n1 else 1
    return int(rng.integers(2))


def bookmark_action(w0: Welford, w1: Welford, episode: int, cfg: VCBMConfig, rng: np.random.Generator) -> int:
    """Sec. IV-A4: forced balanced sampling, then the z-gated (epsilon-)greedy choice."""
    if min(w0.n, w1.n) < cfg.forced_visits:
        return balanced_action(w0.n, w1.n, rng)
    significant = min(w0.n, w1.n) >= cfg.n_min and two_sample_z(w0, w1) > cfg.z_action
    epsilon = cfg.epsilon_min if significant else exploration_epsilon(episode, cfg)
    if rng.random() < epsilon or w0.mean == w1.mean:
        return int(rng.integers(2))
    return 0 if w0.mean > w1.mean else 1


def _projector(indices: list[int]) -> Callable[[list[int]], tuple[int, ...]]:
    """obs (as a list) -> the tuple of its components at `indices`."""
    if len(indices) == 1:
        (i,) = indices
        return lambda obs: (obs[i],)
    if not indices:
        return lambda obs: ()
    return itemgetter(*indices)


class UniformActions:
    """`int(rng.integers(n))` per call, drawn from `rng` in blocks: the same numbers in the same
    order, because `Generator.integers(n, size=k)` draws exactly what k single calls draw.

    Before anything else draws from `rng`, `sync()` rewinds it to where the single calls would have
    left it (restore the state saved before the block, redraw the part used).
    """

    def __init__(self, rng: np.random.Generator, n: int, block: int = 64) -> None:
        self.rng, self.n, self.block = rng, n, block
        self._values: list[int] = []
        self._used = 0
        self._state: dict | None = None

    def next(self) -> int:
        if self._used == len(self._values):
            self._state = self.rng.bit_generator.state
            self._values, self._used = self.rng.integers(self.n, size=self.block).tolist(), 0
        self._used += 1
        return self._values[self._used - 1]

    def sync(self) -> None:
        if self._used < len(self._values):
            self.rng.bit_generator.state = self._state
            if self._used:
                self.rng.integers(self.n, size=self._used)
        self._values, self._used = [], 0


class VCBMAgent(TabularAgent):
    """Transitions are buffered and counted in one numpy pass when a role refresh is due (the counts
    are read only then), so a step costs a list append; see `observe`. The uniform actions off the
    bookmarks come from `UniformActions` (same draws as one `rng.integers(2)` per step)."""

    config_class = VCBMConfig

    @property
    def rng(self) -> np.random.Generator:
        """The agent's generator, positioned as if every uniform action so far had been one call."""
        uniform = self.__dict__.get("_uniform")
        if uniform is not None:
            uniform.sync()
        return self._rng

    @rng.setter
    def rng(self, value: np.random.Generator) -> None:
        self._rng = value
        self._uniform = UniformActions(value, self.n_actions)

    @classmethod
    def unsupported(cls, observation_space, action_space, config) -> str | None:
        if isinstance(action_space, spaces.Discrete) and action_space.n != 2:
            return f"tabular VCBM tests two actions against each other (Eq. 10); the env has {action_space.n}"
        return super().unsupported(observation_space, action_space, config)

    def __init__(self, observation_space, action_space, config: VCBMConfig, seed: int, component_names=None) -> None:
        super().__init__(observation_space, action_space, config, seed, component_names)
        if self.n_actions != 2:
            raise ValueError(f"tabular VCBM tests two actions against each other; got {self.n_actions}")
        self.no_bookmarks_warned = False
        n_components = int(np.prod(observation_space.shape))
        self.stats = ChangeStatistics.for_test(n_components, self.n_actions, config.causal_test)
        self.roles: list[Role] | None = None
        self._roles_refreshed = False
        self._contexts: set[tuple[int, ...]] = set()
        self.context_indices: list[int] = []
        self._context_of = self._key_of = _projector([])
        self.transitions = 0
        self._pending: list[tuple[np.ndarray, int, np.ndarray]] = []  # transitions not yet in self.stats
        self._next_refresh = config.warmup_transitions
        self.values: defaultdict[tuple[tuple[int, ...], int], Welford] = defaultdict(Welford)
        self._episode_visits: list[tuple[tuple[int, ...], int]] = []
        self._episode_return = 0.0

    def record_pending(self) -> None:
        """Count the buffered transitions into `self.stats` (ChangeStatistics.update_many)."""
        if self._pending:
            states, actions, next_states = zip(*self._pending)
            n = len(actions)
            # concatenate + reshape, not np.stack: stack makes a view of every row first (~4x slower for 500 rows)
            states, next_states = np.concatenate(states).reshape(n, -1), np.concatenate(next_states).reshape(n, -1)
            self.stats.update_many(states, np.asarray(actions), next_states)
            self._pending = []

    def refresh_roles(self) -> None:
        """Re-run Eq. 9 on the counts so far and rebuild the bookmark contexts and the key."""
        self.record_pending()
        cfg = self.config
        self.set_roles(self.stats.roles(cfg.eta_clock, cfg.z_thresh, cfg.causal_test), self.stats.pre_change_states)

    def set_roles(self, roles: list[Role], pre_change_states: list[set[tuple[int, ...]]]) -> None:
        """Sec. IV-A3: the bookmark contexts and the value key under these roles."""
        self.roles = roles
        self._roles_refreshed = True
        self.context_indices = context_components(roles)
        self._context_of = _projector(self.context_indices)
        self._key_of = _projector(key_components(roles))
        self._contexts = bookmark_contexts(pre_change_states, roles)
        if not self._contexts and not self.no_bookmarks_warned:
            self.no_bookmarks_warned = True
            print(
                f"warning: {self.no_bookmarks_reason()}; it acts uniformly at random until a role refresh finds one "
                "(TensorBoard: vcbm/no_bookmarks)",
                file=sys.stderr,
                flush=True,
            )

    def no_bookmarks_reason(self) -> str:
        """Why the agent has no bookmark: no controlled component, or (rarely) none seen changing."""
        controlled = [n for n, r in zip(self.component_names, self.roles or []) if r is Role.CONTROLLED]
        what = f"no bookmark context (controlled: {', '.join(controlled)})" if controlled else "no controlled component"
        return f"{type(self).__name__} found {what} after the warm-up (causal_test={self.config.causal_test!r})"

    def act(self, obs: np.ndarray) -> int:
        if self._contexts:
            components = obs.tolist()
            if self._context_of(components) in self._contexts:
                return self.bookmark(self._key_of(components))
        return self._uniform.next()

    @property
    def contexts(self) -> set[tuple[int, ...]]:
        """The bookmark contexts: projections on `context_indices` (controlled and clock components)."""
        return self._contexts

    def random_actions(self, k: int) -> np.ndarray:
        """k calls of `act`'s non-bookmark branch at once (`Generator.integers` draws the same numbers
        for size=k as in k calls); for callers that know no bookmark comes in those k steps."""
        return self.rng.integers(self.n_actions, size=k)

    def record_episodes(self, episodes: list[tuple[np.ndarray, np.ndarray]]) -> None:
        """Count whole episodes, (states (T + 1, n), actions (T,)) each, into `self.stats`."""
        self.record_pending()
        if episodes:
            self.stats.update_many(
                np.concatenate([s[:-1] for s, _ in episodes]),
                np.concatenate([a for _, a in episodes]),
                np.concatenate([s[1:] for s, _ in episodes]),
            )

    def bookmark(self, key: tuple[int, ...]) -> int:
        """The action at a bookmark with value key `key`; the visit is credited at the episode's end."""
        action = bookmark_action(self.values[(key, 0)], self.values[(key, 1)], self.episode, self.config, self.rng)
        self._episode_visits.append((key, action))
        return action

    def observe(self, obs, action, reward, next_obs, done) -> None:
        self._pending.append((obs, action, next_obs))
        self._episode_return += reward
        self.transitions += 1
        if self.transitions >= self._next_refresh:
            self.refresh_roles()
            self._next_refresh += self.config.refresh_every

    def end_episode(self) -> dict[str, float]:
        scalars = {"vcbm/bookmark_visits": float(len(self._episode_visits)), **self.policy_scalars()}
        self.learn(self._episode_return)
        if self._roles_refreshed:  # roles and contexts change only at refreshes: logged then
            self._roles_refreshed = False
            scalars["vcbm/bookmark_contexts"] = float(len(self._contexts))
            scalars["vcbm/no_bookmarks"] = float(not self._contexts)
            scalars.update({f"roles/{name}": float(int(r)) for name, r in zip(self.component_names, self.roles)})
        super().end_episode()
        return scalars

    def policy_scalars(self) -> dict[str, float]:
        return {"vcbm/epsilon": exploration_epsilon(self.episode, self.config)}

    def learn(self, episode_return: float, first_obs: np.ndarray | None = None, last_obs: np.ndarray | None = None) -> None:
        """Eq. 11: every (key, action) visited this episode gets the episode's return G.
        (The episode's first and last observations are for vcbm-plus; the paper's agent ignores them.)"""
        for key_action in self._episode_visits:
            self.values[key_action].update(episode_return)
        self._episode_visits, self._episode_return = [], 0.0

    def summary(self) -> dict[str, Any]:
        self.record_pending()
        roles = self.roles or []
        return {
            "roles": {name: str(role) for name, role in zip(self.component_names, roles)},
            "bookmark_contexts": sorted(list(c) for c in self._contexts),
            "bookmark_values": {
                f"{list(key)}|a={action}": {"n": w.n, "mean": w.mean, "se": w.standard_error if w.n > 1 else None}
                for (key, action), w in sorted(self.values.items())
                if w.n > 0
            },
        }


# ---------------------------------------------------------------------------------------------------
# vcbm-plus (beyond the paper): the same roles, contexts and keys; a bookmark policy without the greedy trap.
#
# 1. Control variate: the return is regressed, per (key, action), on how much each NOISE component
#    moved during the episode (`RegressionWelford`). Noise components change at the same rate under
#    both actions (that is what Eq. 9 calls noise), so their pooled mean over all episodes is the
#    same whatever the agent does, and the regression-adjusted mean is an unbiased, lower-variance
#    estimate of E[G | key, action]. On WatchRepair the counters' penalties are ~10.8 of the return's
#    ~11 standard deviation; the adjusted estimate's is ~2.5.
# 2. Sequential test: after `n_min` balanced visits, the arm with the larger standard error is
#    sampled until the two-sample z-test on the adjusted estimates is decisive (z > z_decide), and
#    again whenever it stops being decisive. Only then is the choice greedy (residual epsilon_min).
#    A wrong-signed estimate can no longer freeze the greedy choice: an undecided key keeps sampling.


@dataclass
class VCBMPlusConfig(VCBMRolesConfig):
    """Role discovery as in vcbm; the bookmark policy of `bookmark_action_plus`."""

    RANGES = {"n_min": Range(2), "z_decide": POSITIVE, "epsilon_min": UNIT}  # two visits give a standard error

    n_min: int = N_MIN
    z_decide: float = 3.0
    epsilon_min: float = EPSILON_MIN


def bookmark_action_plus(
    arms: tuple[tuple[int, float, float], tuple[int, float, float]], cfg: VCBMPlusConfig, rng: np.random.Generator
) -> int:
    """vcbm-plus: arms are (visits, adjusted mean, standard error) of actions 0 and 1.

    Balanced visits until each action has n_min; while z = |mu_0 - mu_1| / sqrt(SE_0^2 + SE_1^2)
    <= z_decide, the action with the larger SE (on a tie the less-visited one); once decisive,
    greedy on the adjusted means with a residual epsilon_min.
    """
    (n0, m0, se0), (n1, m1, se1) = arms
    if min(n0, n1) < cfg.n_min:
        return balanced_action(n0, n1, rng)
    if z_statistic(m0, se0, m1, se1) <= cfg.z_decide:
        if se0 != se1:
            return 0 if se0 > se1 else 1
        return balanced_action(n0, n1, rng)
    if rng.random() < cfg.epsilon_min or m0 == m1:
        return int(rng.integers(2))
    return 0 if m0 > m1 else 1


class VCBMPlusAgent(VCBMAgent):
    config_class = VCBMPlusConfig

    def __init__(self, observation_space, action_space, config: VCBMPlusConfig, seed: int, component_names=None) -> None:
        if config.n_min < 2 or not config.z_decide > 0 or not 0 <= config.epsilon_min <= 1:
            raise ValueError(
                f"n_min={config.n_min}, z_decide={config.z_decide}, epsilon_min={config.epsilon_min}: "
                "expected n_min >= 2 (a standard error needs two visits), z_decide > 0 and 0 <= epsilon_min <= 1"
            )
        super().__init__(observation_space, action_space, config, seed, component_names)
        self.n_components = int(np.prod(observation_space.shape))
        self.adjusted: defaultdict[tuple[tuple[int, ...], int], RegressionWelford] = defaultdict(
            lambda: RegressionWelford(self.n_components)
        )
        self._moves_sum = np.zeros(self.n_components)  # sum over episodes of (last obs - first obs)
        self._episodes_seen = 0
        self._first_obs: np.ndarray | None = None
        self._last_obs: np.ndarray | None = None

    def observe(self, obs, action, reward, next_obs, done) -> None:
        if self._first_obs is None:
            self._first_obs = obs
        self._last_obs = next_obs
        super().observe(obs, action, reward, next_obs, done)

    def arm(self, key: tuple[int, ...], action: int) -> tuple[int, float, float]:
        """(visits, control-variate mean, SE) of one bookmark action; covariates: the noise components' moves."""
        noise = [i for i, role in enumerate(self.roles or []) if role is Role.NOISE]
        estimate = self.adjusted[(key, action)]
        if estimate.n == 0:
            return 0, 0.0, math.inf
        mean, se = estimate.adjusted(noise, self._moves_sum / max(self._episodes_seen, 1))
        return estimate.n, mean, se

    def bookmark(self, key: tuple[int, ...]) -> int:
        action = bookmark_action_plus((self.arm(key, 0), self.arm(key, 1)), self.config, self.rng)
        self._episode_visits.append((key, action))
        return action

    def policy_scalars(self) -> dict[str, float]:
        return {"vcbm/epsilon": self.config.epsilon_min}

    def learn(self, episode_return: float, first_obs: np.ndarray | None = None, last_obs: np.ndarray | None = None) -> None:
        """Welford (Eq. 11) as in vcbm, plus the co-moments of (component moves, G) per visited (key, action)."""
        first = self._first_obs if first_obs is None else first_obs
        last = self._last_obs if last_obs is None else last_obs
        moves = np.asarray(last, float) - np.asarray(first, float)
        self._moves_sum += moves
        self._episodes_seen += 1
        for key_action in self._episode_visits:
            self.adjusted[key_action].update(moves, episode_return)
        self._first_obs = self._last_obs = None
        super().learn(episode_return)

    def summary(self) -> dict[str, Any]:
        out = super().summary()
        out["adjusted_bookmark_values"] = {
            f"{list(key)}|a={action}": dict(zip(("n", "mean", "se"), self.arm(key, action)))
            for (key, action) in sorted(self.adjusted)
        }
        return out
