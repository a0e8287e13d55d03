"""Two roles of one model in the LLM arm (`--algo ccpo`, algorithms/llm/two_role/trainer.py): each rule's role rewards by
hand, the rewards on each role's last token, the roles' prompts, the alternation schedule, the config's refusals,
and every base objective end to end."""

from __future__ import annotations

import json

import numpy as np
import pytest

from algorithms.llm.two_role.config import TwoRoleConfig, role_of_iteration, row_roles
from vcbm_gym.credit.base import EpisodeBatch
from vcbm_gym.credit.ccpo import credit_arguments, role_rewards

pytest.importorskip("trl")

from algorithms.common.errors import VcbmGymError  # noqa: E402
from algorithms.llm.generation.rollout import render  # noqa: E402
from algorithms.llm.two_role.trainer import TwoRoleTrainer, role_reward_batch  # noqa: E402
from algorithms.registry import get_arm  # noqa: E402
from algorithms.train import run  # noqa: E402

# one task group of four rollouts: R_joint, R_solo; the solo baseline is mean(R_solo) = -0.5
R_JOINT = [1, 1, -1, -1]
R_SOLO = [-1, 1, -1, -1]
GROUP = [7, 7, 7, 7]


# --- each rule's role rewards, by hand ---------------------------------------------------------------------
def test_ccpo_pays_the_thinker_the_event_bonus_against_the_group_solo_baseline_and_the_solver_the_shared_reward():
    thinker = role_rewards("ccpo", ["thinker"] * 4, R_JOINT, R_SOLO, GROUP)
    # baseline -0.5 < 0: every right joint answer is "helped" (+0.2), no wrong one is "hurt" (baseline not > 0)
    assert thinker.tolist() == pytest.approx([1.2, 1.2, -1.0, -1.0])
    assert role_rewards("ccpo", ["solver"] * 4, R_JOINT, R_SOLO, GROUP).tolist() == [1, 1, -1, -1]
    mixed = role_rewards("ccpo", ["thinker", "solver", "thinker", "solver"], R_JOINT, R_SOLO, GROUP)
    assert mixed.tolist() == pytest.approx([1.2, 1.0, -1.0, -1.0])


def test_ccpo_with_the_difference_bonus_and_the_rows_own_solo_outcome():
    # (R_joint - b) / 2 with b the group's -0.5: 0.75, 0.75, -0.25, -0.25, times 0.2
    diff = role_rewards("ccpo", ["thinker"] * 4, R_JOINT, R_SOLO, GROUP, bonus="difference")
    assert diff.tolist() == pytest.approx([1.15, 1.15, -1.05, -1.05])
    # each row's own R_solo as its baseline: row 1 (joint 1, solo 1) is no longer helped
    own = role_rewards("ccpo", ["thinker"] * 4, R_JOINT, R_SOLO, GROUP, group_baseline=False)
    assert own.tolist() == pytest.approx([1.2, 1.0, -1.0, -1.0])


def test_the_shapley_form_sums_to_the_joint_outcome_and_grpo_pays_both_roles_the_shared_reward():
    thinker = role_rewards("shapley", ["thinker"] * 4, R_JOINT, R_SOLO, GROUP)
    solver = role_rewards("shapley", ["solver"] * 4, R_JOINT, R_SOLO, GROUP)
    assert thinker.tolist() == [1.0, 0.0, 0.0, 0.0]  # (joint - solo) / 2
    assert solver.tolist() == [0.0, 1.0, -1.0, -1.0]  # solo / 2 + joint / 2
    assert (thinker + solver).tolist() == R_JOINT
    for role in ("thinker", "solver"):
        assert role_rewards("grpo", [role] * 4, R_JOINT, R_SOLO, GROUP).tolist() == R_JOINT


def test_sepo_shifts_each_role_by_its_centred_share():
    # rows 0-1: both raters give the Thinker 0.7 -> s1 = 0.7, s2 = 0.3, w1 = 0.7; rows 2-3: both 0.5 -> w1 = 0.5
    thinker_splits = solver_splits = [[0.7, 0.3], [0.7, 0.3], [0.5, 0.5], [0.5, 0.5]]
    args = (R_JOINT, R_SOLO, GROUP, thinker_splits, solver_splits)
    # centred w1: +0.1, +0.1, -0.1, -0.1; R + 0.2 bonus when right, R - 0.2 bonus when wrong
    assert role_rewards("sepo", ["thinker"] * 4, *args).tolist() == pytest.approx([1.02, 1.02, -0.98, -0.98])
    assert role_rewards("sepo", ["solver"] * 4, *args).tolist() == pytest.approx([0.98, 0.98, -1.02, -1.02])
    with pytest.raises(ValueError, match="thinker_splits and solver_splits"):
        role_rewards("sepo", ["thinker"] * 4, R_JOINT, R_SOLO, GROUP)


