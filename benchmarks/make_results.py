"""Regenerate benchmarks/RESULTS.md from the registered experiments and their outputs (nothing typed by hand).

    python benchmarks/make_results.py            # reads zoo_configs/experiments/ and benchmarks/results/*

RESULTS.md opens with the verdict table (algorithms.experiment.verdict: one row per paper claim of claims.yml, untested
ones included), then one section per experiment spec: the spec as data and its comparisons scored by the engine, then
the outputs' own tables, rendered by the functions that wrote them (compare's and suite's table_markdown,
credit_fidelity's, the LLM benchmarks' `table`), with the command, commit and wall time they record ("not recorded"
where an output does not). The speed micro-benchmarks' own reports close it. Make an experiment's outputs with
`python -m algorithms.experiment run NAME --out DIR` and publish them (`python -m algorithms.experiment publish NAME
--out DIR`). With the committed results it also rewrites the README's verdict block (their headline form).
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
from algorithms.experiment import specs, verdict  # noqa: E402
from algorithms.experiment.publish import RESULTS_DIR as RESULTS  # noqa: E402  (where publish puts outputs)

RESULTS_MD = REPO / "benchmarks" / "RESULTS.md"
README = REPO / "README.md"
VERDICTS_START, VERDICTS_END = "<!-- verdicts:start", "<!-- verdicts:end -->"  # the README's generated block
NOT_RECORDED = "not recorded"


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
        *_reuse_rows(record),
        *(extra or []),
    ]
    return "\n".join(["| | |", "|---|---|", *[f"| {k} | {v} |" for k, v in rows]]) + "\n"


def _reuse_rows(record: dict[str, Any] | None) -> list[tuple[str, str]]:
    """Where a resumed invocation reused runs, its wall time is its own alone: the runs it reused, and every run's time."""
    if not record or "runs_reused" not in record:
        return []
    backend = f"; backend {record['backend']}" if record.get("backend") else ""
    return [
        (
            "runs",
            f"{record['runs']} ({record['runs_reused']} reused from an earlier invocation, "
            f"{record['runs'] - record['runs_reused']} run by this one{backend})",
        ),
        ("run time summed over runs", _seconds(record.get("run_time_s_sum"))),
    ]


def compare_section(title: str, directory: Path, how: str) -> str:
    from algorithms.compare import table_markdown

    results, record = _read(directory / "results.json"), _read(directory / "run.json")
    if results is None:
        return f"## {title}\n\nNot produced yet: run `{how}`.\n"
    figures = [name for name in ("figure.png", "curves.png") if (directory / name).is_file()]
    links = " ".join(f"![{name}](results/{directory.name}/{name})" for name in figures)
    return f"## {title}\n\n{provenance(record)}\n{table_markdown(results)}\n{links}\n"


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
    """algorithms/credit_reference/: every rule's per-step credit against the replay-defined reference, one table per env."""
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
    return own_report_section(
        "LLM training pass (TRL's, shared prompts, and length-trimmed chunks, side by side in one run)", markdown, command
    )


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


def _details(name: str, path: Path, script: str | None = None) -> str:
    """The experiment's own tables (rendered by the functions that wrote its outputs), under its spec's section;
    `script`: the benchmark a script spec runs, whose section renders a spec of another name that runs it too."""
    how = f"python -m algorithms.experiment run {name} --out OUT"
    by_script = {
        "benchmarks/ccpo_learning.py": lambda: ccpo_section(path),
        "benchmarks/episodic_mujoco.py": lambda: episodic_mujoco_section(path),
    }
    kind = {
        "table2": lambda: compare_section("", path, how),
        "sb3_credit": lambda: compare_section("", path, how),
        "tabular_credit": lambda: compare_section("", path, how),
        "tabular_baselines": lambda: compare_section("", path, how),
        "vcbm_plus": lambda: compare_section("", path, how),
        "llm_learning": lambda: llm_section(path),
        "two_role_credit": lambda: ccpo_section(path),
        "branch_credit": lambda: branch_credit_section(path),
        "casi_fidelity": lambda: fidelity_section(path),
        "episodic_mujoco": lambda: episodic_mujoco_section(path),
        "reward_fit": lambda: reward_fit_section(path),
        "exact_gradient": lambda: exact_gradient_section(path),
    }
    if name in kind:
        text = kind[name]()
    elif script in by_script:
        text = by_script[script]()
    elif (path / "results.md").is_file() and (path / "experiment.json").is_file():  # an LLM study's own table
        text = f"## \n\n{provenance(_read(path / 'run.json'))}\n{(path / 'results.md').read_text()}"
    elif name.startswith("bsuite_"):
        text = suite_section("", path, how)
    elif name.startswith("credit_leakage_"):
        text = leakage_section([path])
    elif name.startswith("replay_reference_"):
        text = credit_reference_section([path])
    else:
        return ""
    return text.split("\n", 1)[1].lstrip("\n")  # the experiment's heading is the spec's


