"""zoo_configs: a file's `base:` (zoo_hyperparams), and the LLM entries, which share llm-base.yml and say
only what differs."""

from __future__ import annotations

import dataclasses

import pytest

from algorithms.common.config import ZOO_CONFIG_DIR, read_yaml, zoo_hyperparams
from algorithms.common.errors import ConfigError
from vcbm_gym import TEXT_GAME_ENV_IDS

# every text game id the package registers: an id without a zoo entry trains at the generic budget (48 rollouts of up
# to 50 turns of 1,500 new tokens), far beyond what `--model tiny-random --iterations 2` should cost on a CPU
LLM_ENVS = ("AppWorld-v0", "TextWatchRepair-v0", "TextWatchWorkshop-v0", "Sokoban-v0", "SokobanDescribed-v0", *TEXT_GAME_ENV_IDS)


def _write(folder, name, text):
    (folder / name).write_text(text)


def test_a_listed_env_starts_from_its_base_entry_and_replaces_whole_keys(tmp_path):
    _write(tmp_path, "shared.yml", "A-v0: {lr: 1, env_kwargs: {x: 1, y: 2}, n: 3}\nB-v0: {lr: 5}\nC-v0: {lr: 7}\n")
    _write(tmp_path, "algo.yml", "base: shared.yml\nA-v0: {lr: 2, env_kwargs: {x: 9}}\nB-v0:\nD-v0: {n: 4}\n")
    assert zoo_hyperparams("algo", "A-v0", tmp_path) == {"lr": 2, "env_kwargs": {"x": 9}, "n": 3}
    assert zoo_hyperparams("algo", "B-v0", tmp_path) == {"lr": 5}  # listed without keys: the base's entry
    assert zoo_hyperparams("algo", "C-v0", tmp_path) == {}  # not listed: no entry, whatever the base holds
    assert zoo_hyperparams("algo", "D-v0", tmp_path) == {"n": 4}  # not in the base: the file's own
    assert zoo_hyperparams("nothing", "A-v0", tmp_path) == {}
    # a base may have a base
    _write(tmp_path, "middle.yml", "base: shared.yml\nA-v0: {n: 30}\n")
    _write(tmp_path, "top.yml", "base: middle.yml\nA-v0: {lr: 20}\n")
    assert zoo_hyperparams("top", "A-v0", tmp_path) == {"lr": 20, "env_kwargs": {"x": 1, "y": 2}, "n": 30}


@pytest.mark.parametrize(
    "files, needle",
    [
        ({"algo.yml": "base: missing.yml\nA-v0: {}\n"}, "base 'missing.yml' is not a file"),
        ({"algo.yml": "base: ../elsewhere.yml\nA-v0: {}\n"}, "base='../elsewhere.yml'"),
        ({"algo.yml": "base: [x]\nA-v0: {}\n"}, "base=['x']"),
        ({"algo.yml": "base: algo.yml\nA-v0: {}\n"}, "cycle (algo.yml -> algo.yml)"),
        ({"algo.yml": "base: b.yml\nA-v0: {}\n", "b.yml": "base: algo.yml\nA-v0: {}\n"}, "cycle (algo.yml -> b.yml -> algo.yml)"),
        ({"algo.yml": "base: b.yml\nA-v0: {}\n", "b.yml": "A-v0: [1]\n"}, "entry 'A-v0' must be a mapping"),
    ],
)
def test_a_bad_base_is_one_line(tmp_path, files, needle):
    for name, text in files.items():
        _write(tmp_path, name, text)
    with pytest.raises(ConfigError) as excinfo:
        zoo_hyperparams("algo", "A-v0", tmp_path)
    assert "\n" not in str(excinfo.value) and needle in str(excinfo.value), str(excinfo.value)


def _resolved(algo, env):
    pytest.importorskip("trl")
    from algorithms.train import resolve_spec

    return dict(resolve_spec(algo, env, 0).hyperparams)


@pytest.mark.parametrize("env_id", LLM_ENVS)
def test_loop_and_vcbm_loop_entries_differ_only_in_the_credit(env_id):
    loop, vcbm_loop = _resolved("loop", env_id), _resolved("vcbm-loop", env_id)
    assert set(loop) == set(vcbm_loop)
    assert {k for k in loop if loop[k] != vcbm_loop[k]} == {"credit", "credit_kwargs"}
    assert (loop["credit"], vcbm_loop["credit"]) == ("loo", "vcbm_blend") and loop["credit_kwargs"] == {}
    assert set(vcbm_loop["credit_kwargs"]) == {"vcbm_blend"}


