"""Causal-role discovery of tabular VCBM: "Visual Causal-chain Bookmarking" (Selvakumar, 2026, arXiv:2610.24032),
Sec. IV-A2-3, Eq. 9-10; choices in docs/papers/vcbm.md ("Tabular VCBM").

Pure array code: counts of which state components changed under which action, the role of each
component, and the bookmark contexts (states seen immediately before a controlled change).
"""

from __future__ import annotations

from enum import IntEnum

import numpy as np


class Role(IntEnum):
    """Causal role of one state component; the integer is the code logged to TensorBoard."""

    STATIC = 0
    NOISE = 1
    CLOCK = 2
    CONTROLLED = 3

    def __str__(self) -> str:
        return self.name.lower()


def two_proportion_z(c0: np.ndarray, c1: np.ndarray, n0: int, n1: int) -> np.ndarray:
    """Eq. 10: z_i = |rho_i0 - rho_i1| / sqrt(p(1-p)(1/n0 + 1/n1)), p = (c_i0 + c_i1)/(n0 + n1).

    A component whose pooled change rate is 0 or 1 has no variance: z is 0 there (its rates are
    then equal under both actions, so no action dependence can be shown).
    """
    c0, c1 = np.asarray(c0, float), np.asarray(c1, float)
    if n0 == 0 or n1 == 0:
        return np.zeros_like(c0)
    pooled = (c0 + c1) / (n0 + n1)
    var = pooled * (1.0 - pooled) * (1.0 / n0 + 1.0 / n1)
    diff = np.abs(c0 / n0 - c1 / n1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(var > 0, diff / np.sqrt(np.where(var > 0, var, 1.0)), 0.0)


def classify_roles(
    change_counts: np.ndarray, action_counts: np.ndarray, eta_clock: float = 0.9, z_thresh: float = 4.0
) -> list[Role]:
    """Eq. 9, checked in this order: CLOCK if min_a rho_ia > eta_clock; STATIC if it never
    changed; CONTROLLED if Eq. 10's z_i > z_thresh; otherwise NOISE.

    change_counts: (n_components, 2) array of c[i, a]; action_counts: (2,) array of n[a].
    """
    c = np.asarray(change_counts, float)
    n0, n1 = int(action_counts[0]), int(action_counts[1])
    rho = c / np.maximum(np.asarray([n0, n1], float), 1.0)
    z = two_proportion_z(c[:, 0], c[:, 1], n0, n1)
    roles = []
    for i in range(len(c)):
        if n0 > 0 and n1 > 0 and rho[i].min() > eta_clock:
            roles.append(Role.CLOCK)
        elif c[i].sum() == 0:
            roles.append(Role.STATIC)
        elif z[i] > z_thresh:
            roles.append(Role.CONTROLLED)
        else:
            roles.append(Role.NOISE)
    return roles


class ChangeStatistics:
    """Running c[i, a], n[a], and the states seen immediately before each component changed."""

    def __init__(self, n_components: int, n_actions: int = 2) -> None:
        self.change_counts = np.zeros((n_components, n_actions), dtype=np.int64)
        self.action_counts = np.zeros(n_actions, dtype=np.int64)
        self.pre_change_states: list[set[tuple[int, ...]]] = [set() for _ in range(n_components)]

    @property
    def transitions(self) -> int:
        return int(self.action_counts.sum())

    def update(self, state: np.ndarray, action: int, next_state: np.ndarray) -> None:
        before, after = np.asarray(state).tolist(), np.asarray(next_state).tolist()
        self.action_counts[action] += 1
        key = tuple(before)
        for i, (u, v) in enumerate(zip(before, after)):
            if u != v:
                self.change_counts[i, action] += 1
                self.pre_change_states[i].add(key)

    def update_many(self, states: np.ndarray, actions: np.ndarray, next_states: np.ndarray) -> None:
        """`update` for N transitions at once: (N, n_components) states, (N,) actions."""
        states, next_states = np.asarray(states), np.asarray(next_states)
        actions = np.asarray(actions)
        changed = states != next_states
        for a in range(len(self.action_counts)):
            taken = actions == a
            self.action_counts[a] += int(taken.sum())
            self.change_counts[:, a] += changed[taken].sum(axis=0)
        for i in range(states.shape[1]):
            self.pre_change_states[i].update(map(tuple, states[changed[:, i]].tolist()))

    def roles(self, eta_clock: float, z_thresh: float) -> list[Role]:
        return classify_roles(self.change_counts, self.action_counts, eta_clock, z_thresh)


def bookmark_contexts(pre_change_states: list[set[tuple[int, ...]]], roles: list[Role]) -> set[tuple[int, ...]]:
    """Sec. IV-A3: contexts = projections on the controlled and clock components of every state
    seen immediately before a *controlled* component changed."""
    projection = context_components(roles)
    return {
        tuple(state[j] for j in projection)
        for i, role in enumerate(roles)
        if role is Role.CONTROLLED
        for state in pre_change_states[i]
    }


def context_components(roles: list[Role]) -> list[int]:
    """Indices that define a bookmark opportunity: controlled and clock components."""
    return [i for i, r in enumerate(roles) if r in (Role.CONTROLLED, Role.CLOCK)]


def key_components(roles: list[Role]) -> list[int]:
    """Indices of the value-estimation key: static, controlled and clock (noise marginalised out)."""
    return [i for i, r in enumerate(roles) if r is not Role.NOISE]
