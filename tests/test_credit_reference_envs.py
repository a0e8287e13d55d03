"""Replay-defined credit on a text env and on a set action (algorithms/credit_reference/):
TextWatchWorkshop lists each turn's alternatives (its station's tools) and its optimal one; the workshop's reference
sits on the movement station alone and matches E[G | brand, repair] / 2 there; a SetRetrieval slot's reference is
v(a) - E_b v(a with slot i := b), checked against a hand-written value table; text episodes reach the rules that read
per-turn info keys; rules that cannot score an env are refused in one line, and bad env/option combinations too."""

from __future__ import annotations

import argparse
import json
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

import vcbm_gym  # noqa: F401 (registers the envs)
from algorithms.credit_reference import cli as reference_cli
from algorithms.credit_reference import replay, scoring
from envs import set_retrieval
from envs.snapshot import restore, snapshot
from envs.watch_repair import REPAIR

WORKSHOP, SETS = "TextWatchWorkshop-v0", "SetRetrieval-v0"
Z = 4.0  # a fixed seed makes a pass reproducible; 4 SE keeps a correct estimator far from the edge


def args_for(**changes: Any) -> argparse.Namespace:
    settings = dict(
        policy="uniform",
        seed=0,
        episodes=4,
        train_episodes=0,
        batch_episodes=2,
        k=4,
        independent_branches=False,
        decision_step="auto",
        group_size="auto",
    )
    return argparse.Namespace(**{**settings, **changes})


def test_a_workshop_turn_offers_its_stations_tools_and_names_the_movements_optimal_call():
    env = gym.make(WORKSHOP)
    base = env.unwrapped
    with pytest.raises(RuntimeError, match="before reset"):
        base.turn_alternatives()
    for seed in range(6):
        env.reset(seed=seed)
        optimal_call = "repair()" if base._optimal[base._brand] == REPAIR else "skip()"
        for t, station in enumerate(base._stations):
            alternatives = base.turn_alternatives()
            movement = station == "movement"
            assert alternatives == (("repair()", "skip()") if movement else ("standard()", "premium()"))
            assert base.optimal_alternative() == (optimal_call if movement else None)
            state, effects = snapshot(env), []
            for call in alternatives:  # every alternative is a distinct, valid decision of the env's own parse
                restore(env, state)
                info = env.step(call)[4]
                effects.append(info["effect"])
                assert info["state_mutating"] and info["is_decision_turn"] == movement
            assert effects == [call[:-2] for call in alternatives]
            restore(env, state)
            env.step(alternatives[t % 2])
    assert {base._optimal[b] for b in range(4)} == {REPAIR, 1 - REPAIR}  # both optimal calls were exercised


def test_the_scripted_policy_takes_the_optimal_call_at_the_movement_and_is_uniform_elsewhere():
    env = gym.make(WORKSHOP)
    _, reset_info = env.reset(seed=3)
    base, policy = env.unwrapped, replay.BehaviourPolicy("scripted")
    for t, station in enumerate(base._stations):
        turn = replay.current_turn(env, t, reset_info)
        probabilities = policy.probabilities(turn)
        if station == "movement":
            assert turn.alternatives[int(np.argmax(probabilities))] == base.optimal_alternative()
            assert sorted(probabilities) == [0.0, 1.0]
        else:
            assert turn.optimal is None and np.array_equal(probabilities, [0.5, 0.5])
        env.step(turn.alternatives[0])


@pytest.mark.parametrize("brand", [1, 3])
def test_the_workshop_reference_is_half_the_expected_repair_return_at_the_movement_and_zero_elsewhere(brand):
    # Skipping returns exactly 0 and cosmetic calls change nothing, so under the uniform policy the movement call's
    # credit is +-E[G | brand, repair] * reward_scale / 2 and every other turn's is exactly 0 (common random numbers).
    env = reference_cli.make_env(WORKSHOP)
    base = env.unwrapped
    _, reset_info = env.reset(seed=brand, options={"brand": brand})
    policy, t = replay.BehaviourPolicy("uniform"), base._stations.index("movement")
    for _ in range(t):
        env.step("standard()")
    turn = replay.current_turn(env, t, reset_info)
    returns = replay.replay_returns(env, snapshot(env), policy, t, turn, reset_info, 1500, np.random.SeedSequence(7))
    estimates = replay.replay_estimates(returns, policy.probabilities(turn))
    truth = base.params.expected_repair_return()[brand] * base.reward_scale / 2
    repair = turn.alternatives.index("repair()")
    se = estimates["credit_se"][repair]
    assert abs(truth) > Z * se and abs(estimates["credit"][repair] - truth) < Z * se
    assert estimates["q"][1 - repair] == 0.0  # skipping: exactly 0
    episode = replay.replay_episode(env, policy, brand, np.random.SeedSequence(brand), 4, True, "auto")
    assert episode.decision_step == env.unwrapped._stations.index("movement")  # the replayed episode's own station
    off = np.arange(len(episode.credit)) != episode.decision_step
    assert len(episode.credit) == 8 and np.all(episode.credit[off] == 0) and np.all(episode.credit_se[off] == 0)
    assert episode.actions[episode.decision_step] in ("repair()", "skip()")