def test_sepo_is_grpo_when_every_rating_falls_back():
    # both raters at (0.5, 0.5): s1 = s2 = 0.5, w = 0.5 in every row, centred 0: no bonus
    fallback = [[0.5, 0.5]] * 4
    for role in ("thinker", "solver"):
        sepo = role_rewards("sepo", [role] * 4, R_JOINT, R_SOLO, GROUP, fallback, fallback)
        assert sepo.tolist() == role_rewards("grpo", [role] * 4, R_JOINT, R_SOLO, GROUP).tolist()


@pytest.mark.parametrize(
    "credit, kwargs, match",
    [
        ("loo", {}, "expected one of ccpo, sepo, shapley, grpo"),
        ("ccpo", {"bonus": "ratio"}, "bonus='ratio'"),
        ("ccpo", {"beta": 1}, "has 'beta': expected only bonus, lam, group_baseline"),
        ("sepo", {"eta": 2}, "eta"),
        ("shapley", {"lam": 0.2}, "expected only none"),
    ],
)
def test_bad_rule_arguments_are_one_line(credit, kwargs, match):
    with pytest.raises(ValueError, match=match):
        credit_arguments(credit, kwargs)


def test_bad_rows_are_one_line():
    with pytest.raises(ValueError, match="roles"):
        role_rewards("grpo", ["thinker", "judge", "solver", "solver"], R_JOINT, R_SOLO, GROUP)
    with pytest.raises(ValueError, match=r"r_solo\[0\]=0.5"):
        role_rewards("grpo", ["solver"] * 4, R_JOINT, [0.5, 1, 1, 1], GROUP)


# --- the schedule --------------------------------------------------------------------------------------------
def test_the_roles_alternate_every_switch_every_iterations_thinker_first():
    roles = [role_of_iteration(i, "alternate", 10) for i in range(41)]
    assert roles[:10] == ["thinker"] * 10 and roles[10:20] == ["solver"] * 10
    assert roles[20:30] == ["thinker"] * 10 and roles[30:40] == ["solver"] * 10 and roles[40] == "thinker"
    assert [role_of_iteration(i, "alternate", 1) for i in range(4)] == ["thinker", "solver", "thinker", "solver"]
    assert role_of_iteration(5, "both", 10) == "both"


def test_under_both_the_task_groups_alternate_between_the_roles():
    assert row_roles("both", 8, 2) == ["thinker", "thinker", "solver", "solver"] * 2
    assert row_roles("solver", 3, 2) == ["solver"] * 3


# --- rewards on each role's last token ---------------------------------------------------------------------------
def test_each_rows_role_reward_sits_on_its_last_generated_token_with_a_group_per_task_and_role():
    mask = np.zeros((4, 6), bool)
    for b, length in enumerate((3, 5, 2, 6)):
        mask[b, :length] = True
    batch = EpisodeBatch(
        rewards=np.zeros((4, 6)),
        mask=mask,
        group_ids=np.array([7, 7, 7, 7]),
        extras={
            "role": ["thinker", "thinker", "solver", "solver"],
            "r_joint": R_JOINT,
            "r_solo": R_SOLO,
            "thinker_split": [[0.5, 0.5]] * 4,
            "solver_split": [[0.5, 0.5]] * 4,
        },
    )
    out = role_reward_batch(batch, "ccpo", credit_arguments("ccpo"))
    expected = np.zeros((4, 6))
    expected[0, 2], expected[1, 4], expected[2, 1], expected[3, 5] = 1.2, 1.2, -1.0, -1.0
    assert np.allclose(out.rewards, expected)
    assert out.group_ids[0] == out.group_ids[1] != out.group_ids[2] == out.group_ids[3]


@pytest.fixture(scope="module")
def captured(tmp_path_factory):
    """A 2-iteration ccpo run (switch every iteration), each iteration's trained rows and advantages captured."""
    seen = []
    original = TwoRoleTrainer.token_advantages

    def capture(self, batch):
        advantages = original(self, batch)
        tok = self.processing_class
        seen.append(
            {
                "roles": list(self._row_extras["role"]),
                "prompts": [e.messages[1]["content"] for e in self._episodes],
                "ids_match": all(
                    e.prompt_ids == tok(render(tok, e.messages[:2], True), add_special_tokens=False)["input_ids"]
                    for e in self._episodes
                ),
                "r_joint": list(self._row_extras["r_joint"]),
                "r_solo": list(self._row_extras["r_solo"]),
                "groups": batch.group_ids.tolist(),
                "mask": batch.mask.copy(),
                "advantages": advantages.copy(),
                "solo_prompts": [e.messages[1]["content"] for e in self._play.solo],
                "notes": [e.messages[2]["content"] for e in self._play.thinker],
            }
        )
        return advantages

    mp = pytest.MonkeyPatch()
    mp.setattr(TwoRoleTrainer, "token_advantages", capture)
    log = tmp_path_factory.mktemp("ccpo") / "run"
    try:
        run(
            [
                "--algo",
                "ccpo",
                "--env",
                "TextThinkSolve-v0",
                "--model",
                "tiny",
                "--iterations",
                "2",
                "--switch-every",
                "1",
                "--no-progress",
                "--log-dir",
                str(log),
                "--hyperparams",
                "generation_batch_size=8",
                "num_generations=4",
            ]
        )
    finally:
        mp.undo()
    return seen, json.loads((log / "history.json").read_text())


