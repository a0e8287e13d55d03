"""VCBM's value test (causal_test "frequency+value", docs/papers/vcbm.md "The value test") on an
umbrella-like task, the case the paper's frequency test cannot see.

`UmbrellaLike` follows bsuite's umbrella_length: at reset `need` and `have` are drawn uniformly
(bsuite's need_umbrella and have_umbrella); the first action *sets* have := action; every step but
the last pays +-1 at random; the last pays +1 if have == need, else -1; `n_distractors` bits are
redrawn every step. Observation: [need, have, t, distractors...] as a MultiDiscrete, or (box=True)
as a (1, 3 + n) integer Box like bsuite's observation array. `in_place=True` writes every
observation into the same array it returned before: an agent that keeps one must copy it.

Because `have` starts at random, the first action changes it half of the time under either action:
the change *frequency* does not depend on the action (the paper's test says "noise"), but which
*value* it arrives at does.
"""

from __future__ import annotations

import json
import math

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces

from algorithms.tabular.vcbm import VCBMConfig
from algorithms.train import run
from vcbm_gym.credit.causal_roles import (
    DEFAULT_CAUSAL_TEST,
    FREQUENCY,
    FREQUENCY_AND_VALUE,
    FREQUENCY_VALUE_AND_CONTEXT,
    ChangeStatistics,
    Role,
    classify_roles,
    family_threshold,
    two_proportion_z,
    value_arrival_z,
)

ENV_ID = "VcbmTestUmbrellaLike-v0"


class UmbrellaLike(gym.Env):
    def __init__(self, length: int = 10, n_distractors: int = 20, box: bool = False, in_place: bool = False) -> None:
        self.length, self.n_distractors, self.box, self.in_place = length, n_distractors, box, in_place
        width = 3 + n_distractors
        if box:
            self.observation_space = spaces.Box(0, length, (1, width), dtype=np.int64)
        else:
            self.observation_space = spaces.MultiDiscrete([2, 2, length + 1] + [2] * n_distractors)
        self.action_space = spaces.Discrete(2)
        self.component_names = ("need", "have", "t") + tuple(f"distractor_{i}" for i in range(n_distractors))
        self._buffer = np.zeros(width, dtype=np.int64)

    def _obs(self) -> np.ndarray:
        values = np.concatenate([[self.need, self.have, self.t], self.np_random.integers(2, size=self.n_distractors)])
        out = self._buffer if self.in_place else np.empty_like(self._buffer)
        out[:] = values
        return out.reshape(1, -1) if self.box else out

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.need, self.have, self.t = int(self.np_random.integers(2)), int(self.np_random.integers(2)), 0
        self.first_action = None
        return self._obs(), {}

    def step(self, action):
        action = int(action)
        self.t += 1
        if self.t == 1:
            self.have, self.first_action = action, action
        done = self.t == self.length
        if done:
            reward = 1.0 if self.have == self.need else -1.0
        else:
            reward = float(2 * self.np_random.integers(2) - 1)
        info = {"first_decision_optimal": self.first_action == self.need} if done else {}
        return self._obs(), reward, done, False, info


if ENV_ID not in gym.registry:
    gym.register(ENV_ID, entry_point=UmbrellaLike)

# seeds and window of the learning tests; the window is the convergence criterion's 750 episodes
SEEDS = (0, 1, 2)
WINDOW = 750
# A policy that is right with probability q has a window correct rate with sd sqrt(q(1 - q) / 750);
# the random policy's (q = 0.5) is 0.018, so 4 sd around 0.5 is chance.
CHANCE_BAND = 4 * math.sqrt(0.25 / WINDOW)


