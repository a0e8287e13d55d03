"""Credit rules from outside the package (vcbm_gym/credit/registry.py): the example plug-in
(examples/credit_rule_plugin), installed as pip installs it, runs by name in every arm it fits and reruns from each
run's config.yml; register_rule does the same in-process; a name two sources claim, an unknown name and a missing
plug-in are one line each."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from vcbm_gym.credit import check_rule, register_rule, registry, unregister_rule
from vcbm_gym.credit.base import CreditRule, EpisodeBatch, RewardRule

REPO = Path(__file__).resolve().parents[1]
PLUGIN = REPO / "examples" / "credit_rule_plugin"
PLUGIN_RECORD = {"distribution": "vcbm-credit-example", "version": "1.0"}


@pytest.fixture(scope="module")
def plugin_site(tmp_path_factory) -> Path:
    """The example plug-in installed into a folder of its own, as pip installs a distribution (its entry points)."""
    root = tmp_path_factory.mktemp("plugin")
    source = root / "source"
    shutil.copytree(PLUGIN, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    site = root / "site"
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation", "--no-index"]
    subprocess.run([*pip, "--target", str(site), str(source)], check=True, capture_output=True, timeout=300)
    return site


def _run(tmp_path: Path, site: Path | None, *argv: str, module: str = "algorithms.train") -> subprocess.CompletedProcess:
    path = os.pathsep.join([*([str(site)] if site else []), str(REPO)])
    env = {**os.environ, "PYTHONPATH": path}
    return subprocess.run(
        [sys.executable, "-m", module, *argv], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )


def _record(log_dir: Path) -> dict:
    return yaml.safe_load((log_dir / "config.yml").read_text())


def _one_error_line(stderr: str, *needles: str) -> str:
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def _rerun(tmp_path: Path, site: Path | None, run: Path, new: Path, algo: str, env: str) -> subprocess.CompletedProcess:
    return _run(
        tmp_path, site, "--algo", algo, "--env", env, "--config", str(run / "config.yml"), "--log-dir", str(new), "--no-progress"
    )


@pytest.fixture(scope="module")
def ppo_run(plugin_site, tmp_path_factory) -> Path:
    """`train --algo ppo --credit decayed_return`, the plug-in's advantage rule, by name."""
    out = tmp_path_factory.mktemp("ppo")
    result = _run(
        out,
        plugin_site,
        "--algo",
        "ppo",
        "--credit",
        "decayed_return",
        "--max-episodes",
        "3",
        "--log-dir",
        str(out / "run"),
        "--no-progress",
    )
    assert result.returncode == 0, result.stderr
    return out / "run"


@pytest.mark.parametrize(
    "algo, env, argv",
    [
        ("ppo", "WatchRepair-v0", None),
        ("td", "WatchRepair-v0", ["--credit", "even_split", "--max-episodes", "4"]),
        ("dqn", "DelayedCartPole-v1", ["--credit", "even_split", "--max-episodes", "3", "--hyperparams", "learning_starts=500"]),
        ("loop", "TextWatchRepair-v0", ["--credit", "decayed_return", "--model", "tiny-random", "--iterations", "1"]),
    ],
)
def test_an_installed_plugin_rule_runs_by_name_and_reruns_from_config_yml(plugin_site, ppo_run, tmp_path, algo, env, argv):
    if argv is None:
        run = ppo_run
    else:
        run = tmp_path / "run"
        result = _run(tmp_path, plugin_site, "--algo", algo, "--env", env, *argv, "--log-dir", str(run), "--no-progress")
        assert result.returncode == 0, result.stderr
    record = _record(run)
    name = record["hyperparams"]["credit"] if algo != "loop" else "decayed_return"
    assert record["credit_rule"] == {"name": name, **PLUGIN_RECORD}
    assert json.loads((run / "summary.json").read_text())["credit"] == name
    again = _rerun(tmp_path, plugin_site, run, tmp_path / "again", algo, env)
    assert again.returncode == 0, again.stderr
    rerun = _record(tmp_path / "again")
    assert rerun["credit_rule"] == record["credit_rule"] and rerun["config_hash"] == record["config_hash"]


