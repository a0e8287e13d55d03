"""`python -m algorithms.experiment list | plan | run | archive | publish | report | verdicts`: one engine for every
registered experiment (zoo_configs/experiments/<NAME>.yml; `--spec path.yml` for one of your own).

- `list`: every experiment, its kind, its claims and the state of its committed results.
- `plan NAME [--seeds N]`: the runs it makes, their cost from the rate its committed run measured, and the smallest
  effect its seeds can detect (half the 95% CI width of the probability of improvement under no effect).
- `run NAME --out DIR [--short] [--seeds N] [--seed-start S] [--max-episodes N] [--workers N] [--no-progress]
  [--backend ray --address A]`: runs it with the command of its kind (compare and suite run in memory on the
  executor; a `script` experiment runs its benchmark), records the spec's hash and commit in DIR/experiment.json
  and refuses a DIR that holds results of another version of the spec (never pooled). Seeds, episodes and `--short`
  other than the spec's are recorded as deviations: such results are exploratory.
- `run ... --resume-from FILE` and `archive --out DIR --to FILE.tar.xz`: an experiment longer than one machine's
  lease moves to another: `archive` packs its finished runs, `--resume-from` unpacks them into a new --out (refused
  before any write if the archive was made under another version of the spec).
- `publish NAME --out DIR`: a registered run's outputs become the spec's committed results (benchmarks/results/NAME),
  only where they count: the spec's hash, committed before the run, no deviation, every run finished, clean code.
- `report NAME [--results DIR]`: the experiment scored by its measure, with verdicts, as Markdown.
- `verdicts [--headline]`: the verdict table, one row per paper claim of the zoo (claims.yml); `--headline`: the
  README's short form.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

from algorithms.common import cli, provenance
from algorithms.common.errors import VcbmGymError
from algorithms.experiment import archive, executor, llm_study, publish, specs, verdict
from algorithms.experiment.specs import ExperimentSpec

MAX_SEEDS = 10_000  # per method, as compare and suite accept (algorithms.experiment.jobs)
MAX_WORKERS = 256
DEFAULT_WORKERS = 2


def build_parser() -> argparse.ArgumentParser:
    parser = cli.ArgumentParser(prog="python -m algorithms.experiment", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True, parser_class=cli.ArgumentParser)
    commands.add_parser("list", help="Every registered experiment.")
    plan = commands.add_parser("plan", help="The runs, cost and detectable effect of one experiment.")
    plan.add_argument("name", help="A registered experiment, or a spec file (path.yml).")
    plan.add_argument("--seeds", type=int, default=None, help="Seeds per method (default: the spec's).")
    report = commands.add_parser("report", help="One experiment scored, with verdicts.")
    report.add_argument("name", help="A registered experiment, or a spec file (path.yml).")
    report.add_argument("--results", default=None, help="A results directory or file (default: the committed results).")
    verdicts = commands.add_parser("verdicts", help="The verdict table: one row per paper claim.")
    verdicts.add_argument(
        "--spec", action="append", default=[], metavar="PATH", help="Your own experiment's spec file too (repeatable)."
    )
    verdicts.add_argument("--headline", action="store_true", help="The README's short form: tested claims, one line each.")
    run = commands.add_parser("run", help="Run one experiment.")
    run.add_argument("name", help="A registered experiment, or a spec file (path.yml).")
    run.add_argument("--out", required=True, help="The results directory (finished runs found there are reused).")
    run.add_argument("--short", action="store_true", help="The spec's short protocol (recorded as a deviation).")
    run.add_argument("--seeds", type=int, default=None, help="Seeds per method (default: the spec's).")
    run.add_argument("--seed-start", type=int, default=None, help="The first seed (default: the spec's).")
    run.add_argument("--max-episodes", type=int, default=None, help="The episode cap of every run (default: the spec's).")
    run.add_argument(
        "--workers",
        type=int,
        default=None,
        help=f"Runs at once (default {DEFAULT_WORKERS}; a benchmark script gets it as --workers).",
    )
    run.add_argument("--backend", default="process", help="Where the runs go: process or ray.")
    run.add_argument("--address", default=None, help="With --backend ray: an existing cluster.")
    run.add_argument("--no-progress", action="store_true", help="No progress bars.")
    run.add_argument(
        "--resume-from", default=None, metavar="FILE", help="Unpack an `archive` of this experiment into --out first."
    )
    pack = commands.add_parser("archive", help="Pack an experiment's finished runs, to resume it on another machine.")
    pack.add_argument("--out", required=True, help="The results directory of an experiment run.")
    pack.add_argument("--to", required=True, help=f"The archive to write (a name ending in {archive.SUFFIX}).")
    publish = commands.add_parser("publish", help="A registered run's outputs as the spec's committed results.")
    publish.add_argument("name", help="A registered experiment.")
    publish.add_argument("--out", required=True, help="The results directory of its run.")
    return parser


def cmd_list(_: argparse.Namespace) -> None:
    for name in specs.spec_names():
        spec = specs.load_spec(name)
        claims = ", ".join(dict.fromkeys(c.claim for c in spec.comparisons)) or "-"
        state = verdict.status(spec)
        print(f"{name:36s} {spec.kind:8s} {state:14s} {spec.title} [claims: {claims}]")


def measured_seconds_per_run(spec: ExperimentSpec) -> float | None:
    """The training seconds per run that the committed results recorded (run.json), if any."""
    where = verdict.results_path(spec)
    record = None
    if where is not None and where.is_dir() and (where / "run.json").is_file():
        record = json.loads((where / "run.json").read_text())
    elif where is not None and where.is_file():
        record = json.loads(where.read_text()).get("run")
    if not isinstance(record, dict):
        if spec.kind == "llm":  # the spec's measured rate per iteration, plus a run's start
            iterations = max(s["iterations"] for s in spec.run["settings"].values())
            return llm_study.START_S + iterations * float(spec.run.get("seconds_per_iteration", 1.0))
        return None
    if record.get("run_time_s_sum") and record.get("runs"):
        return float(record["run_time_s_sum"]) / int(record["runs"])
    if record.get("wall_time_s") and spec.kind == "script":
        return float(record["wall_time_s"])  # the whole benchmark: one "run"
    return None


def borrowed_seconds_per_run(spec: ExperimentSpec) -> tuple[float, str] | None:
    """A never-run suite's rate from another registered suite spec with the same bsuite experiment, methods and
    episodes per setting, with that spec's name: the same runs at other seeds or settings cost about the same."""
    if spec.kind != "suite":
        return None

    def played(suite_spec: ExperimentSpec) -> tuple[Any, ...]:
        episodes = {setting.episodes for setting in specs.suite_settings(suite_spec)}
        return suite_spec.run["experiment"], sorted(specs.run_methods(suite_spec)), episodes

    for name in specs.spec_names():
        other = specs.load_spec(name)
        if other.kind == "suite" and other.name != spec.name and played(other) == played(spec):
            rate = measured_seconds_per_run(other)
            if rate is not None:
                return rate, other.name
    return None


