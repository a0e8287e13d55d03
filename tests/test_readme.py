import re
import subprocess
import sys
from pathlib import Path

from tests.doc_pages import DOCS, README, REPO, first_blocks, section


def _setup_commands() -> list[str]:
    blocks = README.read_text().split("```")
    return [block.strip().removeprefix("bash").strip() for block in blocks[1:4:2]]


def test_readme_starts_with_two_setup_commands_and_ci_runs_the_second():
    train, tests = _setup_commands()
    assert "algorithms.train --algo vcbm --env WatchRepair-v0" in train
    assert "pytest" in tests
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    commands = [line for line in ci[1:] if line.strip() and not line.lstrip().startswith("#")]
    # exactly what a new user runs: nothing installed before the README's command
    assert commands == ["set -euo pipefail", 'cd "$(dirname "$0")/.."', tests, ".ci/lint"]


def test_readme_stays_a_front_page():
    """The front page is read in two minutes: the rest lives in docs/ pages, each linked from it."""
    text = README.read_text()
    assert len(text.splitlines()) <= 200
    pages = {page.name for page in DOCS.glob("*.md")}
    missing = sorted(name for name in pages if f"(docs/{name}" not in text)
    assert not missing, f"README links no docs page named {missing}"


def test_docs_index_lists_every_docs_page():
    index = (DOCS / "README.md").read_text()
    missing = sorted(page.name for page in DOCS.glob("*.md") if page.name != "README.md" and f"]({page.name})" not in index)
    assert not missing, f"docs/README.md lists no page named {missing}"


def test_every_relative_link_of_the_readme_and_docs_pages_names_a_file():
    """Pages moved between README.md and docs/ keep their links working: every relative link resolves."""
    broken = []
    for page in [README, *DOCS.glob("*.md")]:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if not re.match(r"[a-z]+:", target) and not (page.parent / target.split("#")[0]).exists():
                broken.append(f"{page.relative_to(REPO)}: {target}")
    assert not broken, broken


def test_readme_python_example_runs_as_written():
    """The README's first Python block: a credit rule's leave-one-out advantages on WatchRepair episodes."""
    code = first_blocks(section(README, "## What it is"))["python"]
    namespace: dict = {}
    exec(compile(code, "README.md", "exec"), namespace)
    rewards, advantages = namespace["rewards"], namespace["advantages"]
    returns = rewards.sum(axis=1)
    others = (returns.sum() - returns) / (len(returns) - 1)
    assert advantages.shape == rewards.shape and (advantages == (returns - others)[:, None]).all()


def test_own_env_example_runs_as_written(tmp_path):
    """docs/own_env.md "Your own environment": the env meets the contract, and both trainers learn it."""
    import json
    import os

    blocks = first_blocks(section(DOCS / "own_env.md", "## Your own environment"))
    (tmp_path / "greenhouse.py").write_text(blocks["python"])
    commands = [line for line in blocks["bash"].splitlines() if line.strip()]
    assert len(commands) == 3 and "--algo vcbm " in commands[1] and "--credit vcbm_bookmark" in commands[2]
    # the page's `python` is the interpreter running the tests, whether or not its venv is on PATH
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    env = {**os.environ, "PYTHONPATH": str(REPO), "PATH": path}
    outputs = []
    for command in commands:
        done = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
        outputs.append(done.stdout)
    assert "first_decision_optimal: reported" in outputs[0] and "is_success: reported" in outputs[0]
    roles = {"vented": "controlled", "draughts": "noise", "crop": "static", "day": "clock"}
    vcbm = json.loads((tmp_path / "runs" / "vcbm" / "greenhouse:Greenhouse-v0" / "seed0" / "summary.json").read_text())
    assert vcbm["roles"] == roles and vcbm["converged"] and vcbm["success_rate_last_episodes"] > 0.9
    ppo = json.loads((tmp_path / "runs" / "ppo" / "greenhouse:Greenhouse-v0" / "seed0" / "summary.json").read_text())
    assert ppo["credit"] == "vcbm_bookmark" and ppo["credit_roles"] == roles and ppo["converged"]