def test_compare_takes_an_algo_plus_plugin_rule_label_and_its_run_reruns(plugin_site, tmp_path):
    out = tmp_path / "cmp"
    result = _run(
        tmp_path,
        plugin_site,
        "--algos",
        "ppo+decayed_return",
        "--seeds",
        "1",
        "--workers",
        "1",
        "--max-episodes",
        "3",
        "--out",
        str(out),
        "--no-curves",
        "--no-progress",
        module="algorithms.compare",
    )
    assert result.returncode == 0, result.stderr
    run = out / "ppo+decayed_return" / "seed0"
    assert _record(run)["credit_rule"] == {"name": "decayed_return", **PLUGIN_RECORD}
    again = _rerun(tmp_path, plugin_site, run, tmp_path / "again", "ppo", "WatchRepair-v0")
    assert again.returncode == 0, again.stderr


def test_a_rerun_without_the_plugin_installed_says_what_to_install_and_writes_nothing(ppo_run, tmp_path):
    result = _rerun(tmp_path, None, ppo_run, tmp_path / "again", "ppo", "WatchRepair-v0")
    assert result.returncode == 2
    _one_error_line(
        result.stderr,
        "credit rule 'decayed_return' of distribution vcbm-credit-example 1.0",
        "pip install 'vcbm-credit-example==1.0'",
    )
    assert not (tmp_path / "again").exists()


def test_the_plugin_rules_keep_the_credit_rule_promises(plugin_site, tmp_path):
    check = (
        "from vcbm_gym.credit import check_rule, rule_class\nfor n in ('decayed_return', 'even_split'): check_rule(rule_class(n))"
    )
    result = subprocess.run(
        [sys.executable, "-c", check],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(plugin_site), str(REPO)])},
    )
    assert result.returncode == 0, result.stderr


def _write_distribution(root: Path, name: str, version: str, entry_points: dict[str, str]) -> None:
    """A distribution's metadata as pip leaves it (NAME-VERSION.dist-info), with entry points in our group."""
    info = root / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    lines = "".join(f"{key} = {value}\n" for key, value in entry_points.items())
    (info / "entry_points.txt").write_text(f"[{registry.ENTRY_POINT_GROUP}]\n{lines}")


@pytest.fixture
def clashing_distribution(tmp_path, monkeypatch):
    """An installed distribution whose entry points claim the built-in 'loo' and name a module that does not exist."""
    _write_distribution(
        tmp_path / "site",
        "clash-example",
        "0.3",
        {"loo": "clash_example_rules:Loo", "broken_rule": "no_such_module_for_rules:Rule", "bad+name": "x:Rule"},
    )
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    registry.forget_entry_points()
    yield
    monkeypatch.undo()
    registry.forget_entry_points()


def test_a_name_an_entry_point_and_a_built_in_rule_both_claim_is_one_line_naming_both(clashing_distribution, capsys, tmp_path):
    from algorithms.train import main

    with pytest.raises(registry.RuleLookupError) as caught:
        registry.make_rule("loo")
    assert str(caught.value) == (
        "credit rule 'loo' is claimed by both the built-in rules and entry point 'loo = clash_example_rules:Loo' of "
        "distribution clash-example 0.3; expected one rule per name: uninstall or rename one of them"
    )
    assert main(["--algo", "ppo", "--credit", "loo", "--log-dir", str(tmp_path / "run")]) == 2
    _one_error_line(capsys.readouterr().err, "'loo' is claimed by both the built-in rules and entry point 'loo = ")
    assert not (tmp_path / "run").exists()


