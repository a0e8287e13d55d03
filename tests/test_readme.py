from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _setup_commands() -> list[str]:
    text = (REPO / "README.md").read_text()
    blocks = text.split("```")
    return [block.strip().removeprefix("bash").strip() for block in blocks[1:4:2]]


def test_readme_starts_with_two_setup_commands_and_ci_runs_the_second():
    train, tests = _setup_commands()
    assert "algorithms.train --algo vcbm --env WatchRepair-v0" in train
    assert "pytest" in tests
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    commands = [line for line in ci[1:] if line.strip() and not line.lstrip().startswith("#")]
    # exactly what a new user runs: nothing installed before the README's command (issue 25)
    assert commands == ["set -euo pipefail", 'cd "$(dirname "$0")/.."', tests, ".ci/lint"]


def _section_blocks(title: str) -> dict[str, str]:
    """The first ```python and ```bash blocks under the README heading `title`."""
    text = (REPO / "README.md").read_text()
    section = text[text.index(title) :]
    blocks: dict[str, str] = {}
    for block in section.split("```")[1::2]:
        language, _, body = block.partition("\n")
        blocks.setdefault(language.strip(), body)
    return blocks


def test_readme_own_env_example_runs_as_written(tmp_path):
    """README "Your own environment": the env meets the contract, and both trainers learn it."""
    import json
    import os
    import subprocess
    import sys

    blocks = _section_blocks("#### Your own environment")
    (tmp_path / "greenhouse.py").write_text(blocks["python"])
    commands = [line for line in blocks["bash"].splitlines() if line.strip()]
    assert len(commands) == 3 and "--algo vcbm " in commands[1] and "--credit vcbm_bookmark" in commands[2]
    # the README's `python` is the interpreter running the tests, whether or not its venv is on PATH
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