def test_the_trained_rows_are_the_thinkers_notes_then_the_solvers_answers(captured):
    seen, history = captured
    assert seen[0]["roles"] == ["thinker"] * 8 and seen[1]["roles"] == ["solver"] * 8
    assert [h["thinker_rows"] for h in history] == [1.0, 0.0]
    assert seen[0]["ids_match"] and seen[1]["ids_match"]  # each row's prompt is its own role's observation alone
    for prompt in seen[0]["prompts"]:
        assert "Role: Thinker" in prompt and "service record, which only you see" in prompt
    for prompt, note in zip(seen[1]["prompts"], seen[1]["notes"]):
        # the Solver's row: its own prompt with the note, never the Thinker's record
        assert "Role: Solver" in prompt and "only you see" not in prompt and note.strip() in prompt
    for it in seen:
        assert all("No note was left for you" in p for p in it["solo_prompts"])


def test_the_advantage_is_the_role_reward_minus_its_group_mean_on_every_generated_token(captured):
    seen, _ = captured
    for it in seen:
        role = it["roles"][0]
        reward = role_rewards("ccpo", it["roles"], it["r_joint"], it["r_solo"], it["groups"])
        groups = np.array(it["groups"])
        centred = reward - np.array([reward[groups == g].mean() for g in groups])  # GRPO without std
        for b in range(8):
            on = it["mask"][b]
            assert np.allclose(it["advantages"][b, on], centred[b]), role
            assert np.allclose(it["advantages"][b, ~on], 0.0)


def test_the_history_records_joint_and_solo_success_and_the_thinkers_help(captured):
    _, history = captured
    for h in history:
        assert h["thinker_help"] == pytest.approx(h["task_goal_completion"] - h["solo_task_goal_completion"])
        assert h["mean_return"] == pytest.approx(2 * h["task_goal_completion"] - 1)  # no noise: R = +-1 by success


# --- the CLI and the config ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("objective", ["gspo", "reinforce_pp"])
def test_every_base_objective_trains_under_each_role_schedule(tmp_path, objective):
    summary = run(
        [
            "--algo",
            "ccpo",
            "--env",
            "TextThinkSolve-v0",
            "--credit",
            "sepo",
            "--model",
            "tiny",
            "--iterations",
            "2",
            "--objective",
            objective,
            "--role-schedule",
            "both",
            "--no-progress",
            "--log-dir",
            str(tmp_path / "r"),
            "--hyperparams",
            "generation_batch_size=8",
            "num_generations=4",
        ]
    )
    history = json.loads((tmp_path / "r" / "history.json").read_text())
    assert summary["iterations_run"] == 2 and summary["credit"] == "sepo"
    assert [h["thinker_rows"] for h in history] == [0.5, 0.5]  # two task groups: one per role
    config = (tmp_path / "r" / "config.yml").read_text()
    assert f"objective: {objective}" in config and "role_schedule: both" in config


def test_the_arm_takes_the_two_role_rules_and_refuses_others_in_one_line(run_cli, tmp_path):
    arm = get_arm("ccpo")
    assert arm.default_credit("ccpo") == "ccpo" and arm.credit_rules("ccpo") == ("ccpo", "sepo", "shapley", "grpo")
    assert "expected one of the two-role rules" in arm.credit_misfit("loo", "ccpo")
    done = run_cli(
        "algorithms.train",
        "--algo",
        "ccpo",
        "--env",
        "TextThinkSolve-v0",
        "--credit",
        "loo",
        "--model",
        "tiny",
        "--iterations",
        "1",
        "--log-dir",
        str(tmp_path / "bad"),
    )
    lines = done.stderr.strip().splitlines()
    assert done.returncode != 0 and len(lines) == 1 and "credit='loo'" in lines[0], done.stderr
    assert not (tmp_path / "bad").exists()


def test_a_single_role_env_is_refused_before_anything_is_written(tmp_path):
    with pytest.raises(VcbmGymError, match="no reset option 'solo'"):
        run(
            [
                "--algo",
                "ccpo",
                "--env",
                "TextWatchRepair-v0",
                "--model",
                "tiny",
                "--iterations",
                "1",
                "--log-dir",
                str(tmp_path / "bad"),
                "--hyperparams",
                "max_turns=6",
            ]
        )
    assert not (tmp_path / "bad").exists()


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"role_schedule": "round-robin"}, "role_schedule='round-robin'"),
        ({"switch_every": 0}, "switch_every=0"),
        ({"credit_kwargs": {"loo": {}}}, "credit_kwargs\\['loo'\\]"),
        ({"ratio_sharing": "effect"}, "ratio_sharing='effect' for ccpo"),
    ],
)
def test_the_config_refuses_bad_two_role_settings(tmp_path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        TwoRoleConfig(output_dir=str(tmp_path), use_cpu=True, **kwargs)
