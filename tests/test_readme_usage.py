"""The usage commands as a newcomer pastes them, the README's table of algorithms and the list of credit rules.

- Every `python -m algorithms.train` command of the quick start and the usage pages (USAGE_PAGES) writes its own log
  dir, so none is refused for finding another's run there; every file a command names ships with the repository.
- The quick start and the first block of docs/usage.md run top to bottom on a clean directory, as written.
- The README's table of algorithms (arm, the credit rules each takes) is generated from the algorithm registry and
  each arm's own check of `--credit`, and docs/credit.md's list of rules from the rule registry:
  `python -m tests.test_readme_usage` (in the repository's root) rewrites both.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.doc_pages import DOCS, README, REPO, section

RULES_PAGE = DOCS / "credit.md"
RULES_BEGIN = re.compile(r"<!-- rules: generated from [^\n]*-->\n")
RULES_END = "<!-- end of rules -->"
ALGOS_BEGIN = re.compile(r"<!-- algos: generated from [^\n]*-->\n")
ALGOS_END = "<!-- end of algos -->"
REGENERATE = "python -m tests.test_readme_usage"
# The pages that hold the usage commands a newcomer pastes one after another (each train command its own log dir);
# docs/several_processes.md repeats an LLM command under torchrun, on purpose on the same run.
USAGE_PAGES = ("usage.md", "credit.md", "own_env.md", "bsuite.md", "llm.md", "appworld.md", "vllm_cpu.md")

# The env each algo's accepted credit rules are checked on (the table says it): an env of the kind the arm is for.
DEFAULT_PROBE_ENV = "WatchRepair-v0"
PROBE_ENV = {
    "sac": "EpisodicHopper-v5",
    "td3": "EpisodicHopper-v5",
    "loop": "TextWatchRepair-v0",
    "vcbm-loop": "TextWatchRepair-v0",
    "trl-grpo": "TextWatchRepair-v0",
    "ccpo": "TextThinkSolve-v0",
}
# The paper each algo implements or follows (docs/papers/ has a page for the ones this project reproduces).
PAPERS = {
    "vcbm": "[Selvakumar 2026, Sec. IV-A](docs/papers/vcbm.md) (arXiv:2610.24032)",
    "vcbm-plus": "[VCBM](docs/papers/vcbm.md) without its greedy trap (beyond the paper; ARCHITECTURE.md)",
    "rudder": "[Arjona-Medina et al. 2019](docs/papers/reward_redistribution.md) (arXiv:1806.07857)",
    "mc": "Monte Carlo control (the tabular baseline)",
    "td": "Q-learning (the tabular baseline)",
    "ppo": "Schulman et al. 2017 (arXiv:1707.06347), Stable-Baselines3",
    "a2c": "Mnih et al. 2016 (arXiv:1602.01783), Stable-Baselines3",
    "dqn": "Mnih et al. 2015 (Nature 518), Stable-Baselines3",
    "sac": "Haarnoja et al. 2018 (arXiv:1801.01290), Stable-Baselines3",
    "td3": "Fujimoto et al. 2018 (arXiv:1802.09477), Stable-Baselines3",
    "loop": "LOOP, Chen et al. 2025 (arXiv:2502.01600); [objectives](docs/papers/base_objectives.md)",
    "vcbm-loop": "[Selvakumar 2026, Sec. V-B](docs/papers/vcbm.md)",
    "trl-grpo": "GRPO, Shao et al. 2024 (arXiv:2402.03300), TRL's `GRPOTrainer`",
    "ccpo": "[CCPO / SEPO, Li et al.](docs/papers/ccpo.md) (arXiv 2603.21563)",
}


def rules_block() -> str:
    """docs/credit.md's list of the built-in credit rules, by the kind each emits (vcbm_gym.credit.base.CreditRule.emits)."""
    from vcbm_gym.credit.base import ADVANTAGES, REWARDS
    from vcbm_gym.credit.registry import RULES, rule_class

    def names(kind: str) -> str:
        return ", ".join(f"`{name}`" for name in RULES if rule_class(name).emits == kind)

    return (
        f"Rules that emit per-step **advantages**: {names(ADVANTAGES)}.\n"
        f"Rules that emit per-step **rewards**, a redistribution of the return: {names(REWARDS)}.\n"
    )