def experiment_section(spec: specs.ExperimentSpec, results_dir: Path) -> str:
    relative = spec.results.relative_to("benchmarks/results") if spec.results is not None else None
    path = results_dir / relative if relative is not None else None
    scored = verdict.score(spec, path) if path is not None else verdict.score(spec, results_dir / "absent")
    script = str(spec.run["command"][0]) if spec.kind == "script" else None
    details = _details(spec.name, path, script) if path is not None and path.exists() else ""
    if path is None or not path.exists():
        details = f"Not produced yet: run `python -m algorithms.experiment run {spec.name} --out OUT`.\n"
    return (
        f'<a id="{spec.name}"></a>\n\n## {spec.title}\n\n{verdict.spec_markdown(spec, scored)}\n### Its outputs\n\n{details}'
    ), scored


def render(results_dir: Path) -> str:
    return render_with_rows(results_dir)[0]


def render_with_rows(results_dir: Path) -> tuple[str, list[dict[str, Any]]]:
    """RESULTS.md's text and its verdict rows (the README's block is their headline form)."""
    all_specs = [specs.load_spec(name) for name in specs.spec_names()]
    sections, scores = [], {}
    for spec in all_specs:
        text, scores[spec.name] = experiment_section(spec, results_dir)
        sections.append(text)
    rows = verdict.verdict_rows(all_specs, scores, specs.load_claims())
    speed = [
        throughput_section(results_dir / "llm_throughput.md"),
        training_pass_section(results_dir / "llm_training_pass.md"),
        old_logps_section(results_dir / "llm_old_logps.md"),
        own_report_section(
            "SAC speed levers (steps/s side by side in one run; the machine shared, load averages in the report)",
            results_dir / "sac_speed_levers.md",
            "python benchmarks/sac_speed_levers.py",
        ),
        own_report_section(
            "SAC on the GPU: the same benchmark on a lent machine with one H200 and 16 CPU cores (slower per core than "
            "this project's machine), cpu against cuda side by side; stopped by its time limit after 7 of 8 runs, "
            "before the plain sac's second repeat",
            results_dir / "sac_speed_levers_cuda.md",
            "python benchmarks/sac_speed_levers.py --variants sac 'sac, cuda' sac+rrd 'sac+rrd, cuda' --steps 2000",
        ),
        own_report_section(
            "SB3 against SBX (SB3's JAX version) as the SB3 arm's engine: SAC, SAC + IRCR and SAC + RRD on "
            "EpisodicHopper-v5, steps/s side by side in one run (the machine shared, load averages in the report)",
            results_dir / "sbx_speed.md",
            "python benchmarks/sbx_speed.py",
        ),
    ]
    header = (
        "# Published results\n\nGenerated by `python benchmarks/make_results.py` from the registered experiments "
        "(`zoo_configs/experiments/`, `python -m algorithms.experiment list`) and their outputs under "
        "`benchmarks/results/`; do not edit by hand.\n\n"
        "## Verdicts: one row per paper claim of a rule, objective or algo the zoo ships\n\n"
        f"{verdict.VERDICT_LEGEND}\n\n{verdict.verdict_table(rows)}\n"
        "## Experiments\n\nEach section: the spec as data, its comparisons scored, then the outputs' own tables "
        "with the command, commit and wall time they record.\n"
    )
    speed_header = "\n# Speed (side by side in one run; no claims)\n\n"
    text = header + "\n" + "\n".join(sections) + speed_header + "\n".join(s.replace("## ", "## ", 1) for s in speed)
    return text, rows


def with_headline(readme: str, headline: str) -> str:
    """The README with its generated verdict block (between the verdicts markers) replaced by `headline`."""
    start = readme.index("\n", readme.index(VERDICTS_START)) + 1
    return readme[:start] + headline + readme[readme.index(VERDICTS_END) :]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", default=str(RESULTS), help="directory of the benchmarks' outputs")
    parser.add_argument("--out", default=str(RESULTS_MD))
    args = parser.parse_args(argv)
    text, rows = render_with_rows(Path(args.results))
    cli.atomic_write_text(args.out, text)
    print(f"wrote {args.out}")
    committed = Path(args.results).resolve() == RESULTS.resolve() and Path(args.out).resolve() == RESULTS_MD.resolve()
    if committed:  # the README's verdicts are the committed results', as RESULTS.md's; a trial render leaves it alone
        cli.atomic_write_text(README, with_headline(README.read_text(), verdict.headline_table(rows)))
        print(f"wrote the verdict block of {README}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
