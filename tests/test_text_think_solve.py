"""TextThinkSolve-v0: the contract, who sees what, an optimal pair at 1.0, chance without the Thinker, noise,
solo mode, seeds, and one-line refusals."""

from __future__ import annotations

import math
import re

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import vcbm_gym
from envs.text_think_solve import HISTORIES, SOLVER, THINKER, TextThinkSolveEnv, optimal_decision
from envs.text_watch_repair import BRAND_NAMES

N_EPISODES = 4000
RECORDS = [(b, h) for b in range(len(BRAND_NAMES)) for h in range(len(HISTORIES))]


def binomial_tolerance(p: float, n: int, standard_errors: float = 4.0) -> float:
    """How far a rate of n Bernoulli(p) draws may stray from p: `standard_errors` binomial standard errors (at 4, a
    correct env fails about once in 16,000 runs of a fixed seed set, which never changes)."""
    return standard_errors * math.sqrt(p * (1 - p) / n)


def honest_thinker(observation: str) -> str:
    brand = re.search(r"brand (\w+);", observation).group(1)
    history = re.search(r"history: ([^.]+)\.", observation).group(1)
    return f"brand={brand} history={HISTORIES.index(history)}"


def decoding_solver(observation: str) -> str:
    """Reads the record from the note, the only place it can be, and answers by the table."""
    found = re.search(r"brand=(\w+) history=(\d)", observation)
    brand, history = BRAND_NAMES.index(found.group(1)), int(found.group(2))
    return f"Action: {optimal_decision(brand, history)}()"


def play(env, seed, thinker, solver, options=None):
    """One episode; (reward, infos, observations)."""
    obs, info = env.reset(seed=seed, options=options)
    observations, infos, reward = [obs], [info], 0.0
    done = False
    while not done:
        act = thinker if info["next_role"] == THINKER else solver
        obs, reward, terminated, truncated, info = env.step(act(obs))
        observations.append(obs)
        infos.append(info)
        done = terminated or truncated
    return reward, infos, observations


def test_registered_and_passes_gymnasium_and_contract_checkers():
    env = gym.make("TextThinkSolve-v0")
    check_env(env.unwrapped, skip_render_check=True)
    check_env(TextThinkSolveEnv(solo=True, noise=0.3), skip_render_check=True)
    report = vcbm_gym.check_contract(env, needs=("vcbm-loop", "--ratio-sharing effect"), episodes=3, seed=1)
    assert {"state_mutating", "effect", "execution_output", "is_decision_turn", "first_decision_optimal"} <= report.reported
    assert report.steps == 6  # two turns an episode


def test_roles_are_marked_in_the_observation_and_the_info():
    env = TextThinkSolveEnv()
    obs, info = env.reset(seed=0)
    assert obs.startswith("Role: Thinker.") and info["next_role"] == THINKER == env.next_role
    obs, reward, terminated, _, info = env.step("a note")
    assert obs.startswith("Role: Solver.") and info["role"] == THINKER and info["next_role"] == SOLVER == env.next_role
    assert reward == 0.0 and not terminated and not info["is_decision_turn"]
    _, _, terminated, _, info = env.step("skip()")
    assert terminated and info["role"] == SOLVER and info["next_role"] is None and env.next_role is None
    assert info["is_decision_turn"]
    with pytest.raises(RuntimeError):
        env.step("skip()")


def test_the_solver_never_sees_the_record_and_the_record_alone_decides_nothing():
    env = TextThinkSolveEnv()
    solver_views, solo_views = set(), set()
    for brand, history in RECORDS:
        env.reset(seed=0, options={"brand": brand, "history": history})
        solver_view = env.step("hello")[0]
        assert not any(name in solver_view for name in BRAND_NAMES) and not any(h in solver_view for h in HISTORIES)
        solver_views.add(solver_view)
        solo_views.add(env.reset(seed=0, options={"brand": brand, "history": history, "solo": True})[0])
    # one text for all 16 records: any Solver without the note's information answers all of them alike
    assert len(solver_views) == 1 and len(solo_views) == 1
    repair = {record: optimal_decision(*record) == "repair" for record in RECORDS}
    assert sum(repair.values()) == 8
    for k in range(4):  # given the brand alone, or the history alone, repair is right exactly half the time
        assert sum(repair[(k, h)] for h in range(4)) == 2 and sum(repair[(b, k)] for b in range(4)) == 2


