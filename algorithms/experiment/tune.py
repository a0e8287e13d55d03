"""`python -m algorithms.tune --algo ALGO --env ENV --trials N`: hyperparameter search with Optuna.

Samples the algo's search space (zoo_configs/search_spaces.yml, or --search-space FILE; search_space.py) with
Optuna's TPE sampler ("Algorithms for Hyper-Parameter Optimization", Bergstra et al., NeurIPS 2011); every trial
trains the same seeds (--seeds-per-trial, from --seed-start) with `algorithms.train.execute` (trials.py), every
hyperparameter not searched keeping its zoo value: --hyperparams are parsed once, here, and a trial's values are
applied to them in memory and resolved once (`algorithms.train.resolve_spec`). Objective, per arm (the arm's
`objective`):
- tabular and SB3: minimise the mean episodes to converge over the seeds (the convergence criterion of
  algorithms/common/convergence.py; a run that hits the cap counts with the cap, as compare counts it; an env
  that reports no `first_decision_optimal`, e.g. CartPole-v1, has no criterion and is refused before any
  trial). Intermediate value every --report-every episodes: the rate of incorrect first decisions (1 - the
  correct-decision moving average), lower is better.
- LLM (loop, vcbm-loop, trl-grpo): maximise the task goal completion (text envs: the optimal-decision rate)
  averaged over the last --final-window iterations and the seeds. Intermediate value every iteration: that
  iteration's rate.
A trial whose first seed's intermediate value is worse than the median of the finished trials' at the same
step is pruned (Optuna's MedianPruner, after --startup-trials trials and --warmup-steps steps). Only the first
seed reports: the median rule takes the best value a trial has reported, which a later seed could not undo. A
first seed that converges (and so stops) holds its last rate for the rest of the budget, as algorithms.plot
draws it, so that the fast trials count in the median at every later step.

The study lives in a journal file (--storage, default OUT/study.journal; Optuna's JournalFileBackend), so
several tune processes, on one machine or on several that share the file's filesystem, fill one study:
start the same command more than once. --trials counts the whole study's trials, whoever ran them (asking
for a trial holds a lock beside the journal, so the total is exact); a trial whose process died (same
host) is marked failed and not counted (study.py). --workers W runs W worker loops with the executor
(algorithms.experiment.executor): W processes here, or W Ray tasks with --backend ray (a local Ray instance, or
--address), which share the study through the same file. Every worker loop that joins the study gets its own
TPE seed, --sampler-seed + the number of loops that joined before it (recorded in the study and in
run.json): the first loop of a study proposes what a single-process tune with that seed proposes, and two
processes started with the same command do not propose the same trials.

Stopping: Ctrl-C or SIGTERM stops the worker loops (their running trials are marked failed and not counted)
and exits with 130 or 143 and one `stopped:` line; a worker process exits by itself when tune dies (even by
SIGKILL), and its running trial is then failed and discounted by the next process that asks for a trial.
Every argument, the --storage file (a directory, a file that is not an Optuna journal, or a journal cut
mid-line by a writer that died are one line) and the study's settings are checked before anything is written.

Writes into OUT: tune_config.yml (the resolved settings: search space, objective, sampler, pruner, the base
hyperparameters), trials.json (every trial: state, value, params, per-seed values), best.yml (the best
trial's hyperparameters as a zoo snippet keyed by env id: `algorithms.train --config OUT/best.yml`),
study_history.png and study_intermediate.png (Optuna's plots) and run.json (command, commit, wall time).
Trial runs go to OUT/<study>/trial<k>/seed<s>/.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import sys
import warnings
from pathlib import Path
from typing import Any, Sequence

import yaml

from algorithms import train
from algorithms.common import cli, config, convergence, provenance
from algorithms.common.errors import VcbmGymError
from algorithms.experiment import executor
from algorithms.experiment.results import save_figure
from algorithms.experiment.search_space import SEARCH_SPACES, ZOO_CONFIG_DIR, Param, apply_params, load_search_space
from algorithms.experiment.study import SAMPLERS, Settings, check_storage, load_optuna, open_study, trial_overrides
from algorithms.experiment.trials import worker_loop
from algorithms.registry import get_arm

BACKENDS = executor.BACKENDS
STUDY_PLOTS = ("study_history.png", "study_intermediate.png")  # Optuna's optimisation history, intermediate values


def run_workers(s: Settings, workers: int, backend: str, address: str | None) -> int:
    """`workers` worker loops with the executor: one in this process, processes here, or Ray tasks; the
    trials they ran."""
    ran, errors = [], []

    def finished(_: Settings, count: int | None, error: str | None) -> None:
        if error is None:
            ran.append(count)
        else:
            errors.append(error)

    try:
        executor.run_jobs(
            functools.partial(worker_loop, quiet=backend == "ray"),  # a Ray task's prints go nowhere
            [s] * workers,
            workers=0 if backend == "process" and workers == 1 else workers,
            finished=finished,
            backend=backend,
            address=address,
            what="tune --backend ray",
        )
    except executor.STOPS as exc:
        kept = f"the study's finished trials are kept in {s.storage!r} (running ones are not counted)"
        raise executor.stopped(exc, kept) from None
    if errors:
        raise VcbmGymError(f"{len(errors)} tune worker(s) failed: " + "; ".join(errors))
    return sum(ran)


def best_snippet(study: Any, s: Settings) -> str:
    """The best trial's hyperparameters (and tune's fixed --hyperparams) as a zoo_configs entry."""
    best = study.best_trial
    values = {**s.fixed_values, **apply_params(s.base, best.params)}
    seeds = f"seeds {s.seeds[0]}-{s.seeds[-1]}" if len(s.seeds) > 1 else f"seed {s.seeds[0]}"
    header = [
        f"# algorithms.tune: best of {len(study.trials)} trials of study {s.study_name!r} ({s.storage})",
        f"# trial {best.number}: {s.objective.direction} {s.objective.name} = {best.value:.6g} ({seeds})",
        f"# use: python -m algorithms.train --algo {s.algo} --env {s.env} --config THIS_FILE",
    ]
    return "\n".join(header) + "\n" + yaml.safe_dump({s.env: values}, sort_keys=False)


def trials_record(study: Any) -> list[dict[str, Any]]:
    return [
        {
            "number": t.number,
            "state": t.state.name,
            "value": t.value,
            "params": t.params,
            "user_attrs": {k: v for k, v in t.user_attrs.items()},
            "duration_s": t.duration.total_seconds() if t.duration else None,
            "last_step": t.last_step,
        }
        for t in study.trials
    ]


def plot_study(study: Any, out: Path) -> list[Path]:
    """Optuna's optimisation history and intermediate values (matplotlib backends), each as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from optuna.visualization import matplotlib as ovm

    written = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the matplotlib backends are marked experimental
        for name, draw in zip(STUDY_PLOTS, (ovm.plot_optimization_history, ovm.plot_intermediate_values)):
            ax = draw(study)
            fig = ax.figure
            fig.set_size_inches(8, 4.5)
            save_figure(fig, out / name, dpi=120, bbox_inches="tight")
            plt.close(fig)
            written.append(out / name)
    return written


