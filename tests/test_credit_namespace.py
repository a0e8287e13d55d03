"""One credit namespace: `--credit NAME` resolves through the credit registry (vcbm_gym/credit/registry.py) and is
checked by the algo's CreditFit (algorithms/common/credit_slot.py) for every algo, the two-role LLM arm's (`ccpo`)
included; a rule an arm cannot run is one line naming the rule and the arm."""

from __future__ import annotations

import pytest

from algorithms import train
from algorithms.common.credit_slot import CREDIT_RECORD, credit_record
from algorithms.common.errors import VcbmGymError
from algorithms.registry import get_arm
from vcbm_gym.credit import registry

pytest.importorskip("trl")

TWO_ROLE = ("ccpo", "sepo", "shapley", "grpo")  # grpo: both roles paid the shared reward (the baseline)


def resolved_rule(argv: list[str]) -> dict:
    """config.yml's record of the rule the command line resolves to (name, distribution, version)."""
    return credit_record(train.resolve_argv(argv).config).get(CREDIT_RECORD, {})


@pytest.mark.parametrize("credit", TWO_ROLE)
def test_ccpo_takes_each_two_role_credit_as_a_rule_of_the_registry(credit):
    assert credit in registry.rule_names()
    assert credit in get_arm("ccpo").credit_rules("ccpo")
    record = resolved_rule(["--algo", "ccpo", "--env", "TextThinkSolve-v0", "--credit", credit])
    assert record == registry.rule_record(credit) and record["name"] == credit


def test_loop_resolves_its_rule_through_the_same_lookup():
    assert resolved_rule(["--algo", "loop", "--env", "TextWatchRepair-v0", "--credit", "loo"]) == registry.rule_record("loo")


def test_a_rule_registered_in_process_reaches_the_two_role_arm_by_the_same_lookup():
    cls = registry.rule_class("ccpo")
    twin = type("TwinCCPO", (cls,), {"name": "ccpo_twin"})
    registry.register_rule("ccpo_twin", twin)
    try:
        assert "ccpo_twin" in get_arm("ccpo").credit_rules("ccpo")
        assert get_arm("loop").credit_misfit("ccpo_twin", "loop") is not None
    finally:
        registry.unregister_rule("ccpo_twin")


@pytest.mark.parametrize(
    "algo, env, credit, arm",
    [
        ("loop", "TextWatchRepair-v0", "sepo", "llm arm"),
        ("loop", "TextWatchRepair-v0", "shapley", "llm arm"),
        ("ppo", "WatchRepair-v0", "sepo", "sb3 arm"),
        ("td", "WatchRepair-v0", "ccpo", "tabular arm"),
        ("ccpo", "TextThinkSolve-v0", "vcbm_blend", "ccpo (two-role LLM) arm"),
        ("ccpo", "TextThinkSolve-v0", "none", "ccpo (two-role LLM) arm"),
    ],
)
def test_a_rule_the_arm_cannot_run_is_one_line_naming_the_rule_and_the_arm(capsys, algo, env, credit, arm):
    with pytest.raises((SystemExit, VcbmGymError)) as caught:
        train.resolve_argv(["--algo", algo, "--env", env, "--credit", credit])
    line = str(caught.value) if isinstance(caught.value, VcbmGymError) else capsys.readouterr().err.strip().splitlines()[-1]
    assert f"'{credit}'" in line and arm in line, line
