"""VCBM's context test (causal_test "frequency+value+context", the default; docs/papers/vcbm.md "The context
test") and ContextMatch-v0 (envs/context_match.py), the task it exists for: a flag that the first
action sets where it matches a static context bit. Averaged over the bit, the flag changes, and arrives at 1,
equally often under both actions, so the paper's Eq. 10 and the value test call it noise and VCBM plays at
random; within each context the action decides it.
"""

from __future__ import annotations

import json
import math
from statistics import NormalDist

import gymnasium as gym
import numpy as np
import pytest
from scipy.stats import fisher_exact, norm

import vcbm_gym  # noqa: F401 (registers ContextMatch-v0)
from algorithms import compare
from algorithms.common.errors import ConfigError
from algorithms.tabular.vcbm import VCBMConfig
from algorithms.train import run
from envs.context_match import ContextMatchEnv
from tests.test_vcbm_value_test import record_random_play
from vcbm_gym.credit.causal_roles import (
    CAUSAL_TESTS,
    DEFAULT_CAUSAL_TEST,
    FREQUENCY,
    FREQUENCY_AND_VALUE,
    FREQUENCY_VALUE_AND_CONTEXT,
    ChangeStatistics,
    Role,
    TransitionLog,
    context_change_z,
    exact_change_z,
    family_threshold,
    stratum_components,
    two_proportion_z,
)

ENV_ID = "ContextMatch-v0"
SEEDS = (0, 1, 2)
WINDOW = 750  # the convergence criterion's window
# A policy right with probability q has a window correct rate with sd sqrt(q (1 - q) / 750): 0.018 at chance,
# so 4 sd around 0.5 is chance.
CHANCE_BAND = 4 * math.sqrt(0.25 / WINDOW)


def _train(tmp_path, name, seed, causal_test=None, env=ENV_ID, episodes=3000, algo="vcbm"):
    """One run through the CLI's own entry; causal_test None is the agent's default."""
    argv = ["--algo", algo, "--env", env, "--seed", str(seed), "--log-dir", str(tmp_path / name), "--no-progress"]
    argv += ["--max-episodes", str(episodes)]
    return run(argv + (["--hyperparams", f"causal_test={causal_test}"] if causal_test else []))


# --- the exact test, by hand and against scipy ----------------------------------------------------------


def test_exact_change_z_by_hand():
    # 3 of 3 changed under action 0, 0 of 3 under action 1: P(X >= 3) for X ~ Hypergeom(6, 3, 3) is 1 / C(6, 3),
    # so the two-sided p is 2 / 20 and z = Phi^-1(1 - 0.05) = 1.6449
    assert exact_change_z(3, 0, 3, 3) == pytest.approx(NormalDist().inv_cdf(0.95), rel=1e-9)
    # One change on the one transition under action 0, none on 50 under action 1: Eq. 10's normal approximation
    # says z = 7.14, far past z_thresh = 4; the exact p is 2 / 51 (the one change fell on the one action-0 row),
    # z = 2.06: nothing to see.
    assert two_proportion_z(np.array([1]), np.array([0]), 1, 50)[0] == pytest.approx(7.14, abs=0.01)
    assert exact_change_z(1, 0, 1, 50) == pytest.approx(NormalDist().inv_cdf(1 - 1 / 51), rel=1e-9)
    # a table that cannot show a difference: no trial under one action, no change at all, or only changes
    assert exact_change_z([5, 0, 4], [0, 0, 6], [9, 7, 4], [0, 7, 6]).tolist() == [0.0, 0.0, 0.0]


def test_exact_change_z_matches_scipys_one_sided_fisher_tests():
    rng = np.random.default_rng(3)
    n0, n1 = rng.integers(1, 60, size=40), rng.integers(1, 60, size=40)
    c0, c1 = rng.binomial(n0, 0.3), rng.binomial(n1, 0.2)
    z = exact_change_z(c0, c1, n0, n1)
    for i in range(40):
        table = [[c0[i], n0[i] - c0[i]], [c1[i], n1[i] - c1[i]]]
        if min(c0[i] + c1[i], n0[i] + n1[i] - c0[i] - c1[i]) == 0:
            assert z[i] == 0.0
            continue
        p = min(1.0, 2 * min(fisher_exact(table, "less")[1], fisher_exact(table, "greater")[1]))
        assert z[i] == pytest.approx(norm.isf(p / 2), rel=1e-7, abs=1e-9)