def test_text_episodes_give_the_rules_their_per_turn_info_keys_and_groups_of_one_task():
    env = reference_cli.make_env(WORKSHOP)
    policy, fit = reference_cli.check_setting(env, WORKSHOP, args_for())
    assert fit.kind == replay.ALTERNATIVES and fit.group_size == replay.AUTO_GROUP_SIZE
    assert {"turn_flags['state_mutating']", "turn_texts", "final_texts", "extras['anchor_keys']"} <= fit.batch_provides
    assert "observations" not in fit.batch_provides and {"state_mutating", "execution_output"} <= fit.info_provides
    played = [replay.play(env, policy, 10 + i // 2, np.random.default_rng(i), False)["played"] for i in range(4)]
    for i, episode in enumerate(played):
        episode.task = i // 2
    batch = replay.episode_batch(played, fit.batch_provides)
    assert batch.group_ids.tolist() == [0, 0, 1, 1]
    assert batch.turn_texts[2] == [info["execution_output"] for info in played[2].infos]
    assert batch.turn_flags["state_mutating"][0].tolist() == [True] * 8
    assert batch.final_texts[1] == played[1].final_observation and "Final result" in batch.final_texts[1]
    assert batch.extras["anchor_keys"][3][0].startswith("A customer brings in a watch")
    assert batch.observations is None and batch.rewards.shape == (4, 8)
    assert scoring.rule_misfit("vcbm_blend", env, fit) is None and scoring.rule_misfit("gigpo", env, fit) is None


def hand_request(params: set_retrieval.SetRetrievalParams, rng: np.random.Generator) -> set_retrieval.SetRequest:
    """A pool of 3 items with hand-written values: v({0}) = 1, v({1}) = 2, v({2}) = 3, v({0, 1}) = 4, v({0, 2}) = 5,
    v({1, 2}) = 6, v({0, 1, 2}) = 9 (index: bitmask of the items); the snapshot evaluator is the same plus 1."""
    reference = np.array([0.0, 1.0, 2.0, 4.0, 3.0, 5.0, 6.0, 9.0])
    snapshot_table = np.where(np.arange(8) > 0, reference + 1.0, 0.0)
    ones = np.ones((3, 1))
    return set_retrieval.SetRequest(
        np.ones(1), ones * 0.5, np.zeros(3, int), np.zeros((0, 2), int), np.zeros(0), reference, snapshot_table,
        np.ones((3, 3), np.float32),
    )  # fmt: skip


class FixedSlots(replay.BehaviourPolicy):
    """The uniform policy's probabilities, but slots drawn from a given list (to play a chosen set)."""

    def __init__(self, items: list[int]) -> None:
        super().__init__("uniform")
        object.__setattr__(self, "items", list(items))

    def sample(self, turn: replay.Turn, rng: np.random.Generator) -> int:
        return self.items.pop(0)


def test_a_slots_reference_is_its_value_minus_the_policys_average_over_that_slots_alternatives(monkeypatch):
    monkeypatch.setattr(set_retrieval, "sample_request", hand_request)
    env = gym.make(SETS, pool_size=3, set_size=2, n_facets=1, n_intents=1, complementary_intents=())
    episode = replay.replay_slots(env, FixedSlots([0, 2]), 0, np.random.default_rng(0))
    # a = (0, 2), v(a) = v({0, 2}) = 5. Slot 0 := 0, 1, 2 gives {0, 2}, {1, 2}, {2}: 5, 6, 3 (mean 14/3);
    # slot 1 := 0, 1, 2 gives {0}, {0, 1}, {0, 2}: 1, 4, 5 (mean 10/3)
    assert episode.credit == pytest.approx([5 - 14 / 3, 5 - 10 / 3], abs=1e-12)
    assert [q.tolist() for q in episode.q] == [[5.0, 6.0, 3.0], [1.0, 4.0, 5.0]]
    assert np.all(episode.credit_se == 0) and episode.decision_step is None
    # the rules see the snapshot's reward on the last slot and its coalition values over the two slots
    assert episode.played.rewards.tolist() == [0.0, 6.0] and episode.actions.tolist() == [0, 2]
    table = episode.played.infos[-1]["coalition_values"]
    assert np.asarray(table).tolist() == [0.0, 2.0, 4.0, 6.0]  # {}, {item 0}, {item 2}, {items 0, 2}
    shapley = scoring.rule_credit("set_shapley", env, [], 1, [episode.played], frozenset())
    assert shapley[0] == pytest.approx([(2 + (6 - 4)) / 2, (4 + (6 - 2)) / 2])  # Shapley of the snapshot's values


def test_a_set_run_scores_the_coalition_rules_and_refuses_the_rules_that_need_turns(tmp_path):
    out = tmp_path / "ref_{env}.json"
    argv = ["--env", SETS, "--rules", "casi,loo,vcbm_blend,rudder", "--seeds", "1", "--episodes", "8", "--train-episodes", "8"]
    assert reference_cli.main([*argv, "--batch-episodes", "4", "--out", str(out)]) == 0
    result = json.loads((tmp_path / "ref_SetRetrieval-v0.json").read_text())
    assert result["settings"]["branching"] == "slots" and result["settings"]["k"] is None
    assert set(result["rules"]) == {"casi", "loo", "vcbm_blend", "rudder", *scoring.SET_RULES}
    for name in ("vcbm_blend", "rudder"):
        assert "\n" not in result["rules"][name]["refused"] and result["rules"][name]["refused"].startswith("needs ")
    assert result["rules"]["rudder"]["refused"].startswith("needs observations, actions")
    assert result["rules"]["set_shapley"]["summary_centred"]["leakage"]["estimate"] is None
    assert len(result["reference_episodes"]) == 8 and all(len(e["credit"]) == 5 for e in result["reference_episodes"])
    table = (tmp_path / "ref_SetRetrieval-v0.md").read_text()
    assert table.count("\n| `") == 2 * (4 + len(scoring.SET_RULES)) and "Centred within the set" in table


def test_a_workshop_run_scores_the_text_rules_and_refuses_casi_in_one_line(tmp_path):
    out = tmp_path / "ref_{env}.json"
    argv = ["--env", WORKSHOP, "--rules", "broadcast,loo,vcbm_blend,casi,rudder", "--seeds", "1", "--episodes", "4"]
    assert reference_cli.main([*argv, "--k", "2", "--train-episodes", "4", "--batch-episodes", "2", "--out", str(out)]) == 0
    result = json.loads((tmp_path / "ref_TextWatchWorkshop-v0.json").read_text())
    assert {name for name, row in result["rules"].items() if "refused" not in row} == {"broadcast", "loo", "vcbm_blend"}
    assert result["rules"]["casi"]["refused"].startswith("needs extras['coalition_values'], info['coalition_values']")
    assert result["reference"]["leakage"]["estimate"] == 0.0 and result["settings"]["group_size"] == 8
    lines = (tmp_path / "ref_TextWatchWorkshop-v0.md").read_text().splitlines()
    assert sum(line.startswith("| `") for line in lines) == 5 and all(line.count("|") == 9 for line in lines[3:])


@pytest.mark.parametrize(
    "argv, start",
    [
        ([SETS, "--policy", "scripted"], f"error: --policy scripted: env '{SETS}' is a set action that names no optimal"),
        ([SETS, "--decision-step", "0"], f"error: --decision-step 0: env '{SETS}' is scored per slot"),
        ([SETS, "--independent-branches"], f"error: --independent-branches: env '{SETS}'"),
        (["TextSetRetrieval-v0"], "error: --env 'TextSetRetrieval-v0': action space Text(max_length=4096) has no finite"),
        ([WORKSHOP, "--group-size", "0"], "error: --group-size 0: expected an integer in [1,"),
        ([WORKSHOP, "--episodes", "many"], "error: --episodes 'many': expected 'auto' or an integer >= 2"),
    ],
)
def test_bad_env_and_option_combinations_are_one_line_before_anything_is_written(tmp_path, capsys, argv, start):
    out = tmp_path / "new" / "r_{env}.json"
    assert reference_cli.main(["--env", *argv, "--out", str(out)]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(start), lines
    assert not (tmp_path / "new").exists()


def test_the_bootstrap_over_tasks_resamples_whole_groups():
    # Tasks {1, 1, 1} and {5}: a resample of two tasks has mean 1 (both the first, p = 1/4), 5 (both the second,
    # p = 1/4) or (3 + 5) / 4 = 2, so the 95% percentile interval is [1, 5]; resampling the 4 episodes would not
    # reach 5 (all four the last one: p = 1/256 < 2.5%).
    estimate = scoring.task_estimate(np.array([1.0, 1.0, 1.0, 5.0]), np.array([0, 0, 0, 1]), "mean")
    assert estimate == {"estimate": 2.0, "ci_low": 1.0, "ci_high": 5.0}
    median = scoring.task_estimate(np.array([0.0, 0, 0, 1, 1, 1]), np.array([0, 0, 0, 1, 1, 1]), "median")
    assert median == {"estimate": 0.5, "ci_low": 0.0, "ci_high": 1.0}
    assert scoring.task_estimate(np.array([3.0, 4.0]), np.array([7, 7]), "mean")["ci_low"] is None  # one task: no CI
