"""Causal-role discovery of tabular VCBM: "Visual Causal-chain Bookmarking" (Selvakumar, 2026, arXiv:2610.24032),
Sec. IV-A2-3, Eq. 9-10; choices in docs/papers/vcbm.md ("Tabular VCBM").

Pure array code: counts of which state components changed under which action, the role of each
component, and the bookmark contexts (states seen immediately before a controlled change).

Three causal tests (`CAUSAL_TESTS`):

- "frequency", the paper's: a component is controlled when how *often* it changes depends on the
  action (Eq. 10).
- "frequency+value" (beyond the paper, docs/papers/vcbm.md "The value test"): also controlled when
  how often it *arrives at* some value v depends on the action. A decision that sets a value whose
  start is random (bsuite's umbrella: "take the umbrella" sets have_umbrella := 1 whatever it was)
  changes the component under either action equally often, half of the time from each side, so
  Eq. 10 sees equal rates and calls it noise; the arrival rate at each value tells the two apart.
- "frequency+value+context" (beyond the paper, docs/papers/vcbm.md "The context test"; the default): also
  controlled when, within one context (the values of the components the first two tests call static
  or controlled), how often it changes depends on the action (`context_change_z`). An effect whose
  sign depends on the context ("the flag is set when the action matches the context bit") averages
  out over the contexts, so both marginal tests call it noise.
"""

from __future__ import annotations

from enum import IntEnum
from statistics import NormalDist

import numpy as np
from scipy.special import log_ndtr, ndtri_exp
from scipy.stats import hypergeom

FREQUENCY = "frequency"  # the VCBM paper's Eq. 9-10
FREQUENCY_AND_VALUE = "frequency+value"  # Eq. 9-10 or `value_arrival_z` (beyond the paper)
FREQUENCY_VALUE_AND_CONTEXT = "frequency+value+context"  # or `context_change_z` (beyond the paper)
CAUSAL_TESTS = (FREQUENCY, FREQUENCY_AND_VALUE, FREQUENCY_VALUE_AND_CONTEXT)
# The one place the agents' default test is set (VCBMRolesConfig.causal_test reads it); the zoo's
# WatchRepair-v0 entries pin the paper's "frequency" so that Table II is the paper's setting.
DEFAULT_CAUSAL_TEST = FREQUENCY_VALUE_AND_CONTEXT
# The paper's settings of the role test (arXiv:2610.24032, Sec. V-A1), written once: `classify_roles`, tabular
# VCBM's config (algorithms/tabular/vcbm.py VCBMRolesConfig) and the vcbm_bookmark rule default to them.
ETA_CLOCK = 0.9  # a component that changes on more than this share of transitions under every action is a clock
Z_THRESH = 4.0  # Eq. 10's z above which a component's change rate depends on the action (controlled)
WARMUP_TRANSITIONS = 2000  # transitions counted before the first role test


def check_causal_test(causal_test: str) -> None:
    """One line naming a causal test that is none of `CAUSAL_TESTS`."""
    if causal_test not in CAUSAL_TESTS:
        raise ValueError(f"causal_test={causal_test!r}: expected one of {', '.join(CAUSAL_TESTS)}")


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