def test_exact_change_z_stays_finite_where_p_underflows():
    z = exact_change_z(500, 0, 500, 500)  # p ~ 1e-300: computed from log p
    assert np.isfinite(z) and z > 35


# --- the context test on counts ---------------------------------------------------------------------------


def _opposite_effects(per_action: int = 500, changes: int = 50) -> tuple[np.ndarray, np.ndarray]:
    """Two contexts, one component that changes `changes` times under action 0 in context 0 and under action
    1 in context 1, never otherwise (ContextMatch's flag); a second component that changes as often under
    either action; a third that never changes in context 1."""
    n = np.array([[per_action, per_action], [per_action, per_action]])
    c = np.array(
        [
            [[changes, 0], [40, 40], [10, 12]],  # context 0
            [[0, changes], [40, 40], [0, 0]],  # context 1
        ]
    )
    return c, n


def test_an_effect_whose_sign_depends_on_the_context_is_seen_within_contexts_only():
    c, n = _opposite_effects()
    summed_c, summed_n = c.sum(axis=0), n.sum(axis=0)
    marginal = two_proportion_z(summed_c[:, 0], summed_c[:, 1], summed_n[0], summed_n[1])
    assert marginal[0] == 0.0  # Eq. 10 on the counts summed over the contexts: 50 / 1000 changes under each
    z, thresholds = context_change_z(c, n, 4.0)
    # within context 0, 50 of 500 against 0 of 500: p = 2 C(950, 450) / C(1000, 500), z about 7.3
    assert z[0] == pytest.approx(exact_change_z(50, 0, 500, 500)) and z[0] > 7
    assert thresholds[0] == pytest.approx(family_threshold(4.0, 2))  # two contexts can show a difference
    # 40 / 500 under both actions in both contexts: exactly z = 0; the test reports the bound it stopped at
    assert exact_change_z(40, 40, 500, 500) == 0.0 and 0.0 <= z[1] < thresholds[1]
    # the third component never changes in context 1: one context tested, the threshold is z_thresh itself
    assert thresholds[2] == pytest.approx(4.0) and z[2] < 4.0


def test_a_table_that_cannot_pass_is_bounded_not_summed_and_every_verdict_stays_exact():
    rng = np.random.default_rng(8)
    n0, n1 = rng.integers(1, 3000, size=4000), rng.integers(1, 3000, size=4000)
    effect = rng.uniform(-0.1, 0.1, size=4000) * (rng.random(4000) < 0.3)  # most tables have no effect
    base = rng.uniform(0.01, 0.6, size=4000)
    c0, c1 = rng.binomial(n0, np.clip(base + effect, 0, 1)), rng.binomial(n1, base)
    needed = rng.choice([2.0, 4.0, 4.5], size=4000)
    exact, screened = exact_change_z(c0, c1, n0, n1), exact_change_z(c0, c1, n0, n1, needed=needed)
    assert ((exact > needed) == (screened > needed)).all()  # the verdicts are the exact test's
    passing = exact > needed
    assert passing.sum() > 300 and (~passing).sum() > 300  # both kinds present
    np.testing.assert_allclose(screened[passing], exact[passing], rtol=1e-12)
    # where it stopped at the bound: at least the exact z, at most the z it would need
    assert (screened[~passing] >= exact[~passing] - 1e-9).all() and (screened[~passing] <= needed[~passing]).all()


def test_context_change_z_names_a_bad_shape():
    with pytest.raises(ValueError, match=r"change_counts \(2, 3\), action_counts \(2, 2\): expected \(contexts, components, 2\)"):
        context_change_z(np.zeros((2, 3)), np.zeros((2, 2)), 4.0)


