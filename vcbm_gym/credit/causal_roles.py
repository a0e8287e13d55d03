"""Causal-role discovery of tabular VCBM: "Visual Causal-chain Bookmarking" (Selvakumar, 2026, arXiv:2610.24032),
Sec. IV-A2-3, Eq. 9-10; choices in docs/papers/vcbm.md ("Tabular VCBM").

Pure array code: counts of which state components changed under which action, the role of each
component, and the bookmark contexts (states seen immediately before a controlled change).

Two causal tests (`CAUSAL_TESTS`):

- "frequency", the paper's: a component is controlled when how *often* it changes depends on the
  action (Eq. 10).
- "frequency+value" (beyond the paper, docs/papers/vcbm.md "The value test"): also controlled when
  how often it *arrives at* some value v depends on the action. A decision that sets a value whose
  start is random (bsuite's umbrella: "take the umbrella" sets have_umbrella := 1 whatever it was)
  changes the component under either action equally often, half of the time from each side, so
  Eq. 10 sees equal rates and calls it noise; the arrival rate at each value tells the two apart.
"""

from __future__ import annotations

from enum import IntEnum
from statistics import NormalDist

import numpy as np

FREQUENCY = "frequency"  # the VCBM paper's Eq. 9-10
FREQUENCY_AND_VALUE = "frequency+value"  # Eq. 9-10 or `value_arrival_z` (beyond the paper)
CAUSAL_TESTS = (FREQUENCY, FREQUENCY_AND_VALUE)
# The one place the agents' default test is set (VCBMRolesConfig.causal_test reads it); the zoo's
# WatchRepair-v0 entries pin the paper's "frequency" so that Table II is the paper's setting.
DEFAULT_CAUSAL_TEST = FREQUENCY_AND_VALUE
# The paper's settings of the role test (arXiv:2610.24032, Sec. V-A1), written once: `classify_roles`, tabular
# VCBM's config (algorithms/tabular/vcbm.py VCBMRolesConfig) and the vcbm_bookmark rule default to them.
ETA_CLOCK = 0.9  # a component that changes on more than this share of transitions under every action is a clock
Z_THRESH = 4.0  # Eq. 10's z above which a component's change rate depends on the action (controlled)
WARMUP_TRANSITIONS = 2000  # transitions counted before the first role test


class Role(IntEnum):
    """Causal role of one state component; the integer is the code logged to TensorBoard."""

    STATIC = 0
    NOISE = 1
    CLOCK = 2
    CONTROLLED = 3

    def __str__(self) -> str:
        return self.name.lower()


def two_proportion_z(c0: np.ndarray, c1: np.ndarray, n0: int | np.ndarray, n1: int | np.ndarray) -> np.ndarray:
    """Eq. 10: z_i = |rho_i0 - rho_i1| / sqrt(p(1-p)(1/n0 + 1/n1)), p = (c_i0 + c_i1)/(n0 + n1).

    A component whose pooled change rate is 0 or 1 has no variance: z is 0 there (its rates are
    then equal under both actions, so no action dependence can be shown); so is one without a
    trial under either action. n0 and n1 may be arrays (one pair of trial counts per entry).
    """
    c0, c1 = np.asarray(c0, float), np.asarray(c1, float)
    n0, n1 = np.broadcast_to(np.asarray(n0, float), c0.shape), np.broadcast_to(np.asarray(n1, float), c0.shape)
    tried = (n0 > 0) & (n1 > 0)
    n0, n1 = np.where(tried, n0, 1.0), np.where(tried, n1, 1.0)
    pooled = (c0 + c1) / (n0 + n1)
    var = pooled * (1.0 - pooled) * (1.0 / n0 + 1.0 / n1)
    diff = np.abs(c0 / n0 - c1 / n1)
    ok = tried & (var > 0)
    return np.where(ok, diff / np.sqrt(np.where(ok, var, 1.0)), 0.0)


