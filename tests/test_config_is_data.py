"""A config file is data: the names in it resolve through the project's registries only, so loading someone else's
config.yml (as docs/usage.md invites) cannot import a module or call a function of the file's choosing."""

from __future__ import annotations

import os

import pytest
import yaml

from algorithms import train
from algorithms.common.errors import ConfigError

MARKER_MODULE = """
from pathlib import Path
Path(__file__).with_name("imported.marker").write_text("the config's module ran")


def prompt(one_shot=True):
    return "a prompt from the working directory"
"""


@pytest.fixture
def cwd_with_marker_module(tmp_path, monkeypatch):
    """tmp_path as the working directory, first on sys.path (as under `python -m`), holding a module that leaves
    a marker file when it is imported."""
    (tmp_path / "marker_prompt.py").write_text(MARKER_MODULE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def _train(tmp_path, config: dict, *argv: str) -> int:
    path = tmp_path / "config.yml"
    path.write_text(yaml.safe_dump(config))
    return train.main(["--config", str(path), "--log-dir", str(tmp_path / "run"), "--no-progress", *argv])


@pytest.mark.parametrize(
    ("algo", "env"), [("loop", "TextWatchRepair-v0"), ("trl-grpo", "TextWatchRepair-v0"), ("ccpo", "TextThinkSolve-v0")]
)
@pytest.mark.parametrize("target", ["os:close", "marker_prompt:prompt", "marker_prompt"])
def test_config_system_prompt_naming_a_module_is_refused_in_one_line_and_nothing_runs(
    cwd_with_marker_module, capsys, algo, env, target
):
    code = _train(cwd_with_marker_module, {"system_prompt": target, "iterations": 1}, "--algo", algo, "--env", env)
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1 and err.startswith("error: ")
    assert f"system_prompt={target!r} is not a registered prompt: expected one of tiny, appworld" in err
    assert not (cwd_with_marker_module / "imported.marker").exists()
    assert not (cwd_with_marker_module / "run").exists()
    os.fstat(0)  # os:close was not called on stdin (or any descriptor the test has open)


def test_prompt_names_resolve_through_the_registry_only():
    from algorithms.llm.generation.prompting import PROMPT_ALIASES, PROMPTS, prompt_name, system_prompt_text

    assert prompt_name(None) is None
    for name in PROMPTS:
        assert prompt_name(name) == name
    # each registered function's own path is another name of it, found in the table, and so is the tiny prompt's
    # path in config.yml files of earlier versions
    assert prompt_name("algorithms.llm.generation.prompting:tiny_system_prompt") == "tiny"
    assert prompt_name("algorithms.llm.warm_start:tiny_system_prompt") == "tiny"
    assert prompt_name("envs.appworld.prompt:system_prompt") == "appworld"
    assert set(PROMPT_ALIASES.values()) == set(PROMPTS)
    from algorithms.llm.generation.prompting import tiny_system_prompt
    from envs.appworld.prompt import system_prompt

    assert system_prompt_text("tiny") == tiny_system_prompt()
    assert system_prompt_text("appworld", one_shot=False) == system_prompt(False)
    assert system_prompt_text("envs.appworld.prompt:system_prompt", one_shot=True) == system_prompt(True)
    assert system_prompt_text(None) is None
    for bad in ("os:close", "os", "algorithms.llm.generation.prompting:TINY_SYSTEM_PROMPT", "Tiny", 3, ["tiny"]):
        with pytest.raises(ValueError, match="is not a registered prompt: expected one of tiny, appworld"):
            prompt_name(bad)


def test_trainer_config_holds_the_registered_name():
    from algorithms.llm.config import MultiTurnGRPOConfig

    config = MultiTurnGRPOConfig(output_dir="unused", system_prompt="algorithms.llm.warm_start:tiny_system_prompt")
    assert config.system_prompt == "tiny"
    with pytest.raises(ValueError, match="not a registered prompt"):
        MultiTurnGRPOConfig(output_dir="unused", system_prompt="os:close")


def test_zoo_entries_name_registered_prompts():
    from algorithms.common.config import ZOO_CONFIG_DIR
    from algorithms.llm.generation.prompting import PROMPTS

    named = [
        entry["system_prompt"]
        for path in ZOO_CONFIG_DIR.glob("*.yml")
        for entry in (yaml.safe_load(path.read_text()) or {}).values()
        if isinstance(entry, dict) and entry.get("system_prompt") is not None
    ]
    assert named and set(named) <= set(PROMPTS)


def test_run_config_yml_env_is_never_imported_on_rerun(cwd_with_marker_module, capsys):
    """A run's config.yml passed to --config with another --env is refused by comparing the two ids: the `env` it
    records (here module:EnvId naming the marker module) is text, not something to import."""
    record = {
        "algo": "vcbm",
        "env": "marker_prompt:Marker-v0",
        "seed": 0,
        "hyperparams": {"max_episodes": 10},
        "config_hash": "0" * 16,
    }
    code = _train(cwd_with_marker_module, record, "--algo", "vcbm", "--env", "WatchRepair-v0")
    err = capsys.readouterr().err.strip()
    assert code == 2 and "records a run of --algo vcbm --env marker_prompt:Marker-v0" in err
    assert not (cwd_with_marker_module / "imported.marker").exists()
    assert not (cwd_with_marker_module / "run").exists()


def test_bad_system_prompt_type_is_one_config_error():
    with pytest.raises(ConfigError, match=r"system_prompt=3 .*expected|system_prompt=3 for"):
        train.resolve_spec("loop", "TextWatchRepair-v0", 0, {"system_prompt": 3})
