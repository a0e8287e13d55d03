"""The LLM arm as an `Arm`: resolved once (configs and credit rule in `RunSpec.config`), the env's info keys
from the rule's own declarations, and the settings the run decides itself."""

import pytest

pytest.importorskip("trl")

from algorithms.common import credit_slot  # noqa: E402
from algorithms.common.credit_slot import CreditSlot  # noqa: E402
from algorithms.common.errors import ConfigError  # noqa: E402
from algorithms.common.spec import RunOptions  # noqa: E402
from algorithms.llm.config import LoopConfig, LoopRunConfig, MultiTurnGRPOConfig  # noqa: E402
from algorithms.llm.runner import ARM, LLMArm, info_needs  # noqa: E402
from algorithms.train import execute, resolve_spec  # noqa: E402
from vcbm_gym.credit.vcbm_blend import VCBMBlendRule  # noqa: E402

SMALL = {
    "model": "tiny-random",
    "iterations": 1,
    "env_kwargs": {"max_turns": 2},
    "max_turns": 2,
    "generation_batch_size": 4,
    "num_generations": 2,
    "max_new_tokens_per_turn": 4,
}


def test_the_arm_declares_what_the_experiment_commands_read():
    assert isinstance(ARM, LLMArm) and ARM.name == "llm"
    assert (ARM.budget_key, ARM.budget_flag, ARM.budget_unit) == ("iterations", "--iterations", "iterations")
    assert ARM.objective.direction == "maximize" and ARM.multi_process and ARM.resumes_itself and not ARM.reports_convergence
    assert ARM.metric_tags == {"correct": "loop/task_goal_completion", "return": "loop/mean_return"}
    assert [ARM.default_credit(a) for a in ("loop", "vcbm-loop", "trl-grpo")] == ["loo", "vcbm_blend", "none"]
    assert ARM.method_label("vcbm-loop", "vcbm_blend") == "vcbm-loop" and ARM.method_label("loop", "grpo") == "loop+grpo"
    assert "turn_flags['state_mutating']" in ARM.batch_provides and "observations" not in ARM.batch_provides


def test_resolve_builds_each_config_once_and_each_run_builds_its_own_rule(tmp_path, monkeypatch):
    built = {"loop_config": 0, "rule": 0}
    post_init, make_rule = LoopConfig.__post_init__, credit_slot.make_rule
    rules: list = []

    def counting_post_init(self):
        built["loop_config"] += 1
        post_init(self)

    def counting_make_rule(*args, **kwargs):
        built["rule"] += 1
        rules.append(make_rule(*args, **kwargs))
        return rules[-1]

    monkeypatch.setattr(LoopConfig, "__post_init__", counting_post_init)
    monkeypatch.setattr(credit_slot, "make_rule", counting_make_rule)
    spec = resolve_spec("vcbm-loop", "TextWatchRepair-v0", 0, SMALL)
    assert built == {"loop_config": 1, "rule": 1}  # the rule built dry (a bad argument fails here), as in every arm
    config = spec.config
    assert isinstance(config.run, LoopRunConfig) and isinstance(config.trainer, LoopConfig)
    assert config.slot == CreditSlot("vcbm_blend", config.trainer.credit_kwargs)  # the spec carries the recipe
    summary = execute(spec, tmp_path / "run", RunOptions(progress=False))
    assert built == {"loop_config": 1, "rule": 2}  # the run built its own
    trained = rules[-1]
    assert isinstance(trained, VCBMBlendRule) and trained.memory.capacity == 100_000  # the LLM arm's default
    assert summary["memory_size"] == len(trained.memory) > 0 and len(rules[0].memory) == 0
    assert config.trainer.output_dir != str(tmp_path / "run" / "checkpoints")  # the spec's config stays as resolved
    trl = resolve_spec("trl-grpo", "TextWatchRepair-v0", 0, {"model": "tiny-random"}).config
    assert type(trl.trainer) is MultiTurnGRPOConfig and trl.slot is None


def test_the_env_must_report_what_the_rule_declares_but_what_the_rollout_stands_in_for(monkeypatch):
    assert VCBMBlendRule.info_needs == ("state_mutating", "execution_output")
    assert info_needs("vcbm_blend", "none") == {"state_mutating": "--credit vcbm_blend (vcbm-loop)"}
    assert info_needs("gigpo", "random") == {}
    monkeypatch.setattr(VCBMBlendRule, "info_needs", ("effect",))  # the rule's declaration, not a branch on its name
    assert info_needs("vcbm_blend", "none") == {"effect": "--credit vcbm_blend (vcbm-loop)"}


def test_settings_the_run_decides_itself_are_refused_as_hyperparameters():
    for key, value, source in (
        ("max_steps", 5, "iterations x num_iterations"),
        ("seed", 3, "--seed"),
        ("output_dir", "x", "<log-dir>"),
    ):
        with pytest.raises(ConfigError) as excinfo:
            resolve_spec("loop", "TextWatchRepair-v0", 0, {**SMALL, key: value})
        message = str(excinfo.value)
        assert "\n" not in message and f"hyperparameter {key}={value!r}" in message and source in message, message
