"""The LLM arm as an `Arm`: resolved once (configs and credit rule in `RunSpec.config`), the env's info keys
from the rule's own declarations, and the settings the run decides itself."""

import pytest

pytest.importorskip("trl")

from algorithms.common.errors import ConfigError  # noqa: E402
from algorithms.common.spec import RunOptions  # noqa: E402
from algorithms.llm.config import LoopConfig, LoopRunConfig, MultiTurnGRPOConfig  # noqa: E402
from algorithms.llm.runner import ARM, LLMArm, info_needs  # noqa: E402
from algorithms.train import execute, resolve_spec  # noqa: E402
from vcbm_gym.credit import base as credit_base  # noqa: E402
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


def test_resolve_builds_each_config_and_the_rule_once_and_a_run_starts_from_that_rule(tmp_path, monkeypatch):
    built = {"loop_config": 0, "rule": 0}
    post_init, make_rule = LoopConfig.__post_init__, credit_base.make_rule

    def counting_post_init(self):
        built["loop_config"] += 1
        post_init(self)

    def counting_make_rule(*args, **kwargs):
        built["rule"] += 1
        return make_rule(*args, **kwargs)

    monkeypatch.setattr(LoopConfig, "__post_init__", counting_post_init)
    monkeypatch.setattr(credit_base, "make_rule", counting_make_rule)
    spec = resolve_spec("vcbm-loop", "TextWatchRepair-v0", 0, SMALL)
    assert built == {"loop_config": 1, "rule": 1}
    config = spec.config
    assert isinstance(config.run, LoopRunConfig) and isinstance(config.trainer, LoopConfig)
    assert isinstance(config.rule, VCBMBlendRule) and config.rule.memory.capacity == 100_000  # the LLM arm's default
    assert config.trainer.max_steps == 1 * config.trainer.num_iterations and spec.hyperparams["iterations"] == 1
    summary = execute(spec, tmp_path / "run", RunOptions(progress=False))
    assert built == {"loop_config": 1, "rule": 1}  # validate and run build neither again
    assert summary["memory_size"] == len(config.rule.memory) > 0  # the run trained the rule resolve built
    again = config.take_rule()  # a second run of the spec (or of a sibling seed) starts from an untrained rule
    assert built["rule"] == 2 and again is not config.rule and len(again.memory) == 0 and again.memory.capacity == 100_000
    assert config.trainer.output_dir != str(tmp_path / "run" / "checkpoints")  # the spec's config stays as resolved
    trl = resolve_spec("trl-grpo", "TextWatchRepair-v0", 0, {"model": "tiny-random"}).config
    assert type(trl.trainer) is MultiTurnGRPOConfig and trl.rule is None


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
