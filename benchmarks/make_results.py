"""Regenerate benchmarks/RESULTS.md from the benchmarks' JSON outputs under benchmarks/results/ (nothing typed by hand).

    python benchmarks/make_results.py            # reads benchmarks/results/*, writes benchmarks/RESULTS.md

Sections (each from its own directory; a missing one is listed as not yet produced, with the command that makes it):
- table2/          `algorithms.compare` results.json + run.json: Table II, VCBM vs RUDDER on WatchRepair-v0, 20 seeds
                   (benchmarks/compare_watch_repair.sh)
- sb3_credit/      the same files for SB3 PPO with and without credit rules (benchmarks/sb3_credit.sh)
- tabular_credit/  the same files for tabular Q-learning (td) with and without credit rules (TABULAR_CREDIT)
- llm_learning/    benchmarks/llm_learning.py's results.json (its own table function renders it)
- ccpo_learning/   benchmarks/ccpo_learning.py's results.json + run.json: two-role credit (its own table function)
- branch_credit/   benchmarks/branch_credit.py's results.json (its own table function renders it): vineppo and rice
                   beside loop and vcbm-loop, per iteration and per unit of compute
- llm_throughput.md  benchmarks/llm_throughput.py's own report (--markdown), rollouts/s old vs new path
- llm_training_pass.md  benchmarks/llm_training_pass.py's own report (--markdown), TRL's training pass vs shared prompts
- llm_old_logps.md  benchmarks/llm_old_logps.py's own report (--markdown), seconds per iteration with and without
                   TRL's old-policy pass
- credit_fidelity/ `algorithms.credit_fidelity` fidelity.json (+ training.json) + run.json: CASI fidelity
- sac_speed_levers.md  benchmarks/sac_speed_levers.py's own report (--markdown), SAC variants' steps/s side by side
- sac_speed_levers_cuda.md  the same report of its CPU and CUDA variants, measured on a machine with a GPU
- credit_reference_<env>.json  `algorithms.credit_reference`: each rule's fidelity to the replay-defined reference
                   (its table and run record inside the JSON)
Each section states the command, the git commit and the wall time that its outputs record, and says "not recorded"
where an output does not record one. The tables are rendered by the same functions that wrote the outputs' own
tables (compare.table_markdown, credit_fidelity.fidelity_markdown / training_markdown, llm_learning.table).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from algorithms.common import cli  # noqa: E402

RESULTS = REPO / "benchmarks" / "results"
NOT_RECORDED = "not recorded"
# td, td+rudder, td+vcbm_bookmark: the tabular arm's credit slot (algorithms/tabular/credit.py), 20 seeds. The cap was
# set from the runs' cost alone, before any result was read, to keep the compare near 25 minutes on two shared cores
# (td+rudder's LSTM costs ~50 ms an episode there; 5,000 and then 3,000 were started and stopped as too slow); the run
# dirs stay in runs/.
TABULAR_CREDIT = (
    "python -m algorithms.compare --env WatchRepair-v0 --algos td td+rudder td+vcbm_bookmark --seeds 20 "
    "--max-episodes 1500 --workers 2 --out runs/tabular_credit --no-progress && mkdir -p benchmarks/results/tabular_credit && "
    "cp runs/tabular_credit/"
    "{results.json,run.json,table.md,figure.png,curves.png} benchmarks/results/tabular_credit/"
)


def _read(path: Path) -> dict[str, Any] | None:
    return cli.read_json_object(path, "benchmark output") if path.is_file() else None


def _commit(record: dict[str, Any] | None) -> str:
    if not record or not record.get("git_commit"):
        return NOT_RECORDED
    return f"`{record['git_commit'][:12]}`" + (" (with uncommitted changes)" if record.get("git_dirty") else "")


def _seconds(value: Any) -> str:
    if value is None:
        return NOT_RECORDED
    value = float(value)
    return f"{value:,.1f} s" if value < 120 else f"{value:,.0f} s ({value / 60:,.1f} min)"


def provenance(record: dict[str, Any] | None, wall_time_s: Any = None, extra: list[tuple[str, str]] | None = None) -> str:
    """The command / commit / wall-time table of one section."""
    wall = record.get("wall_time_s") if record else wall_time_s
    rows = [
        ("command", f"`{record['command']}`" if record and record.get("command") else NOT_RECORDED),
        ("commit", _commit(record)),
        ("wall time", _seconds(wall)),
        *(extra or []),
    ]
    return "\n".join(["| | |", "|---|---|", *[f"| {k} | {v} |" for k, v in rows]]) + "\n"


def compare_section(title: str, directory: Path, how: str) -> str:
    from algorithms.compare import table_markdown

    results, record = _read(directory / "results.json"), _read(directory / "run.json")
    if results is None:
        return f"## {title}\n\nNot produced yet: run `{how}`.\n"
    extra = []
    if record:
        extra = [
            (
                "runs",
                f"{record['runs']} ({record['runs_reused']} reused from an earlier invocation, "
                f"{record['runs_run']} run by this one; backend {record['backend']})",
            ),
            ("run time summed over runs", _seconds(record.get("run_time_s_sum"))),
        ]
    figures = [name for name in ("figure.png", "curves.png") if (directory / name).is_file()]
    links = " ".join(f"![{name}](results/{directory.name}/{name})" for name in figures)
    return f"## {title}\n\n{provenance(record, extra=extra)}\n{table_markdown(results)}\n{links}\n"


def _benchmark(name: str) -> Any:
    """A benchmark script as a module, for the table function that wrote its own output."""
    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def llm_section(directory: Path) -> str:
    results, record = _read(directory / "results.json"), _read(directory / "run.json")
    title = "LLM learning benchmark (loop, vcbm-loop, trl-grpo on the embedded text envs)"
    if results is None:
        return f"## {title}\n\nNot produced yet: run `python benchmarks/llm_learning.py`.\n"
    module = _benchmark("llm_learning")
    wall = results.get("wall_time_s")
    try:
        table = module.table(results["settings"], results["window"], wall if wall is not None else float("nan"))
    except (KeyError, TypeError, ValueError, AttributeError) as exc:  # the benchmark changed its format
        own = directory / "results.md"
        if not own.is_file():
            raise
        table = (
            f"(The benchmark's table function does not read this results.json ({type(exc).__name__}: {exc}); "
            "its own results.md, written with it, follows.)\n\n" + own.read_text()
        )
    note = (
        ""
        if record
        else "\nThe benchmark's results.json records its wall time (of its last invocation: runs it "
        "reused are not counted) but not its command or commit.\n"
    )
    curves = f"\n![curves](results/{directory.name}/curves.png)\n" if (directory / "curves.png").is_file() else ""
    return (
        f"## {title}\n\n{provenance(record, wall, [('seeds', str(results.get('seeds', NOT_RECORDED)))])}{note}\n{table}{curves}"
    )


def fidelity_section(directory: Path) -> str:
    from algorithms.credit_fidelity import fidelity_markdown, training_markdown

    fidelity, record = _read(directory / "fidelity.json"), _read(directory / "run.json")
    title = "CASI credit fidelity (SetRetrieval-v0)"
    if fidelity is None:
        return (
            f"## {title}\n\nNot produced yet: run `python -m algorithms.credit_fidelity --env SetRetrieval-v0 "
            "--requests 1000 --train --out benchmarks/results/credit_fidelity`.\n"
        )
    training = _read(directory / "training.json")
    body = fidelity_markdown(fidelity) + ("\n" + training_markdown(training) if training else "")
    return f"## {title}\n\n{provenance(record)}\n{body}"


def suite_section(title: str, directory: Path, how: str) -> str:
    """A bsuite sweep of algorithms.suite: its table (rendered by the suite's own table function) and bsuite's plots."""
    from algorithms.suite import table_markdown

    results, record = _read(directory / "results.json"), _read(directory / "run.json")
    if results is None:
        return f"## {title}\n\nNot produced yet: run `{how}`.\n"
    extra = []
    if record:
        reused = record.get("runs_reused")
        runs = str(record["runs"]) + (
            "" if reused is None else f" ({reused} reused from an earlier invocation, {record['runs_run']} run by this one)"
        )
        extra = [
            ("runs", runs),
            ("workers", str(record.get("workers"))),
            ("run time summed over runs", _seconds(record.get("run_time_s_sum"))),
        ]
    plots = " ".join(f"![{path.name}](results/{directory.name}/{path.name})" for path in sorted(directory.glob("*.png")))
    return f"## {title}\n\n{provenance(record, extra=extra)}\n{table_markdown(results)}\n{plots}\n"


def ccpo_section(directory: Path) -> str:
    """benchmarks/ccpo_learning.py: CCPO, SEPO and the Shapley form against GRPO on TextThinkSolve-v0."""
    title = "Two-role credit (CCPO, SEPO, Shapley vs GRPO on the shared reward) on TextThinkSolve-v0"
    results, record = _read(directory / "results.json"), _read(directory / "run.json")
    if results is None:
        return f"## {title}\n\nNot produced yet: run `python benchmarks/ccpo_learning.py`.\n"
    module = _benchmark("ccpo_learning")
    table = module.table(results, results["window"], results["iterations"], results.get("wall_time_s"))
    curves = f"\n![curves](results/{directory.name}/curves.png)\n" if (directory / "curves.png").is_file() else ""
    extra = [("seeds", str(results.get("seeds", NOT_RECORDED))), ("hyperparameters", " ".join(results["hyperparameters"]))]
    return f"## {title}\n\n{provenance(record, results.get('wall_time_s'), extra)}\n{table}{curves}"


def episodic_mujoco_section(directory: Path) -> str:
    """benchmarks/episodic_mujoco.py: SAC on episodic MuJoCo with and without IRCR / RRD, its own table and curves."""
    title = "Episodic-reward MuJoCo: SAC, SAC + IRCR, SAC + RRD and dense SAC"
    results, record = _read(directory / "results.json"), _read(directory / "run.json")
    if results is None:
        return f"## {title}\n\nNot produced yet: run `python benchmarks/episodic_mujoco.py`.\n"
    table = (directory / "table.md").read_text()
    plots = " ".join(f"![{path.name}](results/{directory.name}/{path.name})" for path in sorted(directory.glob("*.png")))
    return f"## {title}\n\n{provenance(record)}\n{table}\n{plots}\n"


def reward_fit_section(directory: Path) -> str:
    """benchmarks/reward_fit.py: each reward rule's fit to the withheld dense reward during SAC's training."""
    title = "Episodic-reward MuJoCo: each reward rule's fit to the dense reward"
    results, record = _read(directory / "results.json"), _read(directory / "run.json")
    if results is None:
        return f"## {title}\n\nNot produced yet: run `python benchmarks/reward_fit.py`.\n"
    intro = (
        "Pearson's r between the rewards a rule wrote for the last 10 episodes (before it learned from each) and the "
        "dense rewards the episodic env withheld, logged as SAC trains (the episodic_mujoco runs' settings). r = 1 "
        "would hand SAC the dense reward itself, so dense SAC above bounds what a perfect redistribution buys at "
        "this budget.\n"
    )
    table = (directory / "table.md").read_text()
    plots = " ".join(f"![{path.name}](results/{directory.name}/{path.name})" for path in sorted(directory.glob("*.png")))
    return f"## {title}\n\n{provenance(record)}\n{intro}\n{table}\n{plots}\n"


def exact_gradient_section(path: Path) -> str:
    """benchmarks/exact_gradient.py: policy-gradient estimators against the exact gradient (COCOA's dB scores)."""
    title = "Exact policy gradients on LinearKeyToDoor and WatchRepair: bias, variance and SNR (dB) of each estimator"
    result = _read(path)
    if result is None:
        return f"## {title}\n\nNot produced yet: run `python benchmarks/exact_gradient.py`.\n"
    settings = ", ".join(f"{key} {value}" for key, value in result["settings"].items())
    intro = (
        "Each seed is a tabular softmax policy with N(0, 1) logits on COCOA's linear key-to-door task; its exact "
        "gradient comes from dynamic programming on the env's MDP (docs/papers/cocoa.md). Lower bias and variance, "
        "higher SNR are better; -inf bias is an unbiased estimator (COCOA's analytic expectation). On WatchRepair-v0 the "
        "policy sees (repaired flag, brand, t); the MDP keeps each reward's mean (the noise is mean zero given the brand "
        "and the actions, so J and its gradient are exact), while the estimators read episodes of the env itself, "
        "noise included.\n"
    )
    tables = [result["table"]] + ([result["watch_repair"]["table"]] if "watch_repair" in result else [])
    body = "\n\n".join(tables)
    return f"## {title}\n\n{provenance(result.get('run'), extra=[('settings', settings)])}\n{intro}\n{body}\n"


def credit_reference_section(paths: list[Path]) -> str:
    """algorithms/credit_reference.py: every rule's per-step credit against the replay-defined reference, one table per env."""
    title = "Replay-defined credit: each rule's fidelity to the reference Q(s_t, a_t) - V(s_t)"
    body = []
    for path in paths:
        result = _read(path)
        if result is None:
            body.append(f"Not produced yet: run `python -m algorithms.credit_reference` (writes {path.name}).\n")
            continue
        settings = ", ".join(f"{key} {value}" for key, value in result["settings"].items() if key != "return")
        body.append(f"{provenance(result.get('run'), extra=[('settings', settings)])}\n{result['table']}\n")
    intro = (
        "From snapshots along episodes of the behaviour policy, K continuations per alternative estimate Q(s_t, a) and "
        "V(s_t) (a text env's alternatives are the tools its turn offers; a set action's steps are its slots, each "
        "slot's reference v(a) - E_b v(a with the slot := b) from the env's exact set value); each rule's credit on the "
        "same episodes is scored against Q(s_t, a_t) - V(s_t) with CASI's fidelity metrics and leakage "
        "(docs/papers/replay_credit.md). The reference reproduces the analytic credit where it is known: on "
        "WatchRepair-v0 +-E[G | repair] / 2 at the first decision within 4 standard errors and exactly 0 after it "
        "(tests/test_credit_reference.py), on umbrella_length/9 exactly +-1 at the first decision and 0 after it "
        "(tests/test_credit_reference_umbrella.py), on TextWatchWorkshop-v0 at the movement station alone "
        "(tests/test_credit_reference_envs.py); each table's own-leakage line shows it on the scored episodes. A "
        "reference with a large standard error at the decision (mean |z| well under 2) pulls every rule's sign "
        "agreement towards 0.5.\n"
    )
    return f"## {title}\n\n{intro}\n" + "\n".join(body)


def leakage_section(paths: list[Path]) -> str:
    title = "Credit leakage: the share of |advantage| each rule puts after the decision"
    found = [(path, _read(path)) for path in paths]
    body = []
    for path, result in found:
        if result is None:
            body.append(f"Not produced yet: run `python benchmarks/credit_leakage.py --out benchmarks/results/{path.name}`.\n")
            continue
        record = result.get("run")
        settings = [
            ("behaviour policy", str(result["behaviour_policy"])),
            ("episodes", f"{result['seeds']} seeds x {result['episodes_per_seed']:,}, batches of {result['batch_episodes']}"),
        ]
        shown = result["env"] + (f" {result['env_kwargs']}" if result.get("env_kwargs") else "")
        table = _benchmark("credit_leakage").markdown_table(shown, result["rules"], result["seeds"])
        body.append(f"{provenance(record, extra=settings)}\n{table}\n")
    intro = (
        "On tasks whose true credit is known (only the first decision's advantage is non-zero in expectation), "
        "the share of |A| a rule puts on later steps; 0 is perfect credit, (T - 1) / T is an even spread "
        "(`benchmarks/credit_leakage.py`).\n"
    )
    return f"## {title}\n\n{intro}\n" + "\n".join(body)


def own_report_section(title: str, markdown: Path, command: str, provenance_line: str = "") -> str:
    """A benchmark's own report (its --markdown output) as it printed it, without the file's own title."""
    if not markdown.is_file():
        return f"## {title}\n\nNot produced yet: run `{command}`.\n"
    report = markdown.read_text().split("\n", 1)[1].strip()
    return f"## {title}\n\n{provenance_line}{report}\n"


def throughput_section(markdown: Path) -> str:
    """benchmarks/llm_throughput.py's report, which records no commit."""
    command = (
        "python benchmarks/llm_throughput.py --json benchmarks/results/llm_throughput.json "
        "--markdown benchmarks/results/llm_throughput.md"
    )
    title = "LLM rollout throughput (old and new rollout path, side by side in one run)"
    return own_report_section(title, markdown, command, f"Command: `{command}`; commit: {NOT_RECORDED}.\n\n")


def training_pass_section(markdown: Path) -> str:
    """benchmarks/llm_training_pass.py's report, which names its command and commit itself."""
    command = (
        "python benchmarks/llm_training_pass.py --json benchmarks/results/llm_training_pass.json "
        "--markdown benchmarks/results/llm_training_pass.md"
    )
    return own_report_section("LLM training pass (TRL's and shared prompts, side by side in one run)", markdown, command)


def old_logps_section(markdown: Path) -> str:
    """benchmarks/llm_old_logps.py's report, which names its command and commit itself."""
    command = (
        "python benchmarks/llm_old_logps.py --json benchmarks/results/llm_old_logps.json "
        "--markdown benchmarks/results/llm_old_logps.md"
    )
    title = "LLM iterations: TRL's old-policy pass and the first epoch's log-probs, side by side in one run"
    return own_report_section(title, markdown, command)


def branch_credit_section(directory: Path) -> str:
    results, record = _read(directory / "results.json"), _read(directory / "run.json")
    title = "Branch-based credit in the LLM arm: vineppo and rice beside loop and vcbm-loop, per iteration and per compute"
    if results is None:
        return f"## {title}\n\nNot produced yet: run `python benchmarks/branch_credit.py`.\n"
    module = _benchmark("branch_credit")
    table = module.table(results["settings"], results["window"], results.get("wall_time_s"))
    reduced = [f"{name}: {r['reduced']}" for name, r in results["settings"].items() if r.get("reduced")]
    note = (
        f"\nREDUCED, not the full protocol (twr-paper, 10 seeds, 220 iterations; the script's docstring gives its cost): "
        f"{'; '.join(reduced)}.\n"
        if reduced
        else ""
    )
    curves = f"\n![curves](results/{directory.name}/curves.png)\n" if (directory / "curves.png").is_file() else ""
    return f"## {title}\n\n{provenance(record, results.get('wall_time_s'))}{note}\n{table}{curves}"


def render(results_dir: Path) -> str:
    sections = [
        compare_section(
            "Table II: VCBM vs RUDDER on WatchRepair-v0", results_dir / "table2", "bash benchmarks/compare_watch_repair.sh"
        ),
        compare_section(
            "SB3 PPO with credit rules on WatchRepair-v0", results_dir / "sb3_credit", "bash benchmarks/sb3_credit.sh"
        ),
        compare_section("Tabular Q-learning with credit rules on WatchRepair-v0", results_dir / "tabular_credit", TABULAR_CREDIT),
        llm_section(results_dir / "llm_learning"),
        ccpo_section(results_dir / "ccpo_learning"),
        branch_credit_section(results_dir / "branch_credit"),
        throughput_section(results_dir / "llm_throughput.md"),
        training_pass_section(results_dir / "llm_training_pass.md"),
        old_logps_section(results_dir / "llm_old_logps.md"),
        fidelity_section(results_dir / "credit_fidelity"),
        suite_section(
            "bsuite umbrella_length, bsuite's full protocol: tabular VCBM",
            results_dir / "bsuite_vcbm_umbrella_length",
            "bash benchmarks/bsuite_sweeps.sh",
        ),
        suite_section(
            "bsuite short sweep on umbrella_length: PPO and DQN, each alone and with every reward rule (rudder, ircr, "
            "rrd, vcbm_bookmark), and VCBM, with the current zoo entries (PPO's pilot round 11, DQN's n-step round 6)",
            results_dir / "bsuite_short_umbrella_length",
            "bash benchmarks/bsuite_sweeps.sh OUT 2 umbrella_length",
        ),
        suite_section(
            "bsuite umbrella_length chains 1-4 (short budget): PPO and DQN with their bsuite zoo entries (PPO's pilot round "
            "11, DQN's round 6)",
            results_dir / "bsuite_umbrella_length_chains_1_to_4_sb3_baselines",
            "python -m algorithms.suite --short --experiment umbrella_length --settings 0 1 2 3 --seeds 3 --algos ppo dqn "
            '--hyperparams "env_kwargs={integer_observations: true}" --out OUT',
        ),
        suite_section(
            "bsuite short sweep on umbrella_distract: PPO and DQN, each alone and with every reward rule, and VCBM "
            "(chain length 20; not tuned here: PPO's pilot round 8 entry, DQN's umbrella_length entry; 2026-12-04)",
            results_dir / "bsuite_short_umbrella_distract",
            "bash benchmarks/bsuite_sweeps.sh",
        ),
        suite_section(
            "bsuite short sweep on discounting_chain: PPO and DQN alone and with rudder, ircr and rrd (PPO's entry from "
            "pilot round 7: 200-step rollouts, so whole 100-step episodes reach the rules)",
            results_dir / "bsuite_short_discounting_chain",
            "bash benchmarks/bsuite_sweeps.sh OUT 2 discounting_chain",
        ),
        episodic_mujoco_section(results_dir / "episodic_mujoco"),
        reward_fit_section(results_dir / "reward_fit"),
        own_report_section(
            "SAC speed levers (steps/s side by side in one run; the machine shared, load averages in the report)",
            results_dir / "sac_speed_levers.md",
            "python benchmarks/sac_speed_levers.py",
        ),
        own_report_section(
            "SAC on the GPU: the same benchmark on a lent machine with one H200 and 16 CPU cores (slower per core than "
            "this project's machine), cpu against cuda side by side; the code was that of commit 3d8dac8 (the copy's "
            "git record named an earlier commit, 7d3fa7c, with uncommitted changes); stopped by its time limit after 7 "
            "of 8 runs, before the plain sac's second repeat",
            results_dir / "sac_speed_levers_cuda.md",
            "python benchmarks/sac_speed_levers.py --variants sac 'sac, cuda' sac+rrd 'sac+rrd, cuda' --steps 2000",
        ),
        leakage_section(
            [
                results_dir / "credit_leakage.json",
                results_dir / "credit_leakage_umbrella_length.json",
                results_dir / "credit_leakage_umbrella_length_integer_view.json",
            ]
        ),
        exact_gradient_section(results_dir / "exact_gradient.json"),
        credit_reference_section(
            [
                results_dir / f"credit_reference_{env}.json"
                for env in ("WatchRepair-v0", "umbrella_length_9", "TextWatchWorkshop-v0", "SetRetrieval-v0")
            ]
        ),
    ]
    header = (
        "# Published results\n\nGenerated by `python benchmarks/make_results.py` from the JSON outputs under "
        "`benchmarks/results/`; do not edit by hand. Each section gives the command, the commit and the wall time "
        "that its outputs record.\n"
    )
    return header + "\n" + "\n".join(sections)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", default=str(RESULTS), help="directory of the benchmarks' outputs")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "RESULTS.md"))
    args = parser.parse_args(argv)
    text = render(Path(args.results))
    cli.atomic_write_text(args.out, text)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