def build_parser() -> cli.ArgumentParser:
    parser = cli.ArgumentParser(prog="python -m algorithms.tune", description=__doc__.splitlines()[0])
    parser.add_argument("--algo", required=True)
    parser.add_argument("--env", default="WatchRepair-v0")
    parser.add_argument("--trials", type=int, required=True, help="trials in the whole study (all processes together)")
    parser.add_argument("--seeds-per-trial", type=int, default=3, help="seeds every trial trains (the same in each trial)")
    parser.add_argument("--seed-start", type=int, default=0)
    parser.add_argument("--max-episodes", type=int, default=None, help="episode cap per run (tabular, SB3)")
    parser.add_argument("--iterations", type=int, default=None, help="iterations per run (LLM)")
    parser.add_argument(
        "--hyperparams", nargs="*", action="extend", default=[], metavar="KEY=VALUE", help="fixed for every trial"
    )
    parser.add_argument("--search-space", default=None, help=f"YAML file like {SEARCH_SPACES.relative_to(ZOO_CONFIG_DIR.parent)}")
    parser.add_argument("--out", default=None, help="output dir (default: runs/tune/<algo>/<env>)")
    parser.add_argument("--storage", default=None, help="journal file of the study (default: OUT/study.journal)")
    parser.add_argument("--study-name", default=None, help="default: <algo>-<env>")
    parser.add_argument(
        "--report-every", type=int, default=None, help="episodes between intermediate values (default 100; LLM: every iteration)"
    )
    parser.add_argument("--warmup-steps", type=int, default=None, help="no pruning before (default: a tenth of the budget)")
    parser.add_argument("--startup-trials", type=int, default=5, help="random trials before TPE, and before pruning")
    parser.add_argument("--final-window", type=int, default=5, help="LLM: iterations averaged for the objective")
    parser.add_argument(
        "--sampler-seed", type=int, default=0, help="TPE's seed (the k-th worker loop to join the study uses seed + k)"
    )
    parser.add_argument("--workers", type=int, default=1, help="worker loops run by this command")
    parser.add_argument("--backend", default="process", help=f"where the workers run, one of: {', '.join(BACKENDS)}")
    parser.add_argument("--address", default=None, help="with --backend ray: an existing Ray cluster")
    return parser


