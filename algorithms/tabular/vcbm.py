"""Tabular VCBM (paper 000, Sec. IV-A; SPEC section 2), read top to bottom.

1. Warm-up: act uniformly for `warmup_transitions`, counting which component changed under which
   action (`ChangeStatistics`).
2. Causal roles (Eq. 9-10, `classify_roles`), refreshed every `refresh_every` transitions.
3. Bookmarks: states whose controlled+clock projection was seen just before a controlled change;
   key = static + controlled + clock components (noise marginalised out).
4. Welford estimate (Eq. 11) of the full return G per (key, action).
5. Policy at a bookmark: balanced forced sampling to `forced_visits` each, then the two-sample z-test
   gates greedy (z > z_action: residual epsilon_min) versus decaying epsilon-greedy. Elsewhere: uniform.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from operator import itemgetter
from typing import Any, Callable

import numpy as np

from algorithms.tabular.base import TabularAgent
from vcbm_gym.credit.causal_roles import (
    ChangeStatistics,
    Role,
    bookmark_contexts,
    context_components,
    key_components,
)
from vcbm_gym.credit.welford import Welford, two_sample_z


@dataclass
class VCBMConfig:
    warmup_transitions: int = 2000
    refresh_every: int = 500
    eta_clock: float = 0.9
    z_thresh: float = 4.0
    forced_visits: int = 60
    n_min: int = 8
    z_action: float = 2.0
    epsilon_start: float = 0.20
    epsilon_decay: float = 0.995
    epsilon_min: float = 0.005


def exploration_epsilon(episode: int, cfg: VCBMConfig) -> float:
    """Sec. IV-A4: epsilon = max(epsilon_min, epsilon_start * epsilon_decay ** episode)."""
    return max(cfg.epsilon_min, cfg.epsilon_start * cfg.epsilon_decay**episode)


def bookmark_action(w0: Welford, w1: Welford, episode: int, cfg: VCBMConfig, rng: np.random.Generator) -> int:
    """Sec. IV-A4: forced balanced sampling, then the z-gated (epsilon-)greedy choice."""
    if min(w0.n, w1.n) < cfg.forced_visits:
        if w0.n != w1.n:
            return 0 if w0.n < w1.n else 1
        return int(rng.integers(2))
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


class VCBMAgent(TabularAgent):
    """Transitions are buffered and counted in one numpy pass when a role refresh is due (the counts
    are read only then), so a step costs a list append; see `observe`."""

    config_class = VCBMConfig

    def __init__(self, observation_space, action_space, config: VCBMConfig, seed: int, component_names=None) -> None:
        super().__init__(observation_space, action_space, config, seed, component_names)
        if self.n_actions != 2:
            raise ValueError(f"tabular VCBM tests two actions against each other; got {self.n_actions}")
        n_components = int(np.prod(observation_space.shape))
        self.stats = ChangeStatistics(n_components, self.n_actions)
        self.roles: list[Role] | None = None
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
            self.stats.update_many(np.stack(states), np.asarray(actions), np.stack(next_states))
            self._pending = []

    def refresh_roles(self) -> None:
        """Re-run Eq. 9 on the counts so far and rebuild the bookmark contexts and the key."""
        self.record_pending()
        cfg = self.config
        self.set_roles(self.stats.roles(cfg.eta_clock, cfg.z_thresh), self.stats.pre_change_states)

    def set_roles(self, roles: list[Role], pre_change_states: list[set[tuple[int, ...]]]) -> None:
        """Sec. IV-A3: the bookmark contexts and the value key under these roles."""
        self.roles = roles
        self.context_indices = context_components(roles)
        self._context_of = _projector(self.context_indices)
        self._key_of = _projector(key_components(roles))
        self._contexts = bookmark_contexts(pre_change_states, roles)

    def act(self, obs: np.ndarray) -> int:
        if self._contexts:
            components = obs.tolist()
            if self._context_of(components) in self._contexts:
                return self.bookmark(self._key_of(components))
        return int(self.rng.integers(self.n_actions))

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
        visits = len(self._episode_visits)
        self.learn(self._episode_return)
        scalars = {
            "vcbm/epsilon": exploration_epsilon(self.episode, self.config),
            "vcbm/bookmark_visits": float(visits),
            "vcbm/bookmark_contexts": float(len(self._contexts)),
        }
        if self.roles is not None:
            scalars.update({f"roles/{name}": float(int(r)) for name, r in zip(self.component_names, self.roles)})
        super().end_episode()
        return scalars

    def learn(self, episode_return: float) -> None:
        """Eq. 11: every (key, action) visited this episode gets the episode's return G."""
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