def exact_change_z(
    c0: np.ndarray, c1: np.ndarray, n0: np.ndarray, n1: np.ndarray, needed: np.ndarray | None = None
) -> np.ndarray:
    """Fisher's exact test of Eq. 10's question (rho_0 = rho_1) on each 2x2 table
    [[c0, n0 - c0], [c1, n1 - c1]], returned on Eq. 10's z scale; for tables too small for its normal
    approximation (one change under one action among 50 non-changes under the other is z = 7.1 there).

    Given the margins, the changes under action 0 are hypergeometric, X ~ Hypergeom(n0 + n1, c0 + c1, n0)
    (Fisher's exact test: R. A. Fisher, "Statistical Methods for Research Workers", 5th ed., 1934).
    Two-sided p = min(1, 2 min(P(X <= c0), P(X >= c0))), the doubled one-sided p; z = Phi^-1(1 - p / 2),
    the |z| with the same two-sided tail, computed from log p (scipy.special.ndtri_exp) so that a p
    below 1e-300 keeps a finite z. A table that cannot show a difference (no trial under one action,
    no change or only changes) has p = 1, z = 0.

    needed: the z each table must exceed to count (broadcast like the counts), or None. A tail holds the
    observed count, so P(X = c0) bounds both tails from below: where that one term already exceeds the
    tail z > needed requires, the table cannot pass, and its z is reported as the bound's,
    Phi^-1(1 - P(X = c0)) (between the exact z and `needed`), without summing the tail. A refresh tests
    every (context, noise component) table and nearly all of them are such; one term is O(1), a tail
    O(sqrt(n)) terms (bsuite's umbrella at length 100: ~40% of a run's time without the bound).
    """
    counts = np.broadcast_arrays(*(np.asarray(x, np.int64) for x in (c0, c1, n0, n1)))
    shape = counts[0].shape
    c0, c1, n0, n1 = (x.reshape(-1) for x in counts)
    trials, changed = n0 + n1, c0 + c1
    informative = (n0 > 0) & (n1 > 0) & (changed > 0) & (changed < trials)
    # the others get a harmless table (p = 1): scipy would warn on an empty population
    c0, trials, changed, n0 = (np.where(informative, x, fill) for x, fill in ((c0, 0), (trials, 2), (changed, 1), (n0, 1)))
    log_tail = np.zeros(len(c0))
    summed = informative.copy()
    if needed is not None:
        log_term = hypergeom.logpmf(c0, trials, changed, n0)
        hopeless = informative & (log_term >= log_ndtr(-np.broadcast_to(needed, shape).reshape(-1)))
        log_tail[hopeless], summed = log_term[hopeless], informative & ~hopeless
    args = (c0[summed], trials[summed], changed[summed], n0[summed])
    tail = np.minimum(hypergeom.cdf(*args), hypergeom.sf(args[0] - 1, *args[1:]))
    with np.errstate(divide="ignore"):
        log_tail[summed] = np.log(tail)
    tiny = np.zeros_like(summed)
    tiny[summed] = tail < 1e-300
    if tiny.any():  # scipy's log forms keep such a tail finite, but cost ~10x the plain ones: only here
        args = (c0[tiny], trials[tiny], changed[tiny], n0[tiny])
        log_tail[tiny] = np.minimum(hypergeom.logcdf(*args), hypergeom.logsf(args[0] - 1, *args[1:]))
    log_half_p = np.minimum(log_tail, -np.log(2.0))  # log(p / 2), p capped at 1
    return np.where(informative, np.maximum(-ndtri_exp(log_half_p), 0.0), 0.0).reshape(shape)


def context_change_z(change_counts: np.ndarray, action_counts: np.ndarray, z_thresh: float) -> tuple[np.ndarray, np.ndarray]:
    """Beyond the VCBM paper (docs/papers/vcbm.md, "The context test"): Eq. 10's question asked
    within each context.

    change_counts[s, i, a]: transitions under action a from context s on which component i changed;
    action_counts[s, a]: transitions under a from context s. Each context's table is tested exactly
    (`exact_change_z`; a table that cannot pass reports a bound on its z, below the threshold).
    Returns, per component, (the largest z over the contexts, the threshold it must pass): z_thresh
    raised (`family_threshold`, Bonferroni) for the number of contexts whose table can show a
    difference, so that a component's false-positive rate stays that of one test at z_thresh.
    A table left out has p = 1 given its margins and can never pass, so leaving it out keeps the
    family's rate (Tarone, "A modified Bonferroni method for discrete data", Biometrics 46, 1990).
    """
    c, n = np.asarray(change_counts, np.int64), np.asarray(action_counts, np.int64)
    if c.ndim != 3 or c.shape[2] != 2 or n.shape != (c.shape[0], 2):
        raise ValueError(
            f"change_counts {c.shape}, action_counts {n.shape}: expected (contexts, components, 2) and (contexts, 2)"
        )
    n0, n1 = n[:, None, 0], n[:, None, 1]
    changed = c.sum(axis=2)
    tested = ((n0 > 0) & (n1 > 0) & (changed > 0) & (changed < n0 + n1)).sum(axis=0)
    thresholds = np.array([family_threshold(z_thresh, int(m)) for m in tested])
    z = exact_change_z(c[..., 0], c[..., 1], n0, n1, needed=thresholds[None, :])
    return z.max(axis=0, initial=0.0), thresholds