def check_args(args: Any) -> None:
    cli.check_int(args.trials, "--trials", 1, 100_000)
    cli.check_int(args.seeds_per_trial, "--seeds-per-trial", 1, 1_000)
    cli.check_seed(args.seed_start, "--seed-start")
    cli.check_seed(args.seed_start + args.seeds_per_trial - 1, "--seed-start + --seeds-per-trial - 1 (the last seed)")
    cli.check_int(args.startup_trials, "--startup-trials", 0)
    cli.check_int(args.final_window, "--final-window", 1)
    cli.check_int(args.workers, "--workers", 1, 256)
    if args.sampler_seed is not None:
        cli.check_seed(args.sampler_seed, "--sampler-seed")
    if args.report_every is not None:
        cli.check_int(args.report_every, "--report-every", 1)
    executor.check_backend(args.backend, args.address, args.workers, "tune --backend ray")


def budget_of(args: Any, algo: str) -> tuple[dict[str, Any], tuple[str, ...]]:
    """The budget flag given to tune, as the hyperparameter it sets ({budget_key: n} or {}) and as given (the record);
    the flag of another arm is refused."""
    arm = get_arm(algo)
    given = {"--max-episodes": args.max_episodes, "--iterations": args.iterations}
    for flag, value in given.items():
        if value is not None and flag != arm.budget_flag:
            raise VcbmGymError(f"{flag} {value} with algo {algo!r}: expected {arm.budget_flag}")
    value = given.get(arm.budget_flag)
    if value is None:
        return {}, ()
    return {arm.budget_key: cli.check_int(value, arm.budget_flag, 1)}, (arm.budget_flag, str(value))


def resolve_base(
    args: Any, params: Sequence[Param], fixed_values: dict[str, Any], budget_values: dict[str, Any]
) -> dict[str, Any]:
    """The base config of a trial, resolved once, and a resolution at every edge of every searched value: a search
    space the arm would refuse is one line before any trial."""
    try:
        base = dict(train.resolve_spec(args.algo, args.env, args.seed_start, {**fixed_values, **budget_values}).hyperparams)
        for param in params:
            for value in param.corners():
                overrides = trial_overrides(fixed_values, base, {param.name: value}, budget_values)
                train.resolve_spec(args.algo, args.env, args.seed_start, overrides)
    except VcbmGymError as exc:
        raise VcbmGymError(f"search space of {args.algo!r} on {args.env}: {exc}") from None
    return base


def resolve_settings(args: Any) -> tuple[Settings, dict[str, Any]]:
    """Check everything and resolve the base config once (and at every edge of the search space), before any trial.
    --hyperparams are parsed here: the one time a tune command parses them."""
    check_args(args)
    arm = get_arm(args.algo)
    budget_values, budget_flag = budget_of(args, args.algo)
    params = tuple(load_search_space(args.algo, args.search_space))
    fixed_values = config.parse_overrides(args.hyperparams)  # malformed items: one line now
    base = resolve_base(args, params, fixed_values, budget_values)
    if arm.reports_convergence:  # the objective is episodes to converge: an env without the criterion has none
        convergence.require_criterion(args.env, base.get("env_kwargs") or {}, "tune minimises episodes to converge")
    budget = int(base[arm.budget_key])
    warmup = args.warmup_steps if args.warmup_steps is not None else budget // 10
    cli.check_int(warmup, "--warmup-steps", 0)
    out = Path(args.out or Path("runs") / "tune" / args.algo / args.env)
    storage = Path(args.storage) if args.storage else out / "study.journal"
    settings = Settings(
        algo=args.algo,
        env=args.env,
        arm=arm.name,
        trials=args.trials,
        seeds=tuple(range(args.seed_start, args.seed_start + args.seeds_per_trial)),
        budget=budget,
        report_every=args.report_every or (1 if arm.budget_key == "iterations" else 100),  # LLM: every iteration
        warmup_steps=warmup,
        startup_trials=args.startup_trials,
        final_window=args.final_window,
        sampler_seed=args.sampler_seed,
        study_name=args.study_name or f"{args.algo}-{args.env}",
        storage=str(storage.resolve()),
        out=str(out.resolve()),
        params=params,
        base=base,
        fixed=tuple(args.hyperparams),
        budget_flag=budget_flag,
        fixed_values=fixed_values,
        budget_values=budget_values,
    )
    check_storage(settings.storage)
    return settings, base


