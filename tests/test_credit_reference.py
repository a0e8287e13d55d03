"""Replay-defined credit (algorithms/credit_reference/): the reference reproduces WatchRepair's
closed-form first-decision credit within its standard error, is zero-mean under the behaviour policy, is exactly 0
where an action changes nothing (common random numbers), scores a rule that returns it as perfect and its negation
as wrong, and refuses bad input in one line before writing anything."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

import vcbm_gym  # noqa: F401 (registers the envs)
from algorithms.credit_reference import cli as reference_cli
from algorithms.credit_reference import replay, scoring
from envs.snapshot import snapshot
from envs.watch_repair import KEEP, REPAIR
from vcbm_gym.credit.base import CreditRule, EpisodeBatch

Z = 4.0  # a fixed seed makes a pass reproducible; 4 SE keeps a correct estimator far from the edge


def first_decision(policy_name: str, brand: int, k: int = 1500) -> dict[str, Any]:
    """The replay estimates at WatchRepair's first step for a given brand."""
    env = reference_cli.make_env("WatchRepair-v0")
    _, reset_info = env.reset(seed=brand, options={"brand": brand})
    policy, turn = replay.BehaviourPolicy(policy_name), replay.current_turn(env, 0, reset_info)
    returns = replay.replay_returns(env, snapshot(env), policy, 0, turn, reset_info, k, np.random.SeedSequence(7))
    return replay.replay_estimates(returns, policy.probabilities(turn))


@pytest.mark.parametrize("brand", [1, 3])
def test_uniform_first_decision_credit_is_half_the_expected_repair_return(brand):
    # Keeping the watch returns exactly 0, so under pi = (1/2, 1/2) Q - V is +-E[G | repair] / 2.
    truth = gym.make("WatchRepair-v0").unwrapped.params.expected_repair_return()[brand] / 2
    estimates = first_decision("uniform", brand)
    se = estimates["credit_se"][REPAIR]
    assert abs(truth) > Z * se  # the test can see a flipped sign
    assert np.sign(estimates["credit"][REPAIR]) == np.sign(truth)
    assert abs(estimates["credit"][REPAIR] - truth) < Z * se
    assert estimates["credit"][KEEP] == pytest.approx(-estimates["credit"][REPAIR])
    assert np.all(estimates["q_se"] >= 0) and estimates["q"][KEEP] == 0.0


def test_scripted_first_decision_weights_v_by_the_policy():
    # The scripted policy repairs brand 1 with probability 1: V = Q(repair), the taken action's credit is 0 and
    # keeping's is -E[G | repair] (an unweighted V would give both +-E / 2).
    expected = gym.make("WatchRepair-v0").unwrapped.params.expected_repair_return()[1]
    estimates = first_decision("scripted", 1)
    assert estimates["credit"][REPAIR] == 0.0
    assert abs(estimates["credit"][KEEP] + expected) < Z * estimates["credit_se"][KEEP]
    assert abs(estimates["v"] - expected) < Z * estimates["v_se"]


def test_reference_is_zero_mean_under_the_behaviour_policy():
    rng = np.random.default_rng(0)
    for _ in range(20):
        n = int(rng.integers(2, 6))
        probabilities = rng.dirichlet(np.ones(n))
        estimates = replay.replay_estimates(rng.normal(size=(n, 7)) * 10, probabilities)
        assert probabilities @ estimates["credit"] == pytest.approx(0.0, abs=1e-12)
        assert estimates["v"] == pytest.approx(probabilities @ estimates["q"])


def test_only_the_decision_carries_credit_and_branches_share_random_numbers():
    env = reference_cli.make_env("WatchRepair-v0")
    policy = replay.BehaviourPolicy("uniform")
    common = [replay.replay_episode(env, policy, seed, np.random.SeedSequence(seed), 4, True, "auto") for seed in range(8)]
    assert all(e.decision_step == 0 and len(e.credit) == 50 for e in common)
    assert all(e.credit[0] != 0 and np.all(e.credit[1:] == 0) and np.all(e.credit_se[1:] == 0) for e in common)
    # A repaired watch's later steps still have noise (counters, transport) for independent branches to disagree on.
    seed = next(seed for seed, e in enumerate(common) if e.actions[0] == REPAIR)
    independent = replay.replay_episode(env, policy, seed, np.random.SeedSequence(seed), 4, False, "auto")
    assert np.array_equal(independent.actions, common[seed].actions)  # the same episode, branched differently
    assert np.any(independent.credit[1:] != 0)


class Oracle(CreditRule):
    """A rule whose credit is a given reference (times `sign`), episode by episode in batch order."""

    name = "oracle"

    def __init__(self, references: list[np.ndarray], sign: float) -> None:
        self.references, self.sign = references, sign

    def advantages(self, batch: EpisodeBatch) -> np.ndarray:
        out = np.zeros(batch.rewards.shape)
        for row, reference in zip(out, self.references):
            row[: len(reference)] = self.sign * reference
        return out


