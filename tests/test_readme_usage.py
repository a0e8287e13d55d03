"""The README's usage commands as a newcomer pastes them, and its list of credit rules.

- Every `python -m algorithms.train` command of the quick start and the "Usage" sections writes its own log dir, so
  none is refused for finding another's run there; every file a command names ships with the repository.
- The quick start and the "## Usage" block run top to bottom on a clean directory, as written.
- The list of credit rules is generated from the rule registry: `python tests/test_readme_usage.py` rewrites it.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
RULES_BEGIN = re.compile(r"<!-- rules: generated from [^\n]*-->\n")
RULES_END = "<!-- end of rules -->"


def rules_block() -> str:
    """The README's list of the built-in credit rules, by the kind each emits (vcbm_gym.credit.base.CreditRule.emits)."""
    from vcbm_gym.credit.base import ADVANTAGES, REWARDS
    from vcbm_gym.credit.registry import RULES, rule_class

    def names(kind: str) -> str:
        return ", ".join(f"`{name}`" for name in RULES if rule_class(name).emits == kind)

    return (
        f"Rules that emit per-step **advantages**: {names(ADVANTAGES)}.\n"
        f"Rules that emit per-step **rewards**, a redistribution of the return: {names(REWARDS)}.\n"
    )


def _rules_span(text: str) -> tuple[int, int]:
    begin = RULES_BEGIN.search(text)
    assert begin is not None and RULES_END in text[begin.end() :], "README: the generated list of rules is missing"
    return begin.end(), text.index(RULES_END, begin.end())


def test_readme_rule_list_is_the_registry():
    text = README.read_text()
    start, end = _rules_span(text)
    assert text[start:end] == rules_block(), "README's rule list differs from the registry: run python tests/test_readme_usage.py"


def test_rule_block_names_every_registered_rule_once():
    from vcbm_gym.credit.registry import RULES

    named = re.findall(r"`([a-z_]+)`", rules_block())
    assert sorted(named) == sorted(RULES)


def _usage_text() -> str:
    """The quick start (the README's first command) and the "## Usage" part, up to the next top-level section."""
    text = README.read_text()
    quick_start = text.split("```")[1]
    usage = text[text.index("\n## Usage\n") :]
    following = usage.find("\n## ", 1)
    return f"```{quick_start}```\n" + (usage if following < 0 else usage[:following])


def _bash_lines(text: str) -> list[str]:
    """The commands of the ```bash blocks: continuation lines joined, comments dropped."""
    lines = []
    for block in text.split("```")[1::2]:
        language, _, body = block.partition("\n")
        if language.strip() not in ("bash", ""):
            continue
        for line in body.replace("\\\n", " ").splitlines():
            command = line.split(" #")[0].strip()
            if command and not command.startswith("#"):
                lines.append(command)
    return lines


def _train_argvs(text: str) -> list[list[str]]:
    """The argv of every algorithms.train command (after `&&` chains and launchers such as torchrun)."""
    argvs = []
    for line in _bash_lines(text):
        for part in line.split("&&"):
            words = shlex.split(part)
            if "algorithms.train" in words:
                argvs.append(words[words.index("algorithms.train") + 1 :])
    return argvs


def test_every_usage_train_command_writes_its_own_log_dir():
    from algorithms import train

    argvs = _train_argvs(_usage_text())
    assert len(argvs) > 10 and argvs[0] == ["--algo", "vcbm", "--env", "WatchRepair-v0", "--seed", "0"]  # the quick start
    seen: dict[Path, list[str]] = {}
    for argv in argvs:
        args, _ = train.parse(argv)
        log_dir = Path(args.log_dir or Path("runs") / args.algo / args.env / f"seed{args.seed}")
        assert log_dir not in seen, f"{shlex.join(argv)!r} and {shlex.join(seen[log_dir])!r} share the log dir {log_dir}"
        seen[log_dir] = argv
        if args.config is not None and not args.config.startswith("runs/"):  # a file of an earlier command's run
            assert (REPO / args.config).is_file(), f"{shlex.join(argv)!r}: --config {args.config} is not in the repository"


def test_example_config_is_read_and_checked(tmp_path):
    from algorithms import train

    spec = train.resolve_argv(["--algo", "vcbm", "--config", str(REPO / "zoo_configs" / "examples" / "my_vcbm.yml")])
    assert spec.hyperparams["z_thresh"] == 3.0 and spec.hyperparams["forced_visits"] == 40


@pytest.mark.slow
def test_usage_block_runs_top_to_bottom_after_the_quick_start(tmp_path):
    """The quick start's train command, then every `python -m` command of the "## Usage" block, in order, in one
    clean directory that has the repository's zoo_configs beside it (as a clone has)."""
    text = README.read_text()
    quick_start = [part.strip() for part in text.split("```")[1].split("&&") if "python -m algorithms.train" in part]
    usage = text[text.index("\n## Usage\n") :]
    block = usage.split("```")[1]
    commands = quick_start + [line for line in _bash_lines(f"```{block}```") if line.startswith("python -m ")]
    assert len(commands) == 4, commands
    (tmp_path / "zoo_configs").symlink_to(REPO / "zoo_configs")
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    env = {**os.environ, "PYTHONPATH": str(REPO), "PATH": path}
    for command in commands:
        done = subprocess.run(
            ["bash", "-c", f"{command} --no-progress"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
        )
        assert done.returncode == 0, f"{command}: {done.stderr[-2000:]}"
        assert "TensorBoard logs:" in done.stdout
    assert {p.name for p in (tmp_path / "runs").iterdir()} == {"vcbm", "vcbm3", "vcbm_z35", "my_vcbm"}


def write_rules_block() -> None:
    text = README.read_text()
    start, end = _rules_span(text)
    README.write_text(text[:start] + rules_block() + text[end:])


if __name__ == "__main__":
    write_rules_block()
