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
    assert tests in (REPO / ".ci" / "run").read_text()
