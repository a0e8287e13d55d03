import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from algorithms.tabular.vcbm import VCBMConfig, bookmark_action, exploration_epsilon
from vcbm_gym.credit.causal_roles import (
    ChangeStatistics,
    Role,
    bookmark_contexts,
    classify_roles,
    key_components,
    two_proportion_z,
)
from vcbm_gym.credit.welford import Welford, two_sample_z


def test_two_proportion_z_by_hand():
    # p = 20/2000 = 0.01; sqrt(0.01 * 0.99 * (1/1000 + 1/1000)) = 0.0044497; |0.02 - 0| / that = 4.49466
    z = two_proportion_z(np.array([20.0]), np.array([0.0]), 1000, 1000)
    assert z[0] == pytest.approx(4.49466, abs=1e-4)
    # Equal rates give 0, and so does a component that never (or always) changed.
    assert two_proportion_z(np.array([100, 0, 1000]), np.array([100, 0, 1000]), 1000, 1000).tolist() == [0, 0, 0]


def test_classify_roles_recovers_the_watch_repair_structure():
    counts = np.array([[20, 0], [100, 95], [50, 52], [0, 0], [1000, 1000]])
    roles = classify_roles(counts, np.array([1000, 1000]))
    assert roles == [Role.CONTROLLED, Role.NOISE, Role.NOISE, Role.STATIC, Role.CLOCK]
    assert [str(r) for r in roles] == ["controlled", "noise", "noise", "static", "clock"]


def test_classify_roles_order_and_thresholds():
    n = np.array([100, 100])
    # Clock is checked first: both rates above 0.9, even though they differ a lot.
    assert classify_roles(np.array([[91, 100]]), n) == [Role.CLOCK]
    # One rate below eta_clock: no clock; the rates differ strongly, so controlled.
    assert classify_roles(np.array([[90, 10]]), n) == [Role.CONTROLLED]
    # z just under the threshold stays noise; a lower threshold flips it.
    counts = np.array([[20, 0]])
    z = two_proportion_z(counts[:, 0], counts[:, 1], 1000, 1000)[0]
    assert classify_roles(counts, np.array([1000, 1000]), z_thresh=z + 1e-6) == [Role.NOISE]
    assert classify_roles(counts, np.array([1000, 1000]), z_thresh=z - 1e-6) == [Role.CONTROLLED]


def test_change_statistics_and_bookmark_contexts():
    stats = ChangeStatistics(n_components=3)
    # components: (flag, noise, clock)
    stats.update(np.array([0, 0, 0]), 0, np.array([1, 0, 1]))
    stats.update(np.array([1, 0, 1]), 1, np.array([1, 1, 2]))
    stats.update(np.array([0, 4, 0]), 1, np.array([0, 4, 1]))
    assert stats.change_counts.tolist() == [[1, 0], [0, 1], [1, 2]]
    assert stats.action_counts.tolist() == [1, 2]
    roles = [Role.CONTROLLED, Role.NOISE, Role.CLOCK]
    # Context = projection on controlled + clock of the state seen just before the flag changed.
    assert bookmark_contexts(stats.pre_change_states, roles) == {(0, 0)}
    assert key_components([Role.CONTROLLED, Role.NOISE, Role.STATIC, Role.CLOCK]) == [0, 2, 3]


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(-100, 100), min_size=2, max_size=60))
def test_welford_matches_numpy(values):
    w = Welford()
    for v in values:
        w.update(v)
    assert w.n == len(values)
    assert w.mean == pytest.approx(np.mean(values), abs=1e-9)
    assert w.variance == pytest.approx(np.var(values, ddof=1), rel=1e-7, abs=1e-7)
    assert w.standard_error == pytest.approx(np.std(values, ddof=1) / math.sqrt(len(values)), rel=1e-6, abs=1e-7)


def test_two_sample_z_by_hand():
    a, b = Welford(), Welford()
    for v in (1.0, 3.0, 5.0):  # mean 3, M2 = 8, SE = sqrt(8 / 6)
        a.update(v)
    for v in (0.0, 0.0):  # mean 0, SE 0
        b.update(v)
    assert two_sample_z(a, b) == pytest.approx(3.0 / math.sqrt(8.0 / 6.0))
    assert two_sample_z(b, b) == 0.0
    c = Welford()
    for v in (2.0, 2.0):
        c.update(v)
    assert two_sample_z(b, c) == math.inf


def _welford(values):
    w = Welford()
    for v in values:
        w.update(v)
    return w


def test_bookmark_action_forces_the_less_visited_action_first():
    cfg, rng = VCBMConfig(), np.random.default_rng(0)
    assert bookmark_action(_welford([1.0] * 3), _welford([0.0] * 5), 0, cfg, rng) == 0
    assert bookmark_action(_welford([1.0] * 59), _welford([0.0] * 58), 0, cfg, rng) == 1


def test_bookmark_action_is_greedy_when_significant_and_explores_otherwise():
    cfg, rng = VCBMConfig(), np.random.default_rng(1)
    good = _welford(np.linspace(2.0, 5.0, 60))  # mean 3.5, SE ~0.12
    zero = _welford([0.0] * 60)
    picks = [bookmark_action(zero, good, 0, cfg, rng) for _ in range(4000)]
    # Significant: greedy with residual epsilon_min = 0.005 (a random action half of those times).
    assert np.mean(np.array(picks) == 0) == pytest.approx(cfg.epsilon_min / 2, abs=0.004)
    noisy = _welford(np.linspace(-40.0, 47.0, 60))  # mean 3.5, SE ~3.3: z ~ 1.06, not significant
    picks = [bookmark_action(zero, noisy, 0, cfg, rng) for _ in range(4000)]
    # Not significant at episode 0: epsilon = 0.2, so the lower mean is taken ~10% of the time.
    assert np.mean(np.array(picks) == 0) == pytest.approx(0.10, abs=0.02)
    assert exploration_epsilon(0, cfg) == 0.2
    assert exploration_epsilon(10_000, cfg) == cfg.epsilon_min