def time_left(by_method: dict[str, list[dict[str, Any]]], runs: int, borrowed: tuple[float, str] | None = None) -> str:
    """The plan line's tail on the core-hours left: each method's runs not archived at that method's archived mean
    time (methods differ: tabular VCBM takes 1 s where DQN with RUDDER takes 90). A method with none archived takes
    the borrowed rate of a twin spec where there is one, else the median of the others' means: the methods run
    first may be the cheap ones, so the median of those alone would say too little."""
    means = {
        method: statistics.fmean(times)
        for method, summaries in by_method.items()
        if (times := [float(s["wall_time_s"]) for s in summaries if "wall_time_s" in s])
    }
    if not means:
        return ""
    per_method = runs / len(by_method)
    unseen = [method for method in by_method if method not in means]
    if borrowed is not None:
        fallback, source = borrowed[0], f"{borrowed[1]}'s rate"
    else:
        fallback, source = statistics.median(means.values()), "the median of the others' means"
    seconds = sum((per_method - len(summaries)) * means.get(method, fallback) for method, summaries in by_method.items())
    others = f"; {len(unseen)} method(s) not yet run at {source}, {fallback:.1f} s" if unseen else ""
    return f"; about {seconds / 3600:.2f} core-hours left (each method's runs at its archived mean time{others})"