def test_the_context_tests_false_positive_rate_is_at_most_one_tests():
    """No action effect anywhere: 20,000 components (replicates) over 5 contexts, three with hundreds of
    transitions under each action and two small, unbalanced ones (as a greedy policy leaves them: 3 against
    150, 2 against 60), change rates 0.02-0.3. At z_thresh = 2.576 one two-sided test rejects with probability
    alpha = 0.01; the family must reject at most that often, within 4 binomial sd of 20,000 draws. Both of the
    test's choices are needed for that: without the Bonferroni threshold the largest of 5 exact z's passes
    more often, and so does Eq. 10's normal approximation in each context on the small tables."""
    rng = np.random.default_rng(11)
    replicates, z_thresh = 20_000, 2.576
    n = np.array([[400, 400], [300, 500], [1000, 800], [3, 150], [2, 60]])
    rates = rng.uniform(0.02, 0.3, size=(len(n), replicates))
    c = np.stack([rng.binomial(n[:, None, a], rates) for a in (0, 1)], axis=2)
    alpha = 2 * (1 - NormalDist().cdf(z_thresh))
    bound = alpha + 4 * math.sqrt(alpha * (1 - alpha) / replicates)
    z, thresholds = context_change_z(c, n, z_thresh)
    assert (z > thresholds).mean() <= bound
    exact = exact_change_z(c[..., 0], c[..., 1], n[:, None, 0], n[:, None, 1])
    assert (exact.max(axis=0) > z_thresh).mean() > bound
    normal = np.stack([two_proportion_z(c[s, :, 0], c[s, :, 1], n[s, 0], n[s, 1]) for s in range(len(n))])
    assert (normal.max(axis=0) > family_threshold(z_thresh, len(n))).mean() > bound


# --- counting transitions per context ---------------------------------------------------------------------


def _brute_force_counts(states, actions, next_states, components):
    """{projection: (n[a], c[i, a])} by one loop over the transitions."""
    out: dict[tuple[int, ...], tuple[np.ndarray, np.ndarray]] = {}
    for s, a, t in zip(states.tolist(), actions.tolist(), next_states.tolist()):
        key = tuple(s[j] for j in components)
        n, c = out.setdefault(key, (np.zeros(2, np.int64), np.zeros((len(s), 2), np.int64)))
        n[a] += 1
        c[:, a] += np.asarray(s) != np.asarray(t)
    return out


def _as_dict(stats, components):
    n, c = stats.log.counts(components)
    index = stats.log._counts[tuple(components)].index
    return {key: (n[row].tolist(), c[row].tolist()) for key, row in index.items()}


def test_counts_per_context_match_a_loop_over_the_transitions_whatever_the_order_of_the_questions():
    rng = np.random.default_rng(5)
    states, next_states = rng.integers(0, 3, size=(900, 4)), rng.integers(0, 3, size=(900, 4))
    states[600:, 3] *= 10**12  # values outside int8 after the first 600: the log's dtype grows, counts stay
    next_states[600:, 3] *= 10**12
    actions = rng.integers(2, size=900)
    one, many = ChangeStatistics(4, log_transitions=True), ChangeStatistics(4, log_transitions=True)
    for s, a, t in zip(states[:300], actions[:300], next_states[:300]):
        one.update(s, int(a), t)
    many.update_many(states[:300], actions[:300], next_states[:300])
    asked = ([0], [0, 2], [1, 3], [], [0, 1, 2, 3], [0])  # more than TransitionLog.CACHED choices, [0] again last
    for start, stop in ((300, 450), (450, 900)):
        for stats in (one, many):
            for components in asked:
                stats.log.counts(components)  # cached counts, then extended by the next transitions
            stats.update_many(states[start:stop], actions[start:stop], next_states[start:stop])
    for components in asked:
        want = _brute_force_counts(states, actions, next_states, components)
        want = {k: (n.tolist(), c.tolist()) for k, (n, c) in want.items()}
        assert _as_dict(one, components) == want
        assert _as_dict(many, components) == want


