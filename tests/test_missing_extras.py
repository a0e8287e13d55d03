"""A command that needs an optional extra which is not installed says so in one line, naming the extra, before it
writes anything. The test venv has every extra, so each command runs in a subprocess whose `sys.modules` holds None
for the extra's package: its import fails there exactly as when the package is not installed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from algorithms.common.errors import VcbmGymError

REPO = Path(__file__).resolve().parents[1]

RUN_WITHOUT = """
import runpy, sys
blocked, module, *argv = sys.argv[1:]
for name in blocked.split(","):
    sys.modules[name] = None
sys.argv = [module, *argv]
runpy.run_module(module, run_name="__main__", alter_sys=True)
"""


def _run_without(blocked: str, module: str, *argv: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", RUN_WITHOUT, blocked, module, *argv],
        cwd=cwd,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin", "HOME": str(cwd)},
        capture_output=True,
        text=True,
        timeout=300,
    )


def _hint(what: str, extra: str, module: str) -> str:
    return f'error: {what} needs the {extra} extra ({module} is not installed): pip install -e ".[{extra}]"'


CASES = [
    # (blocked modules, entry point, its arguments (OUT: the directory it would write), the line it must print)
    ("trl", "algorithms.train", ["--algo", "vcbm-loop", "--env", "TextWatchRepair-v0", "--log-dir", "OUT"],
     _hint("--algo vcbm-loop", "llm", "trl")),
    ("peft", "algorithms.train", ["--algo", "ccpo", "--env", "TextThinkSolve-v0", "--log-dir", "OUT"],
     _hint("--algo ccpo", "llm", "peft")),
    ("mujoco", "algorithms.train", ["--algo", "sac", "--env", "EpisodicHopper-v5", "--log-dir", "OUT"],
     _hint("--env EpisodicHopper-v5", "mujoco", "mujoco")),
    ("mujoco", "algorithms.train", ["--algo", "ppo", "--env", "Hopper-v5", "--log-dir", "OUT"],
     _hint("--env Hopper-v5", "mujoco", "mujoco")),
    ("bsuite", "algorithms.train", ["--algo", "vcbm", "--env", "bsuite:umbrella_length/1", "--log-dir", "OUT"],
     _hint("--env bsuite:umbrella_length/1", "bsuite", "bsuite")),
    ("bsuite", "algorithms.train", ["--algo", "ppo", "--env", "umbrella_length/1", "--log-dir", "OUT"],
     _hint("--env umbrella_length/1", "bsuite", "bsuite")),
    ("trl", "algorithms.compare", ["--algos", "loop", "--env", "TextWatchRepair-v0", "--seeds", "1", "--out", "OUT"],
     "error: loop: " + _hint("--algo loop", "llm", "trl").removeprefix("error: ")),
    ("bsuite", "algorithms.compare", ["--algos", "vcbm", "--env", "bsuite:umbrella_length/1", "--seeds", "1", "--out", "OUT"],
     "error: vcbm: " + _hint("--env bsuite:umbrella_length/1", "bsuite", "bsuite").removeprefix("error: ")),
    ("transformers", "algorithms.tune", ["--algo", "loop", "--env", "TextWatchRepair-v0", "--trials", "1", "--out", "OUT"],
     _hint("--algo loop", "llm", "transformers")),
    ("bsuite", "algorithms.suite", ["--experiment", "umbrella_length", "--algos", "vcbm", "--out", "OUT"],
     _hint("the suite", "bsuite", "bsuite")),
    ("trl", "algorithms.suite", ["--experiment", "umbrella_length", "--algos", "loop", "--out", "OUT"],
     _hint("--algo loop", "llm", "trl")),
    ("transformers", "algorithms.evaluate", ["--model", "tiny", "--out", "OUT"], _hint("--model tiny", "llm", "transformers")),
]  # fmt: skip


@pytest.mark.parametrize(("blocked", "module", "argv", "line"), CASES, ids=[f"{c[1]}-without-{c[0]}" for c in CASES])
def test_missing_extra_is_one_line_naming_the_extra_and_nothing_is_written(tmp_path, blocked, module, argv, line):
    out = tmp_path / "out"
    done = _run_without(blocked, module, *[str(out) if a == "OUT" else a for a in argv], cwd=tmp_path)
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stderr.strip() == line
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"] or not any(tmp_path.iterdir())


def test_bsuite_env_id_is_never_imported_as_a_module(tmp_path):
    """`bsuite:<experiment>/<setting>` is an id vcbm_gym registers: the train command's env check does not import a
    module called bsuite (Gymnasium's module:EnvId reading), so without bsuite it is the extra's line, not "module
    'bsuite' cannot be imported"."""
    done = _run_without("bsuite", "algorithms.train", "--algo", "vcbm", "--env", "bsuite:umbrella_length/99", cwd=tmp_path)
    assert done.returncode == 2
    assert "cannot be imported" not in done.stderr
    assert done.stderr.strip().startswith("error: --env 'bsuite:umbrella_length/99': umbrella_length has settings 0 to 22")


def test_env_extra_reads_the_id_and_its_entry_point():
    import vcbm_gym  # noqa: F401  (registers the ids)
    from algorithms.common.extras import env_extra

    assert env_extra("bsuite:memory_len/0") == env_extra("memory_len/0") == env_extra("BSuite-v0") == "bsuite"
    assert env_extra("EpisodicWalker2d-v5") == env_extra("Ant-v5") == "mujoco"
    assert env_extra("WatchRepair-v0") is env_extra("DelayedCartPole-v1") is env_extra("CartPole-v1") is None


def test_require_extra_names_the_first_missing_module(monkeypatch):
    from algorithms.common.extras import EXTRAS, missing_module, require_extra

    assert all(missing_module(extra) is None for extra in EXTRAS)  # the test venv has every extra
    monkeypatch.setitem(sys.modules, "peft", None)
    assert missing_module("llm") == "peft"
    with pytest.raises(
        VcbmGymError, match=r'^--algo loop needs the llm extra \(peft is not installed\): pip install -e "\.\[llm\]"$'
    ):
        require_extra("--algo loop", "llm")


def test_bsuite_prefix_names_only_bsuite_settings():
    from algorithms.train import check_env_id

    check_env_id("bsuite:umbrella_length/1")
    with pytest.raises(VcbmGymError, match=r"^--env 'bsuite:CartPole-v1': experiment 'CartPole-v1' is none of umbrella_length"):
        check_env_id("bsuite:CartPole-v1")