@pytest.mark.parametrize("env_id", ("TextWatchRepair-v0", "TextWatchWorkshop-v0"))
def test_trl_grpo_entries_have_the_loop_budget(env_id):
    """trl-grpo differs from loop only in what is TRL's own (its clip and learning-rate schedule) or LOOP's alone
    (rule, safeguards)."""
    loop, trl = _resolved("loop", env_id), _resolved("trl-grpo", env_id)
    from algorithms.llm.resolve import reported

    loop_only = set(reported("loop")) - set(reported("trl-grpo"))
    assert set(loop) - set(trl) == loop_only and set(trl) - set(loop) == {"beta", "loss_type", "scale_rewards"}
    differ = {k: (loop[k], trl[k]) for k in set(loop) & set(trl) if loop[k] != trl[k]}
    assert differ == {"epsilon": (0.1, 0.2), "lr_scheduler_type": ("constant", "linear")}  # TRL's defaults
    assert trl["iterations"] == loop["iterations"] and trl["learning_rate"] == loop["learning_rate"]


def test_the_llm_entries_list_only_what_differs():
    """Every LLM zoo file builds on llm-base.yml; the base holds only keys every LLM algorithm accepts, and a
    key that config.yml always records is listed only where it differs from a config's default."""
    pytest.importorskip("trl")
    from algorithms.llm.config import LoopConfig, LoopRunConfig, MultiTurnGRPOConfig
    from algorithms.llm.resolve import RUN_KEYS, reported

    def defaults(cls):
        return {
            f.name: f.default if f.default is not dataclasses.MISSING else f.default_factory() for f in dataclasses.fields(cls)
        }

    run_defaults, loop_defaults, trl_defaults = defaults(LoopRunConfig), defaults(LoopConfig), defaults(MultiTurnGRPOConfig)
    base = read_yaml(ZOO_CONFIG_DIR / "llm-base.yml")
    assert set(base) == set(LLM_ENVS)
    for env_id, entry in base.items():
        for key, value in entry.items():
            assert key in RUN_KEYS or key in trl_defaults, (env_id, key)  # trl-grpo accepts it too
            if key in RUN_KEYS:
                assert value != run_defaults[key], (env_id, key)
            elif key in reported("trl-grpo"):
                assert value != loop_defaults[key] or value != trl_defaults[key], (env_id, key)
    for algo in ("loop", "vcbm-loop", "trl-grpo"):
        data = read_yaml(ZOO_CONFIG_DIR / f"{algo}.yml")
        assert data["base"] == "llm-base.yml"
        assert all(not (entry or {}).keys() - {"credit_kwargs"} for env_id, entry in data.items() if env_id != "base"), algo


def test_cpu_overrides_replace_their_own_layer_and_a_later_layer_still_wins(tmp_path, monkeypatch):
    """On a CPU the zoo's cpu_overrides replace the zoo entry's values, and the user's flags and --hyperparams replace
    those: `--model tiny --iterations 40` on AppWorld-v0 once ran tiny-random for the overrides' 2 iterations."""
    import torch

    from algorithms.common.config import on_this_machine
    from algorithms.train import resolve_spec

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    zoo = resolve_spec("loop", "AppWorld-v0", 0).identity()["hyperparams"]
    assert (zoo["model"], zoo["iterations"], zoo["use_vllm"]) == ("tiny-random", 2, False)  # the overrides, not the 7B
    mine = resolve_spec("loop", "AppWorld-v0", 0, {"model": "tiny", "iterations": 40}).identity()["hyperparams"]
    assert (mine["model"], mine["iterations"], mine["use_vllm"]) == ("tiny", 40, False)
    config = tmp_path / "run.yml"
    config.write_text("AppWorld-v0:\n  iterations: 7\n  cpu_overrides: {iterations: 5}\n")
    from_file = resolve_spec("loop", "AppWorld-v0", 0, {"model": "tiny"}, str(config)).identity()["hyperparams"]
    assert (from_file["iterations"], from_file["model"]) == (5, "tiny")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert on_this_machine({"iterations": 7, "cpu_overrides": {"iterations": 5}}) == {"iterations": 7}
    with pytest.raises(ConfigError, match=r"cpu_overrides=\[5\]: expected a mapping"):
        on_this_machine({"cpu_overrides": [5]})