def family_threshold(z_thresh: float, n_tests: int) -> float:
    """The z that `n_tests` two-sided tests must pass for their family to have the false-positive
    rate of one test at z_thresh (Bonferroni): Phi^-1(1 - (1 - Phi(z_thresh)) / n_tests)."""
    if n_tests <= 1:
        return float(z_thresh)
    normal = NormalDist()
    return normal.inv_cdf(1.0 - (1.0 - normal.cdf(z_thresh)) / n_tests)


def value_arrival_z(
    arrivals: np.ndarray, occupancy: np.ndarray, action_counts: np.ndarray, z_thresh: float
) -> tuple[float, float]:
    """Beyond the VCBM paper (docs/papers/vcbm.md, "The value test"): does the action change how
    often one component *arrives at* a value?

    arrivals[v, a]: transitions under action a on which the component was not at value v and then
    was; occupancy[v, a]: transitions under a that started at v. So the rate of arriving at v under a
    is arrivals[v, a] / (n[a] - occupancy[v, a]), compared between the two actions with Eq. 10's
    two-proportion z. Returns (the largest z over the values, the threshold it must pass): z_thresh
    raised (`family_threshold`) for the number of values that were ever arrived at, so that a
    component's false-positive rate stays that of the one frequency test at z_thresh.
    """
    arrivals, occupancy = np.asarray(arrivals, float), np.asarray(occupancy, float)
    if arrivals.size == 0:
        return 0.0, float(z_thresh)
    n = np.asarray(action_counts, float)
    exposure = n[None, :] - occupancy
    z = two_proportion_z(arrivals[:, 0], arrivals[:, 1], exposure[:, 0], exposure[:, 1])
    tested = int((arrivals.sum(axis=1) > 0).sum())
    return float(z.max()), family_threshold(z_thresh, tested)