def run(argv: Sequence[str] | None = None) -> dict[str, Any]:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    started = provenance.start()
    with executor.sigterm_stops():
        return _run(args, argv, started)


def tune_config(settings: Settings, args: Any, started: provenance.Start) -> dict[str, Any]:
    """tune_config.yml: the resolved settings, search space, objective, sampler, pruner and base hyperparameters."""
    recorded = ("params", "base", "fixed_values", "budget_values")  # written below in their own form
    return {
        **{k: v for k, v in dataclasses.asdict(settings).items() if k not in recorded},
        "objective": dataclasses.asdict(settings.objective),
        "search_space": {
            p.name: {k: v for k, v in dataclasses.asdict(p).items() if k != "name" and v not in (None, False)}
            for p in settings.params
        },
        "sampler": {
            "name": "TPESampler",
            "n_startup_trials": settings.startup_trials,
            "seed": settings.sampler_seed,
            "seed_of_each_worker_loop": "seed + the number of loops that joined the study before it (run.json)",
        },
        "pruner": {
            "name": "MedianPruner",
            "n_startup_trials": settings.startup_trials,
            "n_warmup_steps": settings.warmup_steps,
            "step": "episodes (LLM: iterations) of the first seed",
        },
        "base_hyperparams": settings.base,
        "backend": args.backend,
        "address": args.address,
        "workers": args.workers,
        **started.environment,
    }


def _run(args: Any, argv: list[str], started: provenance.Start) -> dict[str, Any]:
    settings, _ = resolve_settings(args)
    out = cli.output_dir(settings.out, "--out")
    cli.output_dir(Path(settings.storage).parent, "--storage's directory")
    open_study(settings)  # a study created with other settings is refused before tune_config.yml is written
    config_text = yaml.safe_dump(json.loads(json.dumps(tune_config(settings, args, started))), sort_keys=False)
    cli.atomic_write_text(out / "tune_config.yml", config_text)
    ran = run_workers(settings, args.workers, args.backend, args.address)
    study = open_study(settings)
    cli.atomic_write_json(out / "trials.json", trials_record(study))
    counts = finish(study, settings, out)
    best = study.best_trial
    provenance.write_run_record(
        out,
        "python -m algorithms.tune",
        argv,
        started,
        trials_run_here=ran,
        study_trials=len(study.trials),
        states=counts,
        best_trial=best.number,
        best_value=best.value,
        best_params=best.params,
        sampler_seeds=study.user_attrs.get(SAMPLERS, []),
    )
    report(study, settings, out, ran, counts)
    return {
        "best_value": best.value,
        "best_params": best.params,
        "best_trial": best.number,
        "trials": len(study.trials),
        "ran": ran,
        "states": counts,
    }


def finish(study: Any, settings: Settings, out: Path) -> dict[str, int]:
    """best.yml and the study's plots (a study with no complete trial is one line); the trials per state."""
    optuna = load_optuna()
    complete = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    if not complete:
        states = {t.state.name for t in study.trials}
        raise VcbmGymError(
            f"study {settings.study_name!r} has no complete trial ({len(study.trials)} trial(s): "
            f"{', '.join(sorted(states))}); see {str(out / 'trials.json')!r}"
        )
    cli.atomic_write_text(out / "best.yml", best_snippet(study, settings))
    plot_study(study, out)
    return {state: sum(1 for t in study.trials if t.state.name == state) for state in ("COMPLETE", "PRUNED", "FAIL")}


def report(study: Any, settings: Settings, out: Path, ran: int, counts: dict[str, int]) -> None:
    """What the command prints: the study's trials, the best one and its zoo snippet, the files written."""
    optuna = load_optuna()
    best, objective = study.best_trial, settings.objective
    print(
        f"{len(study.trials)} trial(s) in study {settings.study_name!r} ({ran} run by this command): "
        f"{counts['COMPLETE']} complete, {counts['PRUNED']} pruned, {counts['FAIL']} failed"
    )
    running = len(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)))
    if running:
        print(
            f"{running} trial(s) still running in other processes: best.yml holds the best finished trial; "
            "the last process to finish writes the final one"
        )
    print(f"best: trial {best.number}, {objective.direction} {objective.name} = {best.value:.6g}")
    print((out / "best.yml").read_text(), end="")
    plots = ", ".join(str(out / name) for name in STUDY_PLOTS)
    print(f"wrote {out / 'best.yml'}, {out / 'trials.json'}, {plots}, {out / 'tune_config.yml'}")


def main(argv: Sequence[str] | None = None) -> int:
    return cli.main(run, argv)


if __name__ == "__main__":
    sys.exit(main())