def _train(tmp_path, name, seed, causal_test, length=10, episodes=3000, algo="vcbm", **env_kwargs):
    hyperparams = [f"env_kwargs={json.dumps({'length': length, **env_kwargs})}"]
    hyperparams += [f"causal_test={causal_test}"] if causal_test else []
    argv = ["--algo", algo, "--env", ENV_ID, "--seed", str(seed), "--log-dir", str(tmp_path / name), "--no-progress"]
    return run(argv + ["--max-episodes", str(episodes), "--hyperparams", *hyperparams])


# --- the statistic by hand ---------------------------------------------------------------------


def test_value_arrival_z_by_hand():
    # 1000 transitions per action; the component sat at 1 on 400 (action 0) and 600 (action 1) of them,
    # so 600 and 400 transitions could arrive at 1. Arrivals at 1: 0 under action 0, 30 under action 1.
    # p = 30 / 1000, z = |0 / 600 - 30 / 400| / sqrt(0.03 * 0.97 * (1/600 + 1/400)) = 6.8111
    arrivals = np.array([[0, 0], [0, 30]])  # values 0, 1
    occupancy = np.array([[600, 400], [400, 600]])
    z, threshold = value_arrival_z(arrivals, occupancy, np.array([1000, 1000]), 4.0)
    assert z == pytest.approx(0.075 / math.sqrt(0.03 * 0.97 * (1 / 600 + 1 / 400)), rel=1e-12)
    assert z == pytest.approx(6.8111, abs=1e-4)
    assert threshold == pytest.approx(4.0)  # only value 1 was ever arrived at: one test
    # Two values arrived at: the threshold is raised so the pair has one test's false-positive rate.
    _, two = value_arrival_z(np.array([[5, 5], [0, 30]]), occupancy, np.array([1000, 1000]), 4.0)
    assert two == pytest.approx(family_threshold(4.0, 2)) and 4.1 < two < 4.2


def test_family_threshold_keeps_one_tests_tail():
    from statistics import NormalDist

    tail = 1 - NormalDist().cdf(4.0)
    for n in (1, 2, 7, 50):
        assert 1 - NormalDist().cdf(family_threshold(4.0, n)) == pytest.approx(tail / n, rel=1e-6)


def test_two_proportion_z_with_per_entry_trials_matches_the_scalar_form():
    c0, c1, n0, n1 = np.array([3, 40, 0]), np.array([9, 41, 0]), np.array([100, 900, 0]), np.array([120, 700, 50])
    z = two_proportion_z(c0, c1, n0, n1)
    for i in range(2):
        assert z[i] == pytest.approx(two_proportion_z(c0[i : i + 1], c1[i : i + 1], int(n0[i]), int(n1[i]))[0])
    assert z[2] == 0.0  # no trial under action 0: nothing to compare


def record_random_play(env: gym.Env, stats: ChangeStatistics, n_episodes: int, seed: int) -> ChangeStatistics:
    """`stats` updated with the transitions of uniformly random play on `env`, as VCBM's warm-up gathers them."""
    rng = np.random.default_rng(seed)
    for episode in range(n_episodes):
        obs, _ = env.reset(seed=seed * 100_000 + episode)
        done = False
        while not done:
            action = int(rng.integers(2))
            nxt, _, done, _, _ = env.step(action)
            stats.update(obs, action, nxt)
            obs = nxt
    return stats


def _setting_statistics(n_episodes: int, length: int, seed: int) -> ChangeStatistics:
    """Counts of uniformly random play on UmbrellaLike."""
    return record_random_play(UmbrellaLike(length=length, n_distractors=4), ChangeStatistics(7), n_episodes, seed)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_value_test_finds_the_set_component_and_the_frequency_test_does_not(seed):
    stats = _setting_statistics(n_episodes=400, length=10, seed=seed)
    # have changes on ~half the first steps under either action: equal frequencies, Eq. 10 says noise
    assert stats.roles(0.9, 4.0, FREQUENCY) == [Role.STATIC, Role.NOISE, Role.CLOCK] + [Role.NOISE] * 4
    assert stats.roles(0.9, 4.0, FREQUENCY_AND_VALUE) == [Role.STATIC, Role.CONTROLLED, Role.CLOCK] + [Role.NOISE] * 4
    (z_have, threshold), distractor_tests = stats.value_tests(4.0)[1], stats.value_tests(4.0)[3:]
    assert z_have > 2 * threshold  # ~100 arrivals at each value, all under the matching action
    assert all(z < t for z, t in distractor_tests)


