"""A bare `pip install -e .` (no extras) trains: every module a default train command imports comes from a distribution
that `[project] dependencies` in pyproject.toml brings, directly or through their own requirements.

The check runs the command in a fresh interpreter whose imports of any other installed distribution fail, as they
would on a machine that has only the core install: optional imports (a library's `try: import x`) fall back as
they would there, and a needed one fails the run.
"""

from __future__ import annotations

import importlib.metadata as metadata
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[1]
OWN_PACKAGES = ("algorithms", "envs", "vcbm_gym", "zoo_configs", "tests")


def _key(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def core_closure() -> set[str]:
    """The distributions `[project] dependencies` installs: each one and, recursively, what it requires (markers
    evaluated here, no extras)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    todo = [Requirement(line) for line in project["dependencies"]]
    seen: set[str] = set()
    while todo:
        requirement = todo.pop()
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue
        key = _key(requirement.name)
        if key in seen:
            continue
        seen.add(key)
        try:
            todo += [Requirement(line) for line in metadata.requires(requirement.name) or []]
        except metadata.PackageNotFoundError:
            pass
    return seen


# Run in the child: imports of installed distributions outside ALLOWED fail, then `algorithms.train` runs argv.
# The path finder is wrapped, not preceded: a blocked module is not found at all (importlib.util.find_spec gives None,
# as libraries that probe for optional modules expect).
CHILD = """
import importlib.machinery, importlib.metadata, json, sys
ALLOWED, OWN = set(json.loads(sys.argv[1])), tuple(json.loads(sys.argv[2]))
ARGV, BLOCKED_LOG = json.loads(sys.argv[3]), sys.argv[4]
OWNERS = importlib.metadata.packages_distributions()
KEY = lambda name: name.replace("_", "-").replace(".", "-").lower()
blocked = []

class CoreOnly:
    def __init__(self, inner):
        self.inner = inner

    def find_spec(self, name, path=None, target=None):
        top = name.partition(".")[0]
        owners = OWNERS.get(top)
        if top in OWN or top in sys.stdlib_module_names or not owners or any(KEY(o) in ALLOWED for o in owners):
            return self.inner.find_spec(name, path, target)
        blocked.append(name)
        return None

    def __getattr__(self, attribute):
        return getattr(self.inner, attribute)

sys.meta_path[:] = [CoreOnly(f) if f is importlib.machinery.PathFinder else f for f in sys.meta_path]
from algorithms.train import main
try:
    code = main(ARGV)
finally:
    open(BLOCKED_LOG, "w").write(json.dumps(sorted(set(blocked))))
sys.exit(code)
"""


def run_core_only(argv: list[str], tmp_path: Path) -> tuple[subprocess.CompletedProcess, list[str]]:
    allowed = core_closure() | {"vcbm-gym"}
    log = tmp_path / "blocked.json"
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(sorted(allowed)), json.dumps(OWN_PACKAGES), json.dumps(argv), str(log)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    return proc, json.loads(log.read_text()) if log.exists() else []


def test_core_closure_reads_pyproject_and_follows_requirements():
    closure = core_closure()
    assert {"stable-baselines3", "torch", "tqdm"} <= closure  # listed in pyproject
    assert "cloudpickle" in closure  # required by stable-baselines3 and gymnasium, not listed
    assert "trl" not in closure and "ray" not in closure  # extras only


def test_sb3_train_with_its_progress_bar_needs_only_the_core_dependencies(tmp_path):
    log_dir = tmp_path / "run"
    argv = ["--algo", "ppo", "--env", "CartPole-v1", "--max-episodes", "2", "--hyperparams", "n_steps=64"]
    proc, blocked = run_core_only([*argv, "--log-dir", str(log_dir)], tmp_path)
    assert proc.returncode == 0, f"blocked imports {blocked}: {proc.stderr[-2000:]}"
    assert (log_dir / "summary.json").is_file()
