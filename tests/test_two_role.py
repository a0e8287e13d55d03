"""Two roles of one model in the LLM arm (`--algo ccpo`, algorithms/llm/two_role/trainer.py): each rule's role rewards by
hand, the rewards on each role's last token, the roles' prompts, the alternation schedule, the config's refusals,
and every base objective end to end."""

from __future__ import annotations

import json

import numpy as np
import pytest

from algorithms.common.credit_slot import CreditSlot
from algorithms.common.errors import ConfigError
from algorithms.llm.two_role.config import TWO_ROLE_CREDIT, TwoRoleConfig, role_of_iteration, row_roles
from vcbm_gym.credit.base import EpisodeBatch
from vcbm_gym.credit.registry import make_rule

pytest.importorskip("trl")

from algorithms.common.errors import VcbmGymError  # noqa: E402
from algorithms.llm.generation.rollout import render  # noqa: E402
from algorithms.llm.two_role.trainer import TwoRoleTrainer, shared_reward_batch  # noqa: E402
from algorithms.registry import get_arm  # noqa: E402
from algorithms.train import run  # noqa: E402

# one task group of four rollouts: R_joint, R_solo; the solo baseline is mean(R_solo) = -0.5
R_JOINT = [1, 1, -1, -1]
R_SOLO = [-1, 1, -1, -1]
GROUP = [7, 7, 7, 7]


def two_role_batch(roles, r_joint=R_JOINT, r_solo=R_SOLO, groups=GROUP, thinker_splits=None, solver_splits=None):
    """Rows of one token each, as the two-role trainer fills a batch: R_joint on the token, the rows' inputs in extras
    (every rating the fallback (0.5, 0.5) unless given)."""
    fallback = [[0.5, 0.5]] * len(roles)
    extras = {
        "role": roles,
        "r_joint": r_joint,
        "r_solo": r_solo,
        "thinker_split": fallback if thinker_splits is None else thinker_splits,
        "solver_split": fallback if solver_splits is None else solver_splits,
    }
    return EpisodeBatch(np.array(r_joint, float)[:, None], np.ones((len(roles), 1), bool), np.array(groups), extras=extras)


def role_rewards(credit, roles, *rows, **kwargs):
    """Each row's reward in its role under registered rule `credit`, built as a run builds it."""
    return make_rule(credit, **kwargs).role_rewards(two_role_batch(roles, *rows))


# --- each rule's role rewards, by hand ---------------------------------------------------------------------
def test_ccpo_pays_the_thinker_the_event_bonus_against_the_group_solo_baseline_and_the_solver_the_shared_reward():
    thinker = role_rewards("ccpo", ["thinker"] * 4)
    # baseline -0.5 < 0: every right joint answer is "helped" (+0.2), no wrong one is "hurt" (baseline not > 0)
    assert thinker.tolist() == pytest.approx([1.2, 1.2, -1.0, -1.0])
    assert role_rewards("ccpo", ["solver"] * 4).tolist() == [1, 1, -1, -1]
    mixed = role_rewards("ccpo", ["thinker", "solver", "thinker", "solver"])
    assert mixed.tolist() == pytest.approx([1.2, 1.0, -1.0, -1.0])


def test_ccpo_with_the_difference_bonus_and_the_rows_own_solo_outcome():
    # (R_joint - b) / 2 with b the group's -0.5: 0.75, 0.75, -0.25, -0.25, times 0.2
    diff = role_rewards("ccpo", ["thinker"] * 4, bonus="difference")
    assert diff.tolist() == pytest.approx([1.15, 1.15, -1.05, -1.05])
    # each row's own R_solo as its baseline: row 1 (joint 1, solo 1) is no longer helped
    own = role_rewards("ccpo", ["thinker"] * 4, group_baseline=False)
    assert own.tolist() == pytest.approx([1.2, 1.0, -1.0, -1.0])


def test_the_shapley_form_sums_to_the_joint_outcome():
    thinker = role_rewards("shapley", ["thinker"] * 4)
    solver = role_rewards("shapley", ["solver"] * 4)
    assert thinker.tolist() == [1.0, 0.0, 0.0, 0.0]  # (joint - solo) / 2
    assert solver.tolist() == [0.0, 1.0, -1.0, -1.0]  # solo / 2 + joint / 2
    assert (thinker + solver).tolist() == R_JOINT


def test_sepo_shifts_each_role_by_its_centred_share():
    # rows 0-1: both raters give the Thinker 0.7 -> s1 = 0.7, s2 = 0.3, w1 = 0.7; rows 2-3: both 0.5 -> w1 = 0.5
    thinker_splits = solver_splits = [[0.7, 0.3], [0.7, 0.3], [0.5, 0.5], [0.5, 0.5]]
    rows = (R_JOINT, R_SOLO, GROUP, thinker_splits, solver_splits)
    # centred w1: +0.1, +0.1, -0.1, -0.1; R + 0.2 bonus when right, R - 0.2 bonus when wrong
    assert role_rewards("sepo", ["thinker"] * 4, *rows).tolist() == pytest.approx([1.02, 1.02, -0.98, -0.98])
    assert role_rewards("sepo", ["solver"] * 4, *rows).tolist() == pytest.approx([0.98, 0.98, -1.02, -1.02])


def test_sepo_pays_the_shared_reward_when_every_rating_falls_back():
    # both raters at (0.5, 0.5): s1 = s2 = 0.5, w = 0.5 in every row, centred 0: no bonus
    for role in ("thinker", "solver"):
        assert role_rewards("sepo", [role] * 4).tolist() == R_JOINT