def test_value_counts_of_one_at_a_time_and_many_at_once_agree():
    rng = np.random.default_rng(7)
    states, nxt = rng.integers(-2, 3, size=(300, 3)), rng.integers(-2, 3, size=(300, 3))
    states[:, 2] *= 10**12  # values far apart (an integer Box may span billions): counted by value, not by range
    nxt[:, 2] *= 10**12
    actions = rng.integers(2, size=300)
    one, many = ChangeStatistics(3), ChangeStatistics(3)
    for s, a, n in zip(states, actions, nxt):
        one.update(s, int(a), n)
    many.update_many(states[:150], actions[:150], nxt[:150])
    many.update_many(states[150:], actions[150:], nxt[150:])
    for i in range(3):
        assert {v: c.tolist() for v, c in one.occupancy[i].items()} == {v: c.tolist() for v, c in many.occupancy[i].items()}
        assert {v: c.tolist() for v, c in one.arrivals[i].items()} == {v: c.tolist() for v, c in many.arrivals[i].items()}
        for v in np.unique(states[:, i]).tolist():
            taken = states[:, i] == v
            assert one.occupancy[i].get(v, np.zeros(2)).tolist() == [int((taken & (actions == a)).sum()) for a in (0, 1)]
            arrived = (states[:, i] != v) & (nxt[:, i] == v)
            assert one.arrivals[i].get(v, np.zeros(2)).tolist() == [int((arrived & (actions == a)).sum()) for a in (0, 1)]
    assert one.value_tests(4.0) == many.value_tests(4.0)


def test_the_paper_test_ignores_the_value_counts_and_classify_roles_stays_eq_9():
    counts, n = np.array([[30, 30], [0, 0], [1000, 1000]]), np.array([1000, 1000])
    assert classify_roles(counts, n) == [Role.NOISE, Role.STATIC, Role.CLOCK]
    # the value verdict can only promote what Eq. 9 would call noise: static and clock stay
    assert classify_roles(counts, n, value_controlled=np.array([True, True, True])) == [Role.CONTROLLED, Role.STATIC, Role.CLOCK]
    with pytest.raises(ValueError, match="count_values"):
        ChangeStatistics(3, count_values=False).roles(0.9, 4.0, FREQUENCY_AND_VALUE)


def test_the_default_includes_the_value_test_and_the_zoo_keeps_the_paper_test_on_watch_repair():
    from algorithms.common.config import zoo_hyperparams
    from algorithms.common.errors import ConfigError

    # the default adds the context test on top of the value test: see tests/test_context_roles.py
    assert VCBMConfig().causal_test == DEFAULT_CAUSAL_TEST == FREQUENCY_VALUE_AND_CONTEXT
    for algo in ("vcbm", "vcbm-plus"):
        assert zoo_hyperparams(algo, "WatchRepair-v0")["causal_test"] == FREQUENCY
    with pytest.raises(ConfigError, match="causal_test='value'"):
        VCBMConfig(causal_test="value")


# --- the agent on the task ---------------------------------------------------------------------


def test_vcbm_with_the_value_test_learns_the_umbrella_decision(tmp_path):
    for seed in SEEDS:
        summary = _train(tmp_path, f"value{seed}", seed, FREQUENCY_AND_VALUE)
        roles = summary["roles"]
        assert (roles["need"], roles["have"], roles["t"]) == ("static", "controlled", "clock")
        assert {roles[f"distractor_{i}"] for i in range(20)} == {"noise"}
        # the bookmark: t = 0, with either value of have (projection on have and t)
        assert summary["bookmark_contexts"] == [[0, 0], [1, 0]]
        # the convergence criterion (95% right over 750 episodes) is ~25 sd of the window rate above chance
        assert summary["converged"] is True and summary["final_correct_rate"] >= 0.95
        # warm-up 200 episodes, then 60 forced visits per action at each of the 4 keys (need, have) and a window
        assert summary["episodes_to_converge"] <= 2000