def test_an_entry_point_is_imported_only_when_its_name_is_asked_for(clashing_distribution, tmp_path):
    assert "broken_rule" in registry.rule_names() and "no_such_module_for_rules" not in sys.modules
    assert registry.make_rule("grpo").name == "grpo"  # other names resolve while a plug-in is broken
    expected = (
        r"^credit rule 'broken_rule' \(entry point 'broken_rule = no_such_module_for_rules:Rule' of distribution "
        r"clash-example 0.3\) cannot be loaded: No module"
    )
    with pytest.raises(registry.RuleLookupError, match=expected):
        registry.rule_class("broken_rule")
    with pytest.raises(registry.RuleLookupError, match=r"^entry point 'bad\+name = x:Rule' .*: credit rule name 'bad\+name'"):
        registry.rule_class("bad+name")
    from algorithms.registry import get_arm

    assert "broken_rule" not in get_arm("ppo").credit_rules() and "broadcast" in get_arm("ppo").credit_rules()


def test_register_rule_refuses_a_name_a_built_in_rule_has_in_one_line():
    class Loo(CreditRule):
        name = "loo"

        def advantages(self, batch):
            return batch.broadcast(batch.returns)

    with pytest.raises(registry.RuleLookupError) as caught:
        register_rule("loo", Loo)
    assert str(caught.value) == (
        f"credit rule 'loo' is claimed by both the built-in rules and register_rule('loo', {__name__}.{Loo.__qualname__}); "
        "expected one rule per name: register it under another name"
    )
    for bad in ("none", "ppo+x", "", "1st"):
        with pytest.raises(registry.RuleLookupError, match="credit rule name"):
            register_rule(bad, Loo)
    assert registry.rule_class("loo").__module__ == "vcbm_gym.credit.loo"


def test_a_config_naming_an_unknown_rule_or_an_import_path_is_one_line_on_how_rules_are_registered(capsys, tmp_path):
    from algorithms.train import main

    for name in ("no_such_rule", "vcbm_credit_example.rules:DecayedReturnRule"):
        config = tmp_path / "config.yml"
        config.write_text(yaml.safe_dump({"credit": name}))
        assert main(["--algo", "ppo", "--config", str(config), "--log-dir", str(tmp_path / "run")]) == 2
        _one_error_line(
            capsys.readouterr().err,
            f"unknown credit rule {name!r}",
            "vcbm_gym.credit.register_rule(name, cls)",
            "entry point `name = package.module:Class` in group 'vcbm_gym.credit_rules'",
        )
        assert not (tmp_path / "run").exists()
    assert "vcbm_credit_example" not in sys.modules  # a config names rules; it never imports a module by a string


class HalvedReturn(RewardRule):
    """r_t = G / (2 n) on each of n trained steps, plus G / 2 on the last: a reward rule defined in a script."""

    name = "halved_return"

    def rewards(self, batch: EpisodeBatch) -> np.ndarray:
        n = np.maximum(batch.mask.sum(axis=1), 1)
        out = batch.broadcast(batch.returns / (2 * n))
        last = np.where(batch.mask.any(axis=1), batch.mask.shape[1] - 1 - np.argmax(batch.mask[:, ::-1], axis=1), 0)
        out[np.arange(batch.batch_size), last] += np.where(batch.mask.any(axis=1), batch.returns / 2, 0.0)
        return out


@pytest.fixture
def halved_registered():
    register_rule("halved_return", HalvedReturn)
    yield
    unregister_rule("halved_return")