def accepted_rules(algo: str, env: str) -> list[str]:
    """The credit rules a train command of `algo` on `env` accepts: those its arm resolves without refusing."""
    from algorithms import train
    from algorithms.common.errors import VcbmGymError
    from vcbm_gym.credit.registry import RULES

    accepted = []
    for rule in RULES:
        try:
            train.resolve_argv(["--algo", algo, "--env", env, "--credit", rule])
        except (VcbmGymError, SystemExit):  # refused in one line (SystemExit: argparse's refusal)
            continue
        accepted.append(rule)
    return accepted


def algos_block() -> str:
    """The README's table: every registered algo, the arm that trains it, the credit rules it takes (its default in
    bold) on the env named, and its paper."""
    from algorithms.registry import ALGOS, get_arm

    assert set(PAPERS) == set(ALGOS), f"PAPERS names {sorted(PAPERS)}, the registry {sorted(ALGOS)}"
    rows = ["| Algo | Arm | Credit rules it takes (`--credit`; default in bold), checked on | Paper |", "|---|---|---|---|"]
    for algo in ALGOS:
        arm = get_arm(algo)
        env = PROBE_ENV.get(algo, DEFAULT_PROBE_ENV)
        default = arm.default_credit(algo)
        rules = [f"**`{rule}`**" if rule == default else f"`{rule}`" for rule in accepted_rules(algo, env)]
        rules.sort(key=lambda rule: not rule.startswith("**"))
        taken = ", ".join(rules) if rules else "none: its own credit"
        rows.append(f"| `{algo}` | {arm.name} | {taken} (`{env}`) | {PAPERS[algo]} |")
    return "\n".join(rows) + "\n"


def _span(text: str, begin: re.Pattern[str], end: str, what: str) -> tuple[int, int]:
    found = begin.search(text)
    assert found is not None and end in text[found.end() :], f"the generated {what} is missing"
    return found.end(), text.index(end, found.end())


def test_rule_list_is_the_registry():
    text = RULES_PAGE.read_text()
    start, end = _span(text, RULES_BEGIN, RULES_END, "list of rules in docs/credit.md")
    assert text[start:end] == rules_block(), (
        "docs/credit.md's rule list differs from the registry: run python -m tests.test_readme_usage"
    )


def test_rule_block_names_every_registered_rule_once():
    from vcbm_gym.credit.registry import RULES

    named = re.findall(r"`([a-z_]+)`", rules_block())
    assert sorted(named) == sorted(RULES)


def test_readme_algo_table_is_the_registry_and_the_arms_credit_checks():
    pytest.importorskip("trl", reason="the LLM arm's algos need the llm extra")
    pytest.importorskip("mujoco", reason="sac and td3 are checked on EpisodicHopper-v5 (the mujoco extra)")
    text = README.read_text()
    start, end = _span(text, ALGOS_BEGIN, ALGOS_END, "table of algorithms in README.md")
    assert text[start:end] == algos_block(), (
        "README's algo table differs from the registry: run python -m tests.test_readme_usage"
    )


def test_algo_table_rows_say_what_each_arm_refuses():
    """A wrong table would list a rule an arm refuses: DQN takes no advantage rule, LOOP no reward rule."""
    pytest.importorskip("trl", reason="the LLM arm's algos need the llm extra")
    assert accepted_rules("dqn", "WatchRepair-v0") == ["rudder", "vcbm_bookmark", "ircr", "rrd"]
    assert "loo" in accepted_rules("loop", "TextWatchRepair-v0") and "rudder" not in accepted_rules("loop", "TextWatchRepair-v0")
    assert accepted_rules("vcbm", "WatchRepair-v0") == []


def _usage_text() -> str:
    """The quick start (the README's first command) and the usage pages."""
    quick_start = README.read_text().split("```")[1]
    return f"```{quick_start}```\n" + "\n".join((DOCS / page).read_text() for page in USAGE_PAGES)


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
    """The quick start's train command, then every `python -m` command of docs/usage.md's first block, in order, in
    one clean directory that has the repository's zoo_configs beside it (as a clone has)."""
    quick_start = [
        part.strip() for part in README.read_text().split("```")[1].split("&&") if "python -m algorithms.train" in part
    ]
    block = section(DOCS / "usage.md", "# Usage").split("```")[1]
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


def _rewrite(page: Path, begin: re.Pattern[str], end: str, block: str) -> None:
    text = page.read_text()
    start, stop = _span(text, begin, end, f"block in {page.name}")
    page.write_text(text[:start] + block + text[stop:])


if __name__ == "__main__":
    _rewrite(RULES_PAGE, RULES_BEGIN, RULES_END, rules_block())
    _rewrite(README, ALGOS_BEGIN, ALGOS_END, algos_block())