def test_vcbm_with_the_paper_test_finds_no_bookmark_and_says_so(tmp_path, capsys):
    rates = []
    for seed in SEEDS:
        summary = _train(tmp_path, f"freq{seed}", seed, FREQUENCY, episodes=1500)
        assert summary["roles"]["have"] == "noise"
        assert summary["bookmark_contexts"] == []
        rates.append(summary["final_correct_rate"])
    assert all(abs(rate - 0.5) < CHANCE_BAND for rate in rates)  # uniform play
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == len(SEEDS)  # one line per run
    assert "found no controlled component after the warm-up" in warnings[0] and "causal_test='frequency'" in warnings[0]


def test_no_bookmark_flag_is_logged_at_refreshes(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    _train(tmp_path, "flag_freq", 0, FREQUENCY, episodes=300)
    _train(tmp_path, "flag_value", 0, FREQUENCY_AND_VALUE, episodes=300)
    flags = {}
    for name in ("flag_freq", "flag_value"):
        events = EventAccumulator(str(tmp_path / name)).Reload()
        flags[name] = [e.value for e in events.Scalars("vcbm/no_bookmarks")]
    # warm-up 2,000 transitions = 200 episodes of 10 steps, then a refresh every 50 episodes
    assert flags["flag_freq"] == [1.0, 1.0, 1.0]
    assert flags["flag_value"] == [0.0, 0.0, 0.0]


def test_an_env_that_rewrites_its_observation_array_gets_the_same_roles(tmp_path):
    fresh = _train(tmp_path, "fresh", 0, FREQUENCY_AND_VALUE, episodes=400)
    rewritten = _train(tmp_path, "rewritten", 0, FREQUENCY_AND_VALUE, episodes=400, in_place=True)
    assert rewritten["roles"] == fresh["roles"]
    assert rewritten["roles"]["have"] == "controlled" and rewritten["roles"]["t"] == "clock"
    assert rewritten["bookmark_values"] == fresh["bookmark_values"]


@pytest.mark.parametrize("algo", ["vcbm", "vcbm-plus"])
def test_a_two_dimensional_integer_box_observation_is_flattened(tmp_path, algo):
    flat = _train(tmp_path, "flat", 1, FREQUENCY_AND_VALUE, episodes=400, algo=algo)
    boxed = _train(tmp_path, "boxed", 1, FREQUENCY_AND_VALUE, episodes=400, algo=algo, box=True)
    assert boxed["roles"] == flat["roles"]  # the env's 23 component names fit the flattened (1, 23) box
    assert boxed["roles"]["have"] == "controlled"
    assert boxed["bookmark_values"] == flat["bookmark_values"]


@pytest.mark.parametrize("algo", ["mc", "td", "rudder"])
def test_the_other_tabular_agents_run_the_two_dimensional_integer_box(tmp_path, algo):
    # a (1, 23) observation must key their tables as a flat tuple
    flat = _train(tmp_path, "flat", 2, None, episodes=40, algo=algo)
    boxed = _train(tmp_path, "boxed", 2, None, episodes=40, algo=algo, box=True)
    assert boxed["episodes_run"] == 40
    run_record = ("config_hash", "log_dir", "checksum", "hyperparams", "env_kwargs")  # what names the run, not what it learned
    learned = [k for k in flat if "time" not in k and k not in run_record]
    assert "q_table" in learned or "first_step_q_table" in learned
    assert {k: boxed[k] for k in learned} == {k: flat[k] for k in learned}