def cmd_plan(args: argparse.Namespace) -> None:
    spec = specs.load_spec(args.name)
    n = args.seeds if args.seeds is not None else len(spec.seeds)
    cli.check_int(n, "--seeds", 1, MAX_SEEDS)
    runs = specs.runs_of(spec, n)
    rate = measured_seconds_per_run(spec)
    print(f"{spec.name}: {spec.title}")
    print(f"  kind {spec.kind}; methods {', '.join(specs.run_methods(spec))}; seeds {n} per method")
    what = "benchmark invocation" if spec.kind == "script" else "runs"
    borrowed = borrowed_seconds_per_run(spec) if rate is None else None
    if borrowed is not None:
        print(
            f"  {runs} {what}; cost about {runs * borrowed[0] / 3600:.2f} core-hours ({borrowed[0]:.1f} s per run as "
            f"measured by {borrowed[1]}, the same suite, methods and episodes; this spec has no run record)"
        )
    elif rate is None:
        print(f"  {runs} {what}; cost: no measured rate (no committed run record)")
    else:
        scale = n / len(spec.seeds) if spec.kind == "script" else 1.0
        total = runs * rate * scale
        print(f"  {runs} {what}; cost about {total / 3600:.2f} core-hours ({rate:.1f} s per run as measured)")
    by_method = archive.archived_by_method(spec) if spec.kind != "script" else None
    if by_method is not None:
        done = sum(len(summaries) for summaries in by_method.values())
        print(f"  in progress: {done} of {runs} runs archived in benchmarks/in_progress{time_left(by_method, runs, borrowed)}")
    print(f"  budget: ours {spec.budget['ours']}; paper {spec.budget['paper']}")
    half = verdict.detectable_effect(n, n)
    print(f"  detectable effect at {n} vs {n} seeds: P(improvement) outside 0.5 +- {half:.2f} (95%)")
    for comparison in spec.comparisons:
        where = f" in {comparison.setting}" if comparison.setting else ""
        print(f"  claim {comparison.claim}: {comparison.treatment} vs {comparison.control}{where}")


def cmd_report(args: argparse.Namespace) -> None:
    spec = specs.load_spec(args.name)
    path = Path(args.results).resolve() if args.results else None
    scored = verdict.score(spec, path)
    print(f"## {spec.title}\n\n{verdict.spec_markdown(spec, scored)}")


def all_scores() -> tuple[list[ExperimentSpec], dict[str, dict[str, Any]]]:
    all_specs = [specs.load_spec(name) for name in specs.spec_names()]
    return all_specs, {spec.name: verdict.score(spec) for spec in all_specs}


def cmd_verdicts(args: argparse.Namespace) -> None:
    all_specs, scores = all_scores()
    extra = [specs.load_spec(path if path.endswith((".yml", ".yaml")) else f"{path}.yml") for path in args.spec]
    scores |= {spec.name: verdict.score(spec) for spec in extra}
    rows = verdict.verdict_rows(all_specs + extra, scores, specs.all_claims(extra))
    print(verdict.headline_table(rows) if args.headline else verdict.verdict_table(rows), end="")


# --- run ---


def deviations_of(spec: ExperimentSpec, args: argparse.Namespace) -> dict[str, Any]:
    deviations: dict[str, Any] = {}
    if args.short:
        deviations["short"] = True
    if args.seeds is not None and args.seeds != len(spec.seeds):
        deviations["seeds"] = args.seeds
    if args.seed_start is not None and args.seed_start != spec.seeds.start:
        deviations["seed_start"] = args.seed_start
    if args.max_episodes is not None and args.max_episodes != spec.run.get("max_episodes"):
        deviations["max_episodes"] = args.max_episodes
    return deviations