def test_each_role_is_trained_on_its_reward_minus_its_mean_over_the_tasks_rows_of_that_role():
    batch = two_role_batch(["thinker", "thinker", "solver", "solver"])
    # role rewards 1.2, 1.2 (Thinker) and -1, -1 (Solver): each role's rows centred on their own mean
    assert make_rule("ccpo").advantages(batch)[:, 0].tolist() == pytest.approx([0.0, 0.0, 0.0, 0.0])
    batch = two_role_batch(["thinker"] * 4)
    assert make_rule("ccpo").advantages(batch)[:, 0].tolist() == pytest.approx([1.1, 1.1, -1.1, -1.1])


@pytest.mark.parametrize(
    "credit, kwargs, match",
    [
        ("ccpo", {"bonus": "ratio"}, "bonus='ratio'"),
        ("ccpo", {"beta": 1}, "credit rule 'ccpo'.*'beta'"),
        ("sepo", {"eta": 2}, "eta"),
        ("shapley", {"lam": 0.2}, "credit rule 'shapley'.*'lam'"),
    ],
)
def test_bad_rule_arguments_are_one_line(credit, kwargs, match):
    with pytest.raises(ConfigError, match=match) as caught:
        CreditSlot(credit, {credit: kwargs}).build(TWO_ROLE_CREDIT)
    assert "\n" not in str(caught.value)


def test_bad_rows_are_one_line():
    with pytest.raises(ValueError, match="role"):
        role_rewards("shapley", ["thinker", "judge", "solver", "solver"])
    with pytest.raises(ValueError, match=r"r_solo'\]\[0\]=0.5"):
        role_rewards("shapley", ["solver"] * 4, R_JOINT, [0.5, 1, 1, 1])


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


# --- the shared reward on each row's last token ------------------------------------------------------------------
def test_the_shared_reward_sits_on_each_rows_last_generated_token():
    mask = np.zeros((4, 6), bool)
    for b, length in enumerate((3, 5, 2, 6)):
        mask[b, :length] = True
    batch = two_role_batch(["thinker", "thinker", "solver", "solver"])
    batch = EpisodeBatch(np.zeros((4, 6)), mask, batch.group_ids, extras=batch.extras)
    out = shared_reward_batch(batch)
    expected = np.zeros((4, 6))
    expected[0, 2], expected[1, 4], expected[2, 1], expected[3, 5] = 1, 1, -1, -1
    assert np.allclose(out.rewards, expected) and out.group_ids.tolist() == GROUP


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
        flags = ("--iterations", "2", "--switch-every", "1", "--no-progress")
        run(ccpo_argv(log, *flags, "--hyperparams", "generation_batch_size=8", "num_generations=4"))
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
def ccpo_argv(log_dir, *flags: str, env: str = "TextThinkSolve-v0") -> list[str]:
    """A short `--algo ccpo` command line on `env` (tiny model, one iteration unless `flags` say otherwise)."""
    return ["--algo", "ccpo", "--env", env, "--model", "tiny", "--iterations", "1", "--log-dir", str(log_dir), *flags]


@pytest.mark.parametrize("objective", ["gspo", "reinforce_pp"])
def test_every_base_objective_trains_under_each_role_schedule(tmp_path, objective):
    flags = ("--credit", "sepo", "--iterations", "2", "--objective", objective, "--role-schedule", "both", "--no-progress")
    summary = run(ccpo_argv(tmp_path / "r", *flags, "--hyperparams", "generation_batch_size=8", "num_generations=4"))
    history = json.loads((tmp_path / "r" / "history.json").read_text())
    assert summary["iterations_run"] == 2 and summary["credit"] == "sepo"
    assert [h["thinker_rows"] for h in history] == [0.5, 0.5]  # two task groups: one per role
    config = (tmp_path / "r" / "config.yml").read_text()
    assert f"objective: {objective}" in config and "role_schedule: both" in config


def test_the_arm_takes_the_rules_that_fit_the_two_role_trainer_and_refuses_others_in_one_line(run_cli, tmp_path):
    arm = get_arm("ccpo")
    assert arm.default_credit("ccpo") == "ccpo"
    assert {"ccpo", "sepo", "shapley", "grpo"} <= set(arm.credit_rules("ccpo")) and "none" not in arm.credit_rules("ccpo")
    assert "which the ccpo (two-role LLM) arm does not provide" in arm.credit_misfit("vcbm_blend", "ccpo")
    done = run_cli("algorithms.train", *ccpo_argv(tmp_path / "bad", "--credit", "vcbm_blend"))
    lines = done.stderr.strip().splitlines()
    assert done.returncode != 0 and len(lines) == 1 and "credit rule 'vcbm_blend'" in lines[0], done.stderr
    assert not (tmp_path / "bad").exists()


def test_a_single_role_env_is_refused_before_anything_is_written(tmp_path):
    with pytest.raises(VcbmGymError, match="no reset option 'solo'"):
        run(ccpo_argv(tmp_path / "bad", "--hyperparams", "max_turns=6", env="TextWatchRepair-v0"))
    assert not (tmp_path / "bad").exists()


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"role_schedule": "round-robin"}, "role_schedule='round-robin'"),
        ({"switch_every": 0}, "switch_every=0"),
        ({"credit_kwargs": {"nope": {}}}, "credit_kwargs\\['nope'\\]"),
        ({"credit": "vcbm_blend"}, "credit rule 'vcbm_blend' needs .* which the ccpo \\(two-role LLM\\) arm"),
        ({"ratio_sharing": "effect"}, "ratio_sharing='effect' for ccpo"),
    ],
)
def test_the_config_refuses_bad_two_role_settings(tmp_path, kwargs, match):
    with pytest.raises(ValueError, match=match):
        TwoRoleConfig(output_dir=str(tmp_path), use_cpu=True, **kwargs)