def test_seeds_draw_every_record_uniformly():
    env = TextThinkSolveEnv()
    counts = {record: 0 for record in RECORDS}
    for seed in range(N_EPISODES):
        info = env.reset(seed=seed)[1]
        counts[(info["brand"], info["history"])] += 1
    share = 1 / len(RECORDS)
    assert all(abs(c / N_EPISODES - share) < binomial_tolerance(share, N_EPISODES) for c in counts.values()), counts


def test_a_scripted_optimal_pair_scores_one_on_every_record_and_every_seed():
    env = TextThinkSolveEnv()
    for brand, history in RECORDS:
        reward, infos, _ = play(env, 0, honest_thinker, decoding_solver, {"brand": brand, "history": history})
        assert reward == 1.0 and infos[-1]["task_goal_completion"] == 1.0 and infos[-1]["first_decision_optimal"]
    rewards = [play(env, seed, honest_thinker, decoding_solver)[0] for seed in range(500)]
    assert np.mean(rewards) == 1.0


def _success_rate(env, thinker, solver, n=N_EPISODES):
    return np.mean([play(env, seed, thinker, solver)[1][-1]["task_goal_completion"] for seed in range(n)])


def test_a_random_pair_scores_chance():
    rng = np.random.default_rng(0)
    chars = list("abcdefghijklmnopqrstuvwxyz ()")

    def random_thinker(_obs):
        return "".join(rng.choice(chars, size=int(rng.integers(0, 40))))

    def random_solver(_obs):
        return ("repair()", "skip()")[int(rng.integers(2))]

    rate = _success_rate(TextThinkSolveEnv(), random_thinker, random_solver)
    assert abs(rate - 0.5) < binomial_tolerance(0.5, N_EPISODES)


def test_a_solver_without_the_thinkers_information_scores_chance():
    """A Solver that answers the same whatever it reads (all it can do without the record's information): its rate
    is how often its answer is right over the seeded records, 1/2 if the seeds draw records uniformly."""
    for answer in ("repair()", "skip()"):
        joint = _success_rate(TextThinkSolveEnv(), lambda _obs: "no idea", lambda _obs, a=answer: a)
        solo = _success_rate(TextThinkSolveEnv(solo=True), None, lambda _obs, a=answer: a)
        for rate in (joint, solo):
            assert abs(rate - 0.5) < binomial_tolerance(0.5, N_EPISODES)


def test_noise_flips_the_verifier_not_the_truth():
    noise = 0.2
    env = TextThinkSolveEnv(noise=noise)
    rewards = []
    for seed in range(N_EPISODES):
        reward, infos, final = play(env, seed, honest_thinker, decoding_solver)
        assert infos[-1]["task_goal_completion"] == 1.0  # the decision was right; only the verifier erred
        assert (reward == -1.0) == infos[-1]["verifier_flipped"] and f"{reward:+.0f}" in final[-1]
        rewards.append(reward)
    wrong_scores = np.mean(np.array(rewards) == -1.0)
    assert abs(wrong_scores - noise) < binomial_tolerance(noise, N_EPISODES)


def test_solo_mode_is_one_solver_turn_on_the_same_record():
    env = TextThinkSolveEnv()
    joint_obs, joint_info = env.reset(seed=5)
    solo_obs, solo_info = env.reset(seed=5, options={"solo": True})
    assert solo_obs.startswith("Role: Solver.") and "No note" in solo_obs and solo_info["next_role"] == SOLVER
    assert (solo_info["brand"], solo_info["history"]) == (joint_info["brand"], joint_info["history"])
    _, reward, terminated, _, info = env.step(f"{joint_info['optimal_decision']}()")
    assert terminated and reward == 1.0 and info["solo"] and info["is_decision_turn"]
    always_solo = TextThinkSolveEnv(solo=True)
    assert always_solo.reset(seed=5)[0] == solo_obs
    assert always_solo.reset(seed=5, options={"solo": False})[0] == joint_obs  # the option overrides the constructor