def command_argv(spec: ExperimentSpec, args: argparse.Namespace, out: Path) -> list[str]:
    """The compare, suite or benchmark arguments that make the experiment's runs."""
    run = dict(spec.run)
    if args.short:
        if "short" not in run:
            raise VcbmGymError(f"--short: experiment {spec.name} declares no short protocol; expected a spec with run.short")
        run |= run.pop("short")
    run.pop("short", None)
    seeds = args.seeds if args.seeds is not None else run.pop("seeds", len(spec.seeds))
    seed_start = args.seed_start if args.seed_start is not None else spec.seeds.start
    max_episodes = args.max_episodes if args.max_episodes is not None else run.get("max_episodes")
    common = ["--workers", str(args.workers or DEFAULT_WORKERS), "--out", str(out)] + (
        ["--no-progress"] if args.no_progress else []
    )
    common += ["--backend", args.backend] + (["--address", args.address] if args.address else [])
    hyperparams = ["--hyperparams", *run["hyperparams"]] if run.get("hyperparams") else []
    seeding = ["--seeds", str(seeds), "--seed-start", str(seed_start)]
    if spec.kind == "llm":
        if args.max_episodes is not None:
            raise VcbmGymError(f"--max-episodes: experiment {spec.name} trains for iterations; expected none")
        if args.short and "short" not in run:
            raise VcbmGymError(f"--short: experiment {spec.name} declares no short protocol; expected a spec with run.short")
        llm_study.settings_of(spec.run), llm_study.methods_of(spec.run), llm_study.target_of(spec.run)  # before any write
        return []
    if spec.kind == "compare":
        cap = ["--max-episodes", str(max_episodes)] if max_episodes is not None else []
        return ["--env", run["env"], "--algos", *run["algos"], *seeding, *cap, *common, *hyperparams]
    if spec.kind == "suite":
        extra = ["--protocol", run["protocol"]] if run.get("protocol") else []
        extra += ["--settings", *map(str, run["settings"])] if run.get("settings") else []
        extra += ["--episodes", str(run["episodes"])] if run.get("episodes") else []
        if max_episodes is not None:
            extra += ["--episodes", str(max_episodes)]
        return ["--experiment", run["experiment"], "--algos", *run["algos"], *seeding, *extra, *common, *hyperparams]
    if any(v is not None for v in (args.seeds, args.seed_start, args.max_episodes)):
        raise VcbmGymError(
            f"experiment {spec.name} runs a benchmark with its own seeds and budget: "
            "expected no --seeds, --seed-start or --max-episodes"
        )
    workers = ["--workers", str(args.workers)] if args.workers is not None else []  # else the script's own default
    return [*map(str, run["command"]), "--out", str(out / run["out"]) if run.get("out") else str(out), *workers]


def check_out(spec: ExperimentSpec, out: Path, record: dict[str, Any]) -> None:
    """Refuse an --out that holds results of another version of the spec or other deviations: never pooled."""
    path = out / specs.RECORD_FILE
    if path.is_file():
        check_same(cli.read_json_object(path, "experiment record"), record, f"--out {str(out)!r}")


def check_same(earlier: dict[str, Any], record: dict[str, Any], where: str) -> None:
    same = earlier.get("experiment") == record["experiment"] and earlier.get("spec_hash") == record["spec_hash"]
    if not same or earlier.get("deviations") != record["deviations"]:
        raise VcbmGymError(
            f"{where} holds results of experiment {earlier.get('experiment')!r} at spec hash "
            f"{str(earlier.get('spec_hash'))[:12]} with deviations {earlier.get('deviations')}; this run is "
            f"{record['experiment']!r} at {record['spec_hash'][:12]} with {record['deviations']}: results of different specs "
            "are never pooled; expected a new --out"
        )