def test_the_log_keeps_small_integers_in_one_byte_and_every_value_exactly():
    log = TransitionLog(3, 2)
    log.add(np.array([[0, 1, 100], [1, 1, 100]]), np.array([1, 0]), np.array([[True, False, False], [False, False, True]]))
    assert log._states.dtype == np.uint8  # bits and a clock to 100: one byte a component (bsuite's umbrella)
    log.add(np.array([[-1, 1, 100]]), np.array([0]), np.array([[True, True, False]]))
    log.add(np.array([[0.5, 1, 10.0**12]]), np.array([1]), np.array([[False, False, False]]))
    n, c = log.counts([0, 2])
    index = log._counts[(0, 2)].index
    assert set(index) == {(0, 100), (1, 100), (-1, 100), (0.5, 10.0**12)}
    assert n[index[(-1, 100)]].tolist() == [1, 0] and c[index[(-1, 100)]].tolist() == [[1, 0], [1, 0], [0, 0]]
    assert n[index[(0.5, 10.0**12)]].tolist() == [0, 1] and c[index[(1, 100)]].tolist() == [[0, 0], [0, 0], [1, 0]]


# --- roles on ContextMatch and on an umbrella-like task -----------------------------------------------------


def _random_play(env: gym.Env, episodes: int, seed: int, causal_test: str) -> ChangeStatistics:
    """Counts of uniformly random play, as VCBM's warm-up gathers them, for `causal_test`."""
    stats = ChangeStatistics.for_test(int(np.prod(env.observation_space.shape)), 2, causal_test)
    return record_random_play(env, stats, episodes, seed)


@pytest.mark.parametrize("seed", SEEDS)
def test_only_the_context_test_finds_the_flag(seed):
    env = ContextMatchEnv(n_distractors=4)
    stats = _random_play(env, 200, seed, FREQUENCY_VALUE_AND_CONTEXT)  # 2,000 transitions: VCBM's warm-up
    marginal = [Role.STATIC, Role.NOISE, Role.CLOCK] + [Role.NOISE] * 4
    assert stats.roles(0.9, 4.0, FREQUENCY) == marginal
    assert stats.roles(0.9, 4.0, FREQUENCY_AND_VALUE) == marginal
    assert stats.roles(0.9, 4.0, FREQUENCY_VALUE_AND_CONTEXT) == [Role.STATIC, Role.CONTROLLED, Role.CLOCK] + [Role.NOISE] * 4
    assert stratum_components(marginal) == [0]  # the contexts: the context bit's two values
    tests = stats.context_tests([0], 4.0)
    (z_flag, threshold), distractors = tests[1], tests[3:]
    assert z_flag > 1.5 * threshold  # ~50 changes under the matching action in each context, none under the other
    assert all(z < t for z, t in distractors)


def test_without_a_static_or_controlled_component_there_is_no_context_to_test_within():
    stats = ChangeStatistics(2, log_transitions=True)
    rng = np.random.default_rng(0)
    states, actions = rng.integers(2, size=(3000, 2)), rng.integers(2, size=3000)
    next_states = states.copy()
    next_states[:, 0] = rng.integers(2, size=3000)  # noise
    next_states[:, 1] = 1 - states[:, 1]  # a clock: flips every step
    stats.update_many(states, actions, next_states)
    assert (
        stats.roles(0.9, 4.0, FREQUENCY_VALUE_AND_CONTEXT)
        == stats.roles(0.9, 4.0, FREQUENCY_AND_VALUE)
        == [Role.NOISE, Role.CLOCK]
    )


def test_the_context_test_needs_the_transition_log_and_names_a_bad_test():
    with pytest.raises(ValueError, match=r"reads logged transitions: expected ChangeStatistics\(log_transitions=True\)"):
        ChangeStatistics(3).roles(0.9, 4.0, FREQUENCY_VALUE_AND_CONTEXT)
    with pytest.raises(ValueError, match="causal_test='context': expected one of frequency, frequency"):
        ChangeStatistics(3).roles(0.9, 4.0, "context")
    # what each test reads is counted, no more: the paper's test logs nothing and counts no values
    paper = ChangeStatistics.for_test(3, 2, FREQUENCY)
    assert paper.log is None and not paper.count_values
    assert ChangeStatistics.for_test(3, 2, FREQUENCY_AND_VALUE).log is None