def test_a_seed_fixes_the_episode_and_an_outcome_seed_only_the_verifiers_flip():
    env = TextThinkSolveEnv(noise=0.3)
    first = play(env, 11, lambda _obs: "note", lambda _obs: "repair()")
    again = play(env, 11, lambda _obs: "note", lambda _obs: "repair()")
    assert first == again
    records, flips = set(), set()
    for outcome_seed in range(40):
        reward, infos, _ = play(env, 11, lambda _obs: "note", lambda _obs: "repair()", {"outcome_seed": outcome_seed})
        records.add((infos[0]["brand"], infos[0]["history"]))
        flips.add(infos[-1]["verifier_flipped"])
        assert play(env, 11, lambda _obs: "note", lambda _obs: "repair()", {"outcome_seed": outcome_seed})[0] == reward
    assert len(records) == 1 and flips == {True, False}  # P(40 equal flips at 0.3) < 1e-6


def test_answers_and_notes_are_read_leniently():
    env = TextThinkSolveEnv(max_note_chars=10)
    env.reset(seed=0, options={"brand": 0, "history": 0})  # repair is right
    obs, _, _, _, info = env.step("0123456789abc\x00")
    assert '"0123456789..."' in obs and info["effect"] == "note:0123456789..." and info["state_mutating"]
    _, reward, _, _, info = env.step("I'd skip... no: Action: REPAIR()")  # the last decision named wins
    assert reward == 1.0 and info["effect"] == "repair"
    env.reset(seed=0, options={"brand": 0, "history": 0})
    _, _, _, _, info = env.step("   ")
    assert info["effect"] is None and not info["state_mutating"]  # a blank note changes nothing
    obs, reward, _, _, info = env.step("repairs are dear")  # names no decision
    assert reward == -1.0 and info["effect"] == "invalid" and not info["state_mutating"] and "invalid answer" in obs
    obs, _ = env.reset(seed=0, options={"brand": 0, "history": 0})
    assert env.observation_space.contains(env.step("\u2603" * 5)[0])


@pytest.mark.parametrize(
    "bad, expected",
    [
        (dict(noise=-0.1), "[0, 0.5)"),
        (dict(noise=0.5), "[0, 0.5)"),
        (dict(noise=float("nan")), "[0, 0.5)"),
        (dict(noise=True), "[0, 0.5)"),
        (dict(noise="0.1"), "[0, 0.5)"),
        (dict(solo="yes"), "true or false"),
        (dict(solo=1), "true or false"),
        (dict(max_note_chars=0), "[1, 2048]"),
        (dict(max_note_chars=2049), "[1, 2048]"),
        (dict(max_note_chars=2.5), "[1, 2048]"),
        (dict(render_mode="human"), "ansi"),
    ],
)
def test_bad_constructor_values_are_one_line_naming_the_value(bad, expected):
    ((key, value),) = bad.items()
    with pytest.raises(ValueError) as excinfo:
        TextThinkSolveEnv(**bad)
    message = str(excinfo.value)
    assert "\n" not in message and message.startswith(f"{key}={value!r}: expected") and expected in message


@pytest.mark.parametrize("options", [{"brand": 4}, {"history": -1}, {"brand": True}, {"solo": "no"}, {"outcome_seed": -1}])
def test_bad_reset_options_are_one_line_naming_the_value(options):
    ((key, value),) = options.items()
    with pytest.raises(ValueError, match=re.escape(f"{key}={value!r}: expected")):
        TextThinkSolveEnv().reset(seed=0, options=options)


def test_under_the_brand_rule_the_brand_alone_decides_and_the_solver_alone_stays_at_chance():
    env = TextThinkSolveEnv(rule="brand")
    for brand, history in RECORDS:
        info = env.reset(seed=0, options={"brand": brand, "history": history})[1]
        assert info["optimal_decision"] == ("repair" if BRAND_NAMES[brand] in ("Borealis", "Corvina") else "skip")
        assert env.step("")[1:3] == (0.0, False)
        assert env.step(f"{info['optimal_decision']}()")[1] == 1.0
    # the Solver's view carries no record, and half of the brands repair: an always-repair Solver is right half the time
    rewards = []
    for seed in range(400):
        env.reset(seed=seed, options={"solo": True})
        rewards.append(env.step("repair()")[1])
    assert abs(np.mean(rewards)) < 3 * 1 / np.sqrt(400)  # mean reward 0 (chance), within 3 standard errors
    with pytest.raises(ValueError, match="rule='table': expected one of record, brand"):
        TextThinkSolveEnv(rule="table")