def stratum_components(roles: list[Role]) -> list[int]:
    """The context test's strata: the components the marginal tests call static or controlled (those the
    bookmark key is built from, less the clock, whose every step would be a context of its own)."""
    return [i for i, r in enumerate(roles) if r in (Role.STATIC, Role.CONTROLLED)]


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


def _fitting_dtype(dtype: np.dtype, values: np.ndarray) -> np.dtype:
    """The smallest dtype that holds `dtype`'s values and `values` exactly (integers: by their range)."""
    if not values.size:
        return dtype
    if not (np.issubdtype(values.dtype, np.integer) or values.dtype == bool):
        return np.result_type(dtype, values.dtype)
    low, high = int(values.min()), int(values.max())
    return np.result_type(dtype, np.min_scalar_type(low), np.min_scalar_type(high))


class TransitionLog:
    """Every counted transition's start state, action and which components changed, for the context
    test (`context_change_z`): its contexts are projections on components that only the roles name,
    and the roles change at every refresh, so the transitions are kept, not counts. States are stored
    in the smallest integer dtype that holds the values seen (bsuite's umbrella: one byte a component).
    The counts per context are cached per choice of context components (the last `CACHED` choices)
    and extended by the transitions logged since, so a refresh that keeps the roles costs its new
    transitions only.
    """

    CACHED = 4

    def __init__(self, n_components: int, n_actions: int) -> None:
        self.n_components, self.n_actions, self.size = n_components, n_actions, 0
        self._states = np.zeros((0, n_components), dtype=np.uint8)  # widened to what is logged
        self._changed = np.zeros((0, n_components), dtype=bool)
        self._actions = np.zeros(0, dtype=np.min_scalar_type(max(n_actions - 1, 0)))
        self._counts: dict[tuple[int, ...], _ContextCounts] = {}

    def add(self, states: np.ndarray, actions: np.ndarray, changed: np.ndarray) -> None:
        """Log N transitions: (N, n_components) start states and changed flags, (N,) actions."""
        end = self.size + len(actions)
        dtype = _fitting_dtype(self._states.dtype, states)
        if end > len(self._states) or dtype != self._states.dtype:
            capacity = max(end, 2 * len(self._states), 1024)
            self._states = _grown(self._states, self.size, capacity, dtype)
            self._changed = _grown(self._changed, self.size, capacity, bool)
            self._actions = _grown(self._actions, self.size, capacity, self._actions.dtype)
        self._states[self.size : end] = states
        self._changed[self.size : end] = changed
        self._actions[self.size : end] = actions
        self.size = end

    def counts(self, components: list[int]) -> tuple[np.ndarray, np.ndarray]:
        """Per context (a distinct projection of the start state on `components`), n[s, a] (S, n_actions)
        and c[s, i, a] (S, n_components, n_actions), over every transition logged."""
        key = tuple(components)
        counts = self._counts.pop(key, None) or _ContextCounts(key, self.n_components, self.n_actions)
        self._counts[key] = counts  # most recently used last
        while len(self._counts) > self.CACHED:
            del self._counts[next(iter(self._counts))]
        window = slice(counts.rows, self.size)
        counts.add(self._states[window], self._actions[window], self._changed[window])
        counts.rows = self.size
        return counts.n[: len(counts.index)], counts.c[: len(counts.index)]


def _grown(array: np.ndarray, used: int, capacity: int, dtype) -> np.ndarray:
    """A copy of `array[:used]` in a new array of `capacity` rows of `dtype`."""
    out = np.zeros((capacity, *array.shape[1:]), dtype=dtype)
    out[:used] = array[:used]
    return out