def cmd_run(args: argparse.Namespace) -> None:
    spec = specs.load_spec(args.name)
    if args.workers is not None:
        cli.check_int(args.workers, "--workers", 1, MAX_WORKERS)
    if args.seeds is not None:
        cli.check_int(args.seeds, "--seeds", 1, MAX_SEEDS)
    if args.seed_start is not None:
        cli.check_seed(args.seed_start, "--seed-start")
    if args.max_episodes is not None:
        cli.check_int(args.max_episodes, "--max-episodes", 1)
    out = Path(args.out).resolve()
    argv = command_argv(spec, args, out)
    record = specs.run_record(spec, deviations_of(spec, args))
    check_out(spec, out, record)
    if args.resume_from:
        resume_from = Path(args.resume_from)
        check_same(archive.archived_record(resume_from), record, f"--resume-from {str(resume_from)!r}")
        archive.unpack_archive(resume_from, out)
    if spec.kind == "script":
        execute_script(spec, argv, out, record)
        return
    from algorithms.experiment import compare, llm_study, suite

    if spec.kind == "llm":

        def command(_: list[str]) -> Any:
            short = spec.run.get("short", {}) if args.short else {}
            n = args.seeds or short.get("seeds") or len(spec.seeds)
            first = args.seed_start if args.seed_start is not None else spec.seeds.start
            seeds = range(first, first + n)
            command_line = provenance.command_line("python -m algorithms.experiment", args.argv)
            return llm_study.run_study(
                spec.run, seeds, out, args.workers or DEFAULT_WORKERS, short.get("iterations"), command_line
            )
    else:
        command = compare.run if spec.kind == "compare" else suite.run
    created = not out.exists()
    cli.output_dir(out, "--out")
    cli.atomic_write_json(out / specs.RECORD_FILE, record)  # before any run: a stopped run resumes under its spec
    try:
        command(argv)
    except VcbmGymError:
        if created and [p.name for p in out.iterdir()] == [specs.RECORD_FILE]:  # refused before any run: leave nothing
            (out / specs.RECORD_FILE).unlink()
            out.rmdir()
        raise
    score = f"python -m algorithms.experiment report {args.name} --results {out}"
    print(f"experiment {spec.name}: results in {out}; score them with: {score}")


def script_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The child's environment with this checkout first on PYTHONPATH: a script's own folder is first on its sys.path,
    so without it the packages would come from wherever they are installed (an editable install of another checkout),
    not from the checkout whose spec and commit the run records."""
    paths = [str(specs.REPO), *(p for p in environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(specs.REPO))]
    return {**environ, "PYTHONPATH": os.pathsep.join(paths)}


def execute_script(spec: ExperimentSpec, argv: list[str], out: Path, record: dict[str, Any]) -> None:
    """A benchmark with its own harness, run as a child process. It stops when the engine stops: a SIGTERM to the
    engine (whose default action would end it at once, leaving the child running) raises, and the child is sent
    SIGTERM and waited for, so that it keeps its finished runs as its own stop does."""
    cli.output_dir(out, "--out")
    cli.atomic_write_json(out / specs.RECORD_FILE, record)
    script = specs.REPO / argv[0]
    command = [sys.executable, str(script), *argv[1:]] if script.suffix == ".py" else [sys.executable, "-m", *argv]
    process = subprocess.Popen(command, cwd=specs.REPO, env=script_environment(os.environ))
    try:
        with executor.sigterm_stops():
            code = process.wait()
    except BaseException:
        process.terminate()
        process.wait()
        raise
    if code != 0:
        raise VcbmGymError(f"experiment {spec.name}: its benchmark {argv[0]} exited with {code}; expected 0")


def cmd_archive(args: argparse.Namespace) -> None:
    to = Path(args.to)
    name, runs = archive.write_archive(Path(args.out), to)
    resume = f"python -m algorithms.experiment run {name} --out NEW_DIR --resume-from {to}"
    print(f"{runs} finished run(s) of experiment {name} in {to}; resume with: {resume}")


def cmd_publish(args: argparse.Namespace) -> None:
    spec = specs.load_spec(args.name)
    target = publish.publish(spec, Path(args.out))
    print(f"published {spec.name} in {target}; now: python benchmarks/make_results.py, then commit")


COMMANDS = {
    "list": cmd_list,
    "plan": cmd_plan,
    "report": cmd_report,
    "verdicts": cmd_verdicts,
    "run": cmd_run,
    "archive": cmd_archive,
    "publish": cmd_publish,
}


def run(argv: Sequence[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    args.argv = argv
    COMMANDS[args.command](args)


def main(argv: Sequence[str] | None = None) -> int:
    return cli.main(run, argv)


if __name__ == "__main__":
    sys.exit(main())