def tiny_args(**changes: Any) -> argparse.Namespace:
    settings = dict(seed=3, episodes=4, train_episodes=0, batch_episodes=2, k=4, independent_branches=False, decision_step="auto")
    return argparse.Namespace(**{**settings, **changes})


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_the_reference_itself_scores_perfect_fidelity_and_its_negation_scores_wrong(monkeypatch, sign):
    env = reference_cli.make_env("WatchRepair-v0")
    policy, fit = replay.BehaviourPolicy("uniform"), replace(reference_cli.probe_branching(env, "WatchRepair-v0"), episodes=4)
    references = [e.credit for e in scoring.run_seed(env, policy, tiny_args(), 0, [], fit)["episodes"]]
    monkeypatch.setattr(scoring, "make_rule", lambda *args, **kwargs: Oracle(references, sign))
    rerun = scoring.run_seed(env, policy, tiny_args(), 0, ["oracle"], fit)  # the same seed replays the same episodes
    assert all(np.array_equal(a.credit, b) for a, b in zip(rerun["episodes"], references))
    summary = scoring.summarise(rerun["rules"]["oracle"]["scores"])
    value = {metric: summary[metric]["estimate"] for metric in scoring.METRICS}
    if sign > 0:
        assert value == pytest.approx({"sign_all": 1, "sign_nz": 1, "spearman": 1, "top_action": 1, "cosine": 1, "leakage": 0})
    else:
        assert value["sign_nz"] == 0 and value["cosine"] == pytest.approx(-1) and value["spearman"] == pytest.approx(-1)
        assert value["top_action"] == 0 and value["sign_all"] == pytest.approx(49 / 50)  # only the zeros agree


def test_a_tiny_run_writes_its_json_and_table(tmp_path, capsys):
    out = tmp_path / "new" / "ref_{env}.json"
    argv = ["--env", "WatchRepair-v0", "--rules", "broadcast,loo,casi", "--seeds", "2", "--episodes", "3", "--k", "2"]
    assert reference_cli.main([*argv, "--train-episodes", "4", "--batch-episodes", "2", "--out", str(out)]) == 0
    result = json.loads((tmp_path / "new" / "ref_WatchRepair-v0.json").read_text())
    assert set(result["rules"]) == {"broadcast", "loo", "casi"} and "refused" in result["rules"]["casi"]
    assert result["reference"]["leakage"]["estimate"] == 0.0 and len(result["reference_episodes"]) == 6
    assert result["rules"]["broadcast"]["summary"]["leakage"]["estimate"] == pytest.approx(49 / 50)
    table = (tmp_path / "new" / "ref_WatchRepair-v0.md").read_text()
    assert table.count("\n| `") == 3 and result["run"]["command"].startswith(reference_cli.PROG)


@pytest.mark.parametrize(
    "argv, start",
    [
        (["--k", "1"], "error: --k 1: expected an integer in [2,"),
        (["--rules", "broadcast,nope"], "error: --rules 'broadcast,nope': unknown ['nope']"),
        (["--env", "Pendulum-v1"], "error: --env 'Pendulum-v1': action space Box"),
        (["--env", "NoSuchEnv-v0"], "error: --env 'NoSuchEnv-v0': cannot be made"),
        (["--env", "WatchRepair-v0,WatchRepair-v0", "--out", "x.json"], "error: --out 'x.json': with several envs"),
        (["--env", "WatchRepair-v0", "--out", "x.txt"], "error: --out 'x.txt': expected a .json file path"),
        (["--decision-step", "first"], "error: --decision-step 'first': expected 'auto' or an integer"),
        (["--policy", "greedy"], "error: argument --policy: invalid choice"),
        (["--seed", "-1"], "error: --seed -1: expected an integer in [0,"),
        (["--episodes", "1"], "error: --episodes 1: expected an integer in [2,"),
        (["--env-kwargs", "[1, 2]"], "error: --env-kwargs '[1, 2]': expected a YAML mapping"),
        (["--env-kwargs", "{a: [}"], "error: --env-kwargs '{a: [}': expected a YAML mapping"),
        (["--env", "WatchRepair-v0", "--env-kwargs", "{no_such: 1}"], "error: --env 'WatchRepair-v0': cannot be made"),
    ],
)
def test_bad_input_is_one_line_before_anything_is_written(tmp_path, monkeypatch, capsys, argv, start):
    monkeypatch.chdir(tmp_path)
    out = ["--out", str(tmp_path / "new" / "r_{env}.json")] if "--out" not in argv else []
    assert reference_cli.main([*argv, *out]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(start), lines
    assert list(tmp_path.iterdir()) == []


def test_scripted_policy_needs_an_env_that_names_its_best_first_action(tmp_path, capsys):
    pytest.importorskip("bsuite")
    argv = ["--env", "umbrella_length/9", "--policy", "scripted", "--out", str(tmp_path / "new" / "r_{env}.json")]
    assert reference_cli.main(argv) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "does not report optimal_first_action" in lines[0]
    assert not (tmp_path / "new").exists()


def test_env_kwargs_reach_gym_make_and_the_recorded_settings(tmp_path, capsys):
    # bsuite's integer view: the observation becomes MultiDiscrete, which vcbm_bookmark's causal test reads
    pytest.importorskip("bsuite")
    out = tmp_path / "r_{env}.json"
    argv = ["--env", "umbrella_length/0", "--env-kwargs", "{integer_observations: true}", "--rules", "vcbm_bookmark"]
    argv += ["--seeds", "1", "--episodes", "4", "--train-episodes", "0", "--k", "2", "--out", str(out)]
    assert reference_cli.main(argv) == 0
    result = json.loads((tmp_path / "r_umbrella_length_0.json").read_text())
    assert result["settings"]["env_kwargs"] == {"integer_observations": True}
    assert "refused" not in result["rules"]["vcbm_bookmark"]


def test_per_episode_scores_are_stored_one_list_per_metric():
    rows = [{"sign_all": 1.0, "cosine": 0.5}, {"sign_all": 0.0, "leakage": 0.25}]
    assert reference_cli.columns(rows) == {"sign_all": [1.0, 0.0], "cosine": [0.5, None], "leakage": [None, 0.25]}
