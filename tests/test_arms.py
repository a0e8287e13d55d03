"""The tabular and SB3 arms as `Arm` objects : one resolution into a frozen RunSpec holding the typed
config, stable config hashes, runs that read the typed config only, and credit rules checked by their own
declarations against what each arm provides."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
import types

import numpy as np
import pytest
import yaml

from algorithms import train
from algorithms.common import credit_slot
from algorithms.common.credit_slot import CreditSlot
from algorithms.common.errors import VcbmGymError
from algorithms.common.spec import EPISODES, Arm, RunOptions, RunSpec
from algorithms.registry import ALGOS, get_arm
from algorithms.sb3 import runner as sb3_runner
from algorithms.tabular import runner as tabular_runner
from algorithms.tabular.vcbm import VCBMConfig
from vcbm_gym.credit import registry as credit_registry
from vcbm_gym.credit.base import CreditRule, EpisodeBatch


def old_identity_hash(algo: str, env: str, seed: int, hyperparams: dict) -> str:
    """The config hash as algorithms.train computed it before RunSpec: sha256 of the sorted JSON identity, 16 hex."""
    identity = {"algo": algo, "env": env, "seed": seed, "hyperparams": hyperparams}
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]


@pytest.mark.parametrize(("algo", "arm_class", "name"), [("vcbm", "TabularArm", "tabular"), ("ppo", "SB3Arm", "sb3")])
def test_each_arm_is_an_arm_object_with_its_attributes(algo, arm_class, name):
    arm = get_arm(algo)
    assert isinstance(arm, Arm) and type(arm).__name__ == arm_class and arm.name == name
    assert (arm.budget_key, arm.budget_flag, arm.budget_unit) == ("max_episodes", "--max-episodes", "episodes")
    assert arm.objective is EPISODES and arm.reports_convergence
    assert set(arm.metric_tags) == {"correct", "return"}
    assert not arm.multi_process and not arm.resumes_itself
    assert {"observations", "actions"} <= arm.batch_provides and arm.info_provides == frozenset()
    assert arm.method_label(algo, "none") == algo and arm.method_label(algo, "rudder") == f"{algo}+rudder"


def test_tabular_resolve_builds_the_typed_config_once_and_keeps_the_table_ii_hash():
    spec = train.resolve_spec("vcbm", "WatchRepair-v0", 0)
    assert isinstance(spec, RunSpec)
    config = spec.config
    assert isinstance(config, tabular_runner.TabularConfig) and config.credit is None
    assert isinstance(config.run, tabular_runner.TabularRunConfig) and isinstance(config.agent, VCBMConfig)
    assert config.agent.causal_test == "frequency"  # zoo_configs/vcbm.yml: the paper's test for Table II
    expected = {
        **dataclasses.asdict(tabular_runner.TabularRunConfig()),
        **dataclasses.asdict(VCBMConfig(causal_test="frequency")),
    }
    assert dict(spec.hyperparams) == expected
    assert spec.config_hash == old_identity_hash("vcbm", "WatchRepair-v0", 0, expected)
    # the hash of python -m algorithms.train --algo vcbm --env WatchRepair-v0 --seed 0: a config hash names a run's
    # results, so the way the config is resolved must not change it
    assert spec.config_hash == "976dc1a89c0a353b"


def test_sb3_resolve_builds_the_typed_config_once_and_keeps_the_hash():
    from stable_baselines3 import PPO

    spec = train.resolve_spec("ppo", "WatchRepair-v0", 0)
    config = spec.config
    assert isinstance(config, sb3_runner.SB3Config) and config.algo_cls is PPO and not config.off_policy
    assert isinstance(config.run, sb3_runner.SB3RunConfig) and config.episode_steps == 50
    zoo = yaml.safe_load(open("zoo_configs/ppo.yml"))["WatchRepair-v0"]
    algo_args = {**sb3_runner.algo_defaults(PPO), **{k: v for k, v in zoo.items() if k in sb3_runner.algo_defaults(PPO)}}
    run_args = {k: v for k, v in zoo.items() if k not in algo_args}
    expected = {**dataclasses.asdict(sb3_runner.SB3RunConfig(**run_args)), **algo_args}
    del expected["engine"]  # recorded only when not the default (SB3Config.hyperparams)
    assert json.loads(json.dumps(dict(spec.hyperparams))) == json.loads(json.dumps(expected))
    assert spec.config_hash == old_identity_hash("ppo", "WatchRepair-v0", 0, json.loads(json.dumps(expected)))
    # SB3RunConfig's max_steps and eval_every_steps / eval_episodes (SAC/TD3 on MuJoCo) are settings of every SB3
    # run, so they are part of its identity
    assert spec.config_hash == "810cd78768004315"


def test_the_command_line_and_the_in_memory_path_resolve_the_same_run():
    argv = ["--algo", "td", "--credit", "rudder", "--max-episodes", "20", "--hyperparams", "epsilon=0.1"]
    spec = train.resolve_argv(argv)
    same = train.resolve_spec("td", "WatchRepair-v0", 0, {"credit": "rudder", "max_episodes": 20, "epsilon": 0.1})
    assert spec == same and spec.config_hash == same.config_hash
    assert spec.config.credit == CreditSlot("rudder", {})
    assert spec.config.agent.epsilon == 0.1 and spec.config.run.max_episodes == 20


def _count_calls(monkeypatch, module, name: str) -> list:
    calls: list = []
    original = getattr(module, name)

    def counted(*args, **kwargs):
        calls.append(args)
        return original(*args, **kwargs)

    monkeypatch.setattr(module, name, counted)
    return calls


def test_a_tabular_run_builds_its_configs_once_and_reads_only_the_typed_config(monkeypatch, tmp_path):
    configs = _count_calls(monkeypatch, tabular_runner, "tabular_config")
    rules = _count_calls(monkeypatch, credit_slot, "make_rule")
    summary = train.run(
        ["--algo", "mc", "--credit", "vcbm_bookmark", "--max-episodes", "20", "--no-progress", "--log-dir", str(tmp_path / "a")]
    )
    assert summary["episodes_run"] == 20 and summary["credit"] == "vcbm_bookmark"
    assert len(configs) == 1  # resolve; validate and run read spec.config
    assert len(rules) == 2  # resolve's dry build (bad credit_kwargs fail before the log dir) and the run's

    spec = train.resolve_spec("td", "WatchRepair-v0", 3, {"credit": "rudder", "max_episodes": 20})
    # the mapping is never parsed again: a run of a spec whose plain values are nonsense trains the typed config
    nonsense = dataclasses.replace(spec, hyperparams={"max_episodes": "many", "credit": "bogus"})
    again = get_arm("td").run(nonsense, str(tmp_path / "b"), RunOptions(progress=False))
    assert again["episodes_run"] == 20 and again["credit"] == "rudder"


def test_an_sb3_run_builds_its_configs_once_and_reads_only_the_typed_config(monkeypatch, tmp_path):
    configs = _count_calls(monkeypatch, sb3_runner, "_configs")
    rules = _count_calls(monkeypatch, credit_slot, "make_rule")
    argv = [
        "--algo",
        "ppo",
        "--credit",
        "vcbm_bookmark",
        "--max-episodes",
        "3",
        "--no-progress",
        "--log-dir",
        str(tmp_path / "a"),
    ]
    summary = train.run([*argv, "--hyperparams", "n_steps=50", "batch_size=50"])
    assert summary["episodes_run"] >= 3 and summary["credit"] == "vcbm_bookmark"
    assert len(configs) == 1  # resolve only
    assert len(rules) == 2  # resolve's dry build and the run's (validate's dry model needs none)

    spec = train.resolve_spec("a2c", "WatchRepair-v0", 0, {"max_episodes": 2, "n_steps": 50})
    nonsense = dataclasses.replace(spec, hyperparams={"n_steps": -1})
    get_arm("a2c").validate(nonsense)
    assert get_arm("a2c").run(nonsense, str(tmp_path / "b"), RunOptions(progress=False))["episodes_run"] >= 2


def test_an_sb3_arm_run_does_not_change_its_spec(tmp_path):
    spec = train.resolve_spec("dqn", "WatchRepair-v0", 0, {"credit": "rudder", "max_episodes": 2, "learning_starts": 50})
    before = json.dumps(dict(spec.config.algo_kwargs), sort_keys=True, default=str)
    get_arm("dqn").validate(spec)
    get_arm("dqn").run(spec, str(tmp_path), RunOptions(progress=False))
    assert json.dumps(dict(spec.config.algo_kwargs), sort_keys=True, default=str) == before  # no replay_buffer_class added
    assert "replay_buffer_class" not in spec.hyperparams or spec.hyperparams["replay_buffer_class"] is None


class _NeedsEffect(CreditRule):
    """A rule that learns from info['effect'] (which neither arm collects) and from observations."""

    name = "needs_effect"
    batch_needs = ("observations",)
    info_needs = ("effect",)

    def advantages(self, batch: EpisodeBatch) -> np.ndarray:
        return np.zeros_like(batch.rewards)


@pytest.fixture
def needs_effect_registered(monkeypatch):
    module = types.ModuleType("_arms_test_rules")
    module.NeedsEffect = _NeedsEffect
    monkeypatch.setitem(sys.modules, "_arms_test_rules", module)
    monkeypatch.setitem(credit_registry.RULES, "needs_effect", "_arms_test_rules:NeedsEffect")


def test_which_rules_an_arm_takes_comes_from_the_rules_declarations(needs_effect_registered):
    sb3 = get_arm("ppo")
    choices = sb3.credit_rules()
    assert choices[0] == "none" and "needs_effect" not in choices
    assert {"broadcast", "loo", "grpo", "rudder", "vcbm_bookmark", "gigpo", "ircr", "rrd"} <= set(choices)
    assert not {"vcbm_blend", "casi"} & set(choices)  # they learn from info keys the SB3 arm does not collect
    for arm in (sb3, get_arm("td")):
        line = arm.credit_misfit("needs_effect")
        assert "info['effect']" in line and "observations" not in line.split("provide")[0] and "\n" not in line
        assert arm.credit_misfit("rudder") is None
    with pytest.raises(VcbmGymError, match=r"credit rule 'needs_effect' needs info\['effect'\]"):
        train.resolve_spec("td", "WatchRepair-v0", 0, {"credit": "needs_effect"})
    with pytest.raises(VcbmGymError, match=r"credit rule 'needs_effect' needs info\['effect'\]"):
        train.resolve_spec("ppo", "WatchRepair-v0", 0, {"credit": "needs_effect"})


def test_an_option_that_adds_a_need_is_checked_against_the_sb3_algorithm(tmp_path):
    given = {"credit": "vcbm_bookmark", "credit_kwargs": {"vcbm_bookmark": {"advantage": "given"}}}
    assert train.resolve_spec("ppo", "WatchRepair-v0", 0, given).config.run.credit == "vcbm_bookmark"  # GAE advantages
    with pytest.raises(VcbmGymError, match=r"needs extras\['advantages'\], which the sb3 arm does not provide"):
        train.resolve_spec("dqn", "WatchRepair-v0", 0, {**given, "learning_starts": 50})


def test_a_refused_rule_is_one_error_line_and_nothing_on_disk(run_cli, tmp_path):
    done = run_cli("algorithms.train", "--algo", "a2c", "--credit", "casi", "--log-dir", str(tmp_path / "run"))
    assert done.returncode == 2 and done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and "info['coalition_values']" in lines[0]
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("algo", list(ALGOS))
def test_every_arm_accepts_its_own_default_rule(algo):
    arm = get_arm(algo)
    own = arm.default_credit(algo)
    assert arm.credit_misfit(own, algo) is None and arm.credit_misfit(own) is None
    assert own in arm.credit_rules(algo)


def test_the_llm_arm_declares_the_info_keys_its_rollout_collects():
    # vcbm-loop's own rule learns from info['state_mutating']: an arm that declared none would refuse it
    arm = get_arm("vcbm-loop")
    assert "state_mutating" in arm.info_provides and arm.credit_misfit("vcbm_blend", "vcbm-loop") is None
    with pytest.raises(VcbmGymError, match="credit rule 'ircr' emits rewards"):  # LOOP's loss reads advantages only
        CreditSlot("ircr").build(arm.credit_fit("loop"))
    assert CreditSlot("ircr", {"ircr": {"baseline": "batch_mean"}}).build(arm.credit_fit("loop")).emission() == "advantages"


def test_the_deprecated_name_vcbm_plus_still_resolves_with_one_warning(capsys):
    spec = train.resolve_spec("vcbm+", "WatchRepair-v0", 0, {"max_episodes": 5})
    assert spec.algo == "vcbm-plus" and spec == train.resolve_spec("vcbm-plus", "WatchRepair-v0", 0, {"max_episodes": 5})
    assert type(spec.config.agent).__name__ == "VCBMPlusConfig" or spec.config.agent_cls.__name__ == "VCBMPlusAgent"


def test_a_zoo_key_with_a_star_serves_every_id_it_matches_after_an_exact_key(tmp_path):
    from algorithms.common.config import ZOO_CONFIG_DIR, read_yaml, zoo_hyperparams

    (tmp_path / "algo.yml").write_text('"*umbrella_length/*": {n_steps: 64}\nbsuite:umbrella_length/3: {n_steps: 8}\n')
    assert zoo_hyperparams("algo", "bsuite:umbrella_length/9", tmp_path) == {"n_steps": 64}
    assert zoo_hyperparams("algo", "umbrella_length/0", tmp_path) == {"n_steps": 64}
    assert zoo_hyperparams("algo", "bsuite:umbrella_length/3", tmp_path) == {"n_steps": 8}  # its own key first
    assert zoo_hyperparams("algo", "bsuite:memory_len/3", tmp_path) == {}
    zoo_entry = read_yaml(ZOO_CONFIG_DIR / "ppo.yml")["*umbrella_length/*"]
    assert train.resolve_spec("ppo", "bsuite:umbrella_length/2", 0).config.algo_kwargs["n_steps"] == zoo_entry["n_steps"]