def classify_roles(
    change_counts: np.ndarray,
    action_counts: np.ndarray,
    eta_clock: float = ETA_CLOCK,
    z_thresh: float = Z_THRESH,
    value_controlled: np.ndarray | None = None,
) -> list[Role]:
    """Eq. 9, checked in this order: CLOCK if min_a rho_ia > eta_clock; STATIC if it never
    changed; CONTROLLED if Eq. 10's z_i > z_thresh; otherwise NOISE.

    change_counts: (n_components, 2) array of c[i, a]; action_counts: (2,) array of n[a].
    value_controlled: (n_components,) bool, the value test's verdict ("frequency+value",
    `value_arrival_z`); a component it marks is CONTROLLED where Eq. 10 alone would say NOISE.
    None is the paper's test.
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
        elif z[i] > z_thresh or (value_controlled is not None and value_controlled[i]):
            roles.append(Role.CONTROLLED)
        else:
            roles.append(Role.NOISE)
    return roles


def _add_value_counts(table: dict[int, np.ndarray], values: np.ndarray, actions: np.ndarray, n_actions: int) -> None:
    """table[v][a] += the number of (value, action) pairs equal to (v, a)."""
    if not len(values):
        return
    # by rank among the values present, not by value: an integer Box may span billions
    seen, rank = np.unique(np.asarray(values, dtype=np.int64), return_inverse=True)
    codes = rank.reshape(-1) * n_actions + np.asarray(actions, dtype=np.int64)
    per_pair = np.bincount(codes, minlength=len(seen) * n_actions).reshape(len(seen), n_actions)
    for value, counts in zip(seen.tolist(), per_pair):
        row = table.get(value)
        if row is None:
            row = table[value] = np.zeros(n_actions, dtype=np.int64)
        row += counts


class ChangeStatistics:
    """Running c[i, a], n[a], and the states seen immediately before each component changed; for
    the value test (`count_values`), per component and value v, the transitions under each action
    that started at v (`occupancy`) and that arrived at v from another value (`arrivals`)."""

    def __init__(self, n_components: int, n_actions: int = 2, count_values: bool = True) -> None:
        self.count_values = count_values
        self.change_counts = np.zeros((n_components, n_actions), dtype=np.int64)
        self.action_counts = np.zeros(n_actions, dtype=np.int64)
        self.pre_change_states: list[set[tuple[int, ...]]] = [set() for _ in range(n_components)]
        self.occupancy: list[dict[int, np.ndarray]] = [{} for _ in range(n_components)]
        self.arrivals: list[dict[int, np.ndarray]] = [{} for _ in range(n_components)]

    @property
    def transitions(self) -> int:
        return int(self.action_counts.sum())

    def update(self, state: np.ndarray, action: int, next_state: np.ndarray) -> None:
        before, after = np.asarray(state).tolist(), np.asarray(next_state).tolist()
        self.action_counts[action] += 1
        key = tuple(before)
        n_actions = len(self.action_counts)
        for i, (u, v) in enumerate(zip(before, after)):
            if self.count_values:
                self.occupancy[i].setdefault(u, np.zeros(n_actions, dtype=np.int64))[action] += 1
            if u != v:
                self.change_counts[i, action] += 1
                self.pre_change_states[i].add(key)
                if self.count_values:
                    self.arrivals[i].setdefault(v, np.zeros(n_actions, dtype=np.int64))[action] += 1

    def update_many(self, states: np.ndarray, actions: np.ndarray, next_states: np.ndarray) -> None:
        """`update` for N transitions at once: (N, n_components) states, (N,) actions."""
        states, next_states = np.asarray(states), np.asarray(next_states)
        actions = np.asarray(actions)
        changed = states != next_states
        for a in range(len(self.action_counts)):
            taken = actions == a
            self.action_counts[a] += int(taken.sum())
            self.change_counts[:, a] += changed[taken].sum(axis=0)
        n_actions = len(self.action_counts)
        for i in range(states.shape[1]):
            moved = changed[:, i]
            self.pre_change_states[i].update(map(tuple, states[moved].tolist()))
            if not self.count_values:
                continue
            _add_value_counts(self.occupancy[i], states[:, i], actions, n_actions)
            _add_value_counts(self.arrivals[i], next_states[moved, i], actions[moved], n_actions)

    def value_tests(self, z_thresh: float) -> list[tuple[float, float]]:
        """Per component, `value_arrival_z`'s (largest z, threshold) on the counts so far."""
        out = []
        for occupancy, arrivals in zip(self.occupancy, self.arrivals):
            values = sorted(arrivals)
            n_actions = len(self.action_counts)
            arrived = np.array([arrivals[v] for v in values], dtype=np.int64).reshape(len(values), n_actions)
            started = np.array([occupancy.get(v, np.zeros(n_actions, np.int64)) for v in values]).reshape(len(values), n_actions)
            out.append(value_arrival_z(arrived, started, self.action_counts, z_thresh))
        return out

    def value_controlled(self, z_thresh: float) -> np.ndarray:
        """(n_components,) bool: the value test finds the action changes which value the component takes."""
        return np.array([z > threshold for z, threshold in self.value_tests(z_thresh)], dtype=bool)

    def roles(self, eta_clock: float, z_thresh: float, causal_test: str) -> list[Role]:
        """Eq. 9 under `causal_test`: "frequency" (the paper's Eq. 10 alone) or "frequency+value"."""
        if causal_test not in CAUSAL_TESTS:
            raise ValueError(f"causal_test={causal_test!r}: expected one of {', '.join(CAUSAL_TESTS)}")
        by_value = None
        if causal_test == FREQUENCY_AND_VALUE:
            if not self.count_values:
                raise ValueError(f"causal_test={causal_test!r} reads value counts: expected ChangeStatistics(count_values=True)")
            by_value = self.value_controlled(z_thresh)
        return classify_roles(self.change_counts, self.action_counts, eta_clock, z_thresh, by_value)


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