class _ContextCounts:
    """`TransitionLog.counts` for one choice of context components: n[s, a], c[s, i, a] and the row of
    each context (`index`: projection -> s), over the log's first `rows` transitions."""

    def __init__(self, components: tuple[int, ...], n_components: int, n_actions: int) -> None:
        self.components, self.rows = list(components), 0
        self.index: dict[tuple[int, ...], int] = {}
        self.n = np.zeros((0, n_actions), dtype=np.int64)
        self.c = np.zeros((0, n_components, n_actions), dtype=np.int64)

    def add(self, states: np.ndarray, actions: np.ndarray, changed: np.ndarray) -> None:
        """Count N more transitions, each into the row of its context (a new context gets a new row)."""
        if not len(actions):
            return
        projected = states[:, self.components]
        seen, rank = np.unique(projected, axis=0, return_inverse=True)
        rows = np.array([self.index.setdefault(tuple(p), len(self.index)) for p in seen.tolist()], dtype=np.int64)
        if len(self.index) > len(self.n):
            extra = max(len(self.index), 2 * len(self.n)) - len(self.n)
            self.n = np.concatenate([self.n, np.zeros((extra, *self.n.shape[1:]), np.int64)])
            self.c = np.concatenate([self.c, np.zeros((extra, *self.c.shape[1:]), np.int64)])
        n_actions = self.n.shape[1]
        code = rows[rank.reshape(-1)] * n_actions + actions.astype(np.int64)
        size = len(self.n) * n_actions
        self.n += np.bincount(code, minlength=size).reshape(self.n.shape)
        for i in range(self.c.shape[1]):
            self.c[:, i] += np.bincount(code[changed[:, i]], minlength=size).reshape(self.n.shape)


class ChangeStatistics:
    """Running c[i, a], n[a], and the states seen immediately before each component changed; for
    the value test (`count_values`), per component and value v, the transitions under each action
    that started at v (`occupancy`) and that arrived at v from another value (`arrivals`); for the
    context test (`log_transitions`), every transition (`TransitionLog`)."""

    @classmethod
    def for_test(cls, n_components: int, n_actions: int, causal_test: str) -> ChangeStatistics:
        """Statistics that count what `causal_test` reads, and no more (the paper's test runs as fast as ever)."""
        check_causal_test(causal_test)
        return cls(
            n_components,
            n_actions,
            count_values=causal_test != FREQUENCY,
            log_transitions=causal_test == FREQUENCY_VALUE_AND_CONTEXT,
        )

    def __init__(self, n_components: int, n_actions: int = 2, count_values: bool = True, log_transitions: bool = False) -> None:
        self.count_values = count_values
        self.log = TransitionLog(n_components, n_actions) if log_transitions else None
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
        if self.log is not None:
            self.log.add(np.asarray([before]), np.asarray([action]), np.asarray([before]) != np.asarray([after]))
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
        if self.log is not None:
            self.log.add(states, actions, changed)
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

    def context_tests(self, components: list[int], z_thresh: float) -> list[tuple[float, float]]:
        """Per component, `context_change_z`'s (largest z, threshold) with contexts on `components`."""
        if self.log is None:
            raise ValueError("the context test reads the logged transitions: expected ChangeStatistics(log_transitions=True)")
        n, c = self.log.counts(components)
        z, thresholds = context_change_z(c, n, z_thresh)
        return list(zip(z.tolist(), thresholds.tolist()))

    def roles(self, eta_clock: float, z_thresh: float, causal_test: str) -> list[Role]:
        """Eq. 9 under `causal_test`: "frequency" (the paper's Eq. 10 alone), "frequency+value" or
        "frequency+value+context". The context test runs on the roles the first two give (its contexts
        are their static and controlled components, `stratum_components`) and can only turn their
        NOISE into CONTROLLED; with no such component there is no context to test within."""
        check_causal_test(causal_test)
        if causal_test == FREQUENCY_VALUE_AND_CONTEXT and self.log is None:
            raise ValueError(
                f"causal_test={causal_test!r} reads logged transitions: expected ChangeStatistics(log_transitions=True)"
            )
        by_value = None
        if causal_test != FREQUENCY:
            if not self.count_values:
                raise ValueError(f"causal_test={causal_test!r} reads value counts: expected ChangeStatistics(count_values=True)")
            by_value = self.value_controlled(z_thresh)
        roles = classify_roles(self.change_counts, self.action_counts, eta_clock, z_thresh, by_value)
        strata = stratum_components(roles)
        if causal_test == FREQUENCY_VALUE_AND_CONTEXT and strata and Role.NOISE in roles:
            tests = self.context_tests(strata, z_thresh)
            roles = [Role.CONTROLLED if r is Role.NOISE and z > t else r for r, (z, t) in zip(roles, tests)]
        return roles


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