def test_the_default_is_the_context_test_and_the_paper_test_stays_selectable():
    assert VCBMConfig().causal_test == DEFAULT_CAUSAL_TEST == FREQUENCY_VALUE_AND_CONTEXT
    assert CAUSAL_TESTS == (FREQUENCY, FREQUENCY_AND_VALUE, FREQUENCY_VALUE_AND_CONTEXT)
    for test in CAUSAL_TESTS:
        assert VCBMConfig(causal_test=test).causal_test == test
    with pytest.raises(
        ConfigError, match=r"causal_test='stratified': expected one of frequency, frequency\+value, frequency\+value\+context"
    ):
        VCBMConfig(causal_test="stratified")


# --- the agent -------------------------------------------------------------------------------------------------


def test_vcbm_with_its_defaults_learns_context_match(tmp_path):
    """With its defaults VCBM labels the flag controlled and the decisions reach 90% correct (the runner
    stops at the convergence criterion, 95% over 750 episodes, which is 25 sd of the window rate above chance)."""
    for seed in SEEDS:
        summary = _train(tmp_path, f"default{seed}", seed)
        roles = summary["roles"]
        assert (roles["context"], roles["flag"], roles["timestep"]) == ("static", "controlled", "clock")
        assert {roles["distractor_0"], roles["distractor_1"]} == {"noise"}
        assert summary["bookmark_contexts"] == [[0, 0]]  # (flag, timestep) before the flag is set: t = 0
        assert summary["converged"] is True and summary["final_correct_rate"] >= 0.9
        # warm-up 200 episodes, 60 forced visits per action in each of the 2 contexts, the 750-episode window
        assert summary["episodes_to_converge"] <= 1500
        # the key holds the context: each context's matching action has the higher mean return
        values = summary["bookmark_values"]
        for context in (0, 1):
            means = [values[f"[{context}, 0, 0]|a={a}"]["mean"] for a in (0, 1)]
            assert means[context] > means[1 - context]


@pytest.mark.parametrize("causal_test", [FREQUENCY, FREQUENCY_AND_VALUE])
def test_the_marginal_tests_leave_vcbm_at_chance_on_context_match(tmp_path, causal_test, capsys):
    summary = _train(tmp_path, "marginal", 0, causal_test, episodes=1500)
    assert summary["roles"]["flag"] == "noise" and summary["bookmark_contexts"] == []
    assert summary["converged"] is False and abs(summary["final_correct_rate"] - 0.5) < CHANCE_BAND
    assert "found no controlled component after the warm-up" in capsys.readouterr().err


def test_in_an_experiment_each_runs_warning_names_its_run(tmp_path, capsys):
    """The runs of a compare share one stderr: a warning without its run could be any of them."""
    argv = ["--env", ENV_ID, "--algos", "vcbm", "--seeds", "2", "--seed-start", "3", "--workers", "0"]
    argv += ["--max-episodes", "400", "--hyperparams", f"causal_test={FREQUENCY}", "--out", str(tmp_path), "--no-progress"]
    compare.run(argv)
    warnings = [line for line in capsys.readouterr().err.splitlines() if "found no controlled component" in line]
    assert [line.partition("warning: ")[0] for line in warnings] == ["[vcbm seed 3] ", "[vcbm seed 4] "]


def test_vcbm_plus_with_its_defaults_learns_context_match(tmp_path):
    summary = _train(tmp_path, "plus", 0, algo="vcbm-plus")
    assert summary["roles"]["flag"] == "controlled"
    assert summary["converged"] is True and summary["final_correct_rate"] >= 0.9


def test_on_watch_repair_the_context_test_changes_nothing(tmp_path):
    """The counters are noise within each (repaired_flag, brand) context too: the default test gives the paper
    test's roles, and so the same run (the zoo's WatchRepair-v0 entry pins the paper's test for Table II; seeds
    0-19 were all identical, docs/papers/vcbm.md)."""
    runs = {
        test: _train(tmp_path, test, 0, test, env="WatchRepair-v0", episodes=1300)
        for test in (FREQUENCY_VALUE_AND_CONTEXT, FREQUENCY)
    }
    learned = ("converged", "episodes_to_converge", "final_correct_rate", "roles", "bookmark_contexts", "bookmark_values")
    assert {k: runs[FREQUENCY][k] for k in learned} == {k: runs[FREQUENCY_VALUE_AND_CONTEXT][k] for k in learned}
    assert runs[FREQUENCY]["episodes_to_converge"] == 1199  # benchmarks/results/table2, seed 0