def test_a_rule_registered_in_process_runs_by_name_is_scored_and_a_rerun_without_it_says_to_register_it(
    halved_registered, capsys, tmp_path
):
    from algorithms.credit_reference.cli import main as credit_reference
    from algorithms.train import main

    spec = importlib.util.spec_from_file_location("credit_leakage", REPO / "benchmarks" / "credit_leakage.py")
    credit_leakage = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(credit_leakage)

    check_rule(HalvedReturn)
    run = tmp_path / "run"
    assert main(["--algo", "td", "--credit", "halved_return", "--max-episodes", "3", "--log-dir", str(run), "--no-progress"]) == 0
    assert _record(run)["credit_rule"] == {"name": "halved_return", "distribution": None, "version": None}
    out = tmp_path / "ref" / "r.json"
    argv = ["--env", "WatchRepair-v0", "--rules", "halved_return,loo", "--seeds", "2", "--episodes", "3", "--k", "2"]
    assert credit_reference([*argv, "--train-episodes", "4", "--batch-episodes", "2", "--out", str(out)]) == 0
    assert "halved_return" in out.read_text()
    leak = tmp_path / "leak" / "l.json"
    argv = ["--rules", "halved_return", "--seeds", "2", "--episodes", "8", "--batch-episodes", "4", "--out", str(leak)]
    assert credit_leakage.main(credit_leakage.run, argv) == 0
    assert "halved_return" in leak.read_text()
    capsys.readouterr()
    unregister_rule("halved_return")
    try:
        again = ["--algo", "td", "--config", str(run / "config.yml"), "--log-dir", str(tmp_path / "again")]
        assert main(again) == 2
        _one_error_line(
            capsys.readouterr().err,
            "ran credit rule 'halved_return' of a rule registered in-process",
            "register it (vcbm_gym.credit.register_rule('halved_return', cls)) before rerunning",
        )
        assert not (tmp_path / "again").exists()
    finally:
        register_rule("halved_return", HalvedReturn)


def test_config_yml_records_a_built_in_rule_as_vcbm_gym_and_its_version(tmp_path):
    import vcbm_gym
    from algorithms.train import main

    assert main(["--algo", "td", "--credit", "ircr", "--max-episodes", "2", "--log-dir", str(tmp_path), "--no-progress"]) == 0
    assert _record(tmp_path)["credit_rule"] == {"name": "ircr", "distribution": "vcbm-gym", "version": vcbm_gym.__version__}


def test_the_rule_authors_page_shows_the_example_plugin_as_it_ships():
    text = (REPO / "docs" / "credit_rules.md").read_text()
    blocks = [block.partition("\n") for block in text.split("```")[1::2]]
    by_language = {}
    for language, _, body in blocks:
        by_language.setdefault(language.strip(), body)
    assert by_language["python"] == (PLUGIN / "vcbm_credit_example" / "rules.py").read_text()
    assert by_language["toml"].strip() in (PLUGIN / "pyproject.toml").read_text()
    assert "credit_rules.md" in (REPO / "docs" / "README.md").read_text()


def test_a_run_made_with_another_version_of_its_rule_is_not_reused_and_reruns_with_a_warning(capsys, tmp_path):
    import vcbm_gym
    from algorithms.common.log_dir import finished_summary
    from algorithms.train import main, resolve_spec

    argv = ["--algo", "td", "--credit", "ircr", "--max-episodes", "2", "--no-progress"]
    assert main([*argv, "--log-dir", str(tmp_path / "run")]) == 0
    spec = resolve_spec("td", "WatchRepair-v0", 0, {"credit": "ircr", "max_episodes": 2})
    assert finished_summary(tmp_path / "run", spec)[0] is not None  # the same rule: the result is reused
    record = _record(tmp_path / "run")
    record["credit_rule"]["version"] = "0.0.1"  # as if an earlier vcbm-gym had run it
    (tmp_path / "run" / "config.yml").write_text(yaml.safe_dump(record, sort_keys=False))
    now = f"'ircr' of vcbm-gym {vcbm_gym.__version__}"
    assert finished_summary(tmp_path / "run", spec) == (None, f"its credit rule was 'ircr' of vcbm-gym 0.0.1 and is now {now}")
    capsys.readouterr()
    assert main([*argv, "--resume", "--log-dir", str(tmp_path / "run")]) == 2
    _one_error_line(capsys.readouterr().err, "holds a run whose credit rule was 'ircr' of vcbm-gym 0.0.1", "--overwrite")
    assert main(["--algo", "td", "--config", str(tmp_path / "run" / "config.yml"), "--log-dir", str(tmp_path / "again")]) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning: ")]
    assert warnings == [
        f"warning: config file {str(tmp_path / 'run' / 'config.yml')!r} ran credit rule 'ircr' of vcbm-gym 0.0.1; "
        f"rerunning it with vcbm-gym {vcbm_gym.__version__}"
    ]