def test_on_bsuites_umbrella_the_context_test_changes_nothing(tmp_path):
    """umbrella_length/2 (chain of 3, 20 distractor bits): the distractors stay noise within each (need, have)
    context, so the default runs exactly as the value test alone (the committed bsuite sweep's setting)."""
    pytest.importorskip("bsuite", reason="bsuite is not installed: pip install -e '.[bsuite]'")
    runs = {
        test: _train(tmp_path, test.replace("+", "_"), 0, test, env="bsuite:umbrella_length/2", episodes=2500)
        for test in (FREQUENCY_VALUE_AND_CONTEXT, FREQUENCY_AND_VALUE)
    }
    learned = ("roles", "bookmark_contexts", "bookmark_values", "mean_return_last_episodes")
    assert {k: runs[FREQUENCY_AND_VALUE][k] for k in learned} == {k: runs[FREQUENCY_VALUE_AND_CONTEXT][k] for k in learned}
    assert list(runs[FREQUENCY_AND_VALUE]["roles"].values()).count("controlled") == 1


# --- the env ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("context_prob", [0.0, 1.0])
def test_the_flag_is_set_iff_the_first_action_matches_the_context(context_prob):
    env = ContextMatchEnv(horizon=3, context_prob=context_prob, reward_noise_sd=0.0, match_reward=2.5, n_distractors=0)
    context = int(context_prob)
    for first in (0, 1):
        obs, info = env.reset(seed=1)
        assert obs.tolist() == [context, 0, 0] and info["optimal_first_action"] == context
        rewards, flags = [], []
        for action in (first, 1 - first, first):  # later actions change nothing
            obs, reward, terminated, truncated, info = env.step(action)
            rewards.append(reward)
            flags.append(int(obs[1]))
        assert flags == [int(first == context)] * 3 and obs[2] == 3 and terminated and not truncated
        assert rewards == [0.0, 0.0, 2.5 * (first == context)]
        assert info["first_decision_optimal"] is (first == context) and info["is_success"] is (first == context)


def test_the_reward_noise_has_its_stated_spread():
    env = ContextMatchEnv(horizon=1, reward_noise_sd=2.0, n_distractors=0)
    returns = []
    for episode in range(4000):
        obs, _ = env.reset(seed=episode)
        returns.append(env.step(int(obs[0]))[1] - 1.0)  # matched: match_reward 1 plus noise
    # the sample mean of 4,000 N(0, 4) draws has sd 2 / sqrt(4000) = 0.032; its variance's sd is 4 sqrt(2 / 3999) = 0.089
    assert abs(np.mean(returns)) < 4 * 2 / math.sqrt(4000)
    assert abs(np.var(returns, ddof=1) - 4.0) < 4 * 4 * math.sqrt(2 / 3999)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"horizon": 0}, "horizon=0: expected an integer >= 1"),
        ({"horizon": 2.5}, "horizon=2.5: expected an integer >= 1"),
        ({"context_prob": 1.5}, r"context_prob=1.5: expected a finite real number in \[0.0, 1.0\]"),
        ({"reward_noise_sd": -1}, "reward_noise_sd=-1: expected a finite real number >= 0.0"),
        ({"match_reward": float("nan")}, "match_reward=nan: expected a finite real number"),
        ({"n_distractors": True}, "n_distractors=True: expected an integer >= 0"),
    ],
)
def test_bad_settings_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ContextMatchEnv(**kwargs)


def test_bad_actions_and_steps_out_of_order_are_named():
    env = gym.make(ENV_ID).unwrapped
    with pytest.raises(RuntimeError, match="before reset"):
        env.step(0)
    env.reset(seed=0)
    for action in (2, -1, True, "0"):
        with pytest.raises(ValueError, match=f"invalid action {action!r}: expected 0 or 1"):
            env.step(action)


def test_registered_with_its_component_names_and_json_kwargs():
    env = gym.make(ENV_ID, **json.loads('{"horizon": 4, "n_distractors": 1}'))
    assert env.unwrapped.component_names == ("context", "flag", "timestep", "distractor_0")
    assert env.observation_space.nvec.tolist() == [2, 2, 5, 2]
