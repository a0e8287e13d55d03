"""`python -m algorithms.compare --env WatchRepair-v0 --algos vcbm rudder --seeds 20 --out DIR`: Table II and Figure 1.

Resolves every algo once, in memory (`algorithms.train.resolve_spec`: zoo config, --hyperparams parsed once,
the episode cap, the label's credit rule), and trains every (algo, seed) with `algorithms.train.execute` as a
job of the executor (algorithms.experiment.jobs, .executor), each in its own process (`--backend process`) or
as a Ray task on a local Ray instance or an existing cluster (`--backend ray [--address ADDR]`,
algorithms.experiment.distributed), one log dir per run (`DIR/<algo>/seed<k>/`,
where train writes summary.json, config.yml and TensorBoard events), then writes `DIR/results.json`,
`DIR/table.md` (Table II of the VCBM paper, arXiv:2610.24032), `DIR/figure.png` (Figure 1), `DIR/curves.png` /
`.svg` (the correct-decision rate across seeds, algorithms.experiment.plot) and `DIR/run.json` (the command, commit,
wall time, backend and resolved configs, each with `argv_first_seed`: the `algorithms.train` arguments that train its
first seed, for people; compare builds no command line for a run), and prints the table.

Statistics (algorithms.experiment.stats): per method the range, mean +- std and median of the paper's table, and the
median, interquartile mean and mean with percentile-bootstrap 95% CIs (scipy.stats.bootstrap, seeds
resampled; "Deep Reinforcement Learning at the Edge of the Statistical Precipice", Agarwal et al., 2021), the
converged fraction with its exact CI; for every pair Mann-Whitney U and the probability of improvement
(the normalised U) with its bootstrap CI. The bootstrap's seed is fixed, so results.json is reproducible.

Resuming: a run whose log dir holds a summary.json written for the same resolved config (its
config hash: algo, env, seed and every hyperparameter after zoo_configs, --hyperparams and the
episode cap) and unchanged since (its checksum) is reused, not rerun; any other run is rerun and
the reason printed. So a killed comparison rerun with the same arguments computes only the missing
seeds and ends with the same results.json (which holds no wall times for that reason: they go to
run.json), and an edited zoo config or request never reuses a stale result.

Stopping (the executor's, the same on either backend): Ctrl-C or SIGTERM stops the workers within seconds,
keeps every finished seed and exits with 130 or 143; a worker process exits by itself when compare dies
(even by SIGKILL), and so does a local Ray instance that compare started. A lock file (DIR/.compare.lock)
keeps a second compare out of the same --out. Every argument (the algos and their configs, the env's
criterion) is checked before --out is created or written.

Non-converged runs (the episode cap ended them) are counted and flagged; they enter every statistic
(range, mean, median, IQM, their CIs, the probability of improvement, Mann-Whitney) with their episode
count at the cap, a lower bound of their true episodes-to-converge (so all of them are conservative in
their favour), and the table says how many there are and that they are counted so.

An env without the convergence criterion (one that reports no evaluation-only
`info["first_decision_optimal"]`, e.g. CartPole-v1) has no episodes to converge to compare: compare
plays one random episode of the env before any run starts and refuses it with one line (runs of such an
env train for their budget and report their return: `python -m algorithms.train`).

An algo of the form `ALGO+RULE` (e.g. `ppo+vcbm_bookmark`) runs ALGO with the credit rule RULE (the
hyperparameter `credit`, as `--algo ALGO --credit RULE` would set it).
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path
from typing import Any, Sequence

from algorithms.common import cli, config, convergence, provenance
from algorithms.common.errors import VcbmGymError
from algorithms.experiment import executor
from algorithms.experiment.jobs import (
    MAX_SEEDS,
    MAX_WORKERS,
    Job,
    count_finished,
    parse_label,
    resolve_label,
    seed_jobs,
    train_jobs,
)
from algorithms.experiment.results import locked, runs_record, save_figure, write_results
from algorithms.experiment.stats import (
    aggregate_estimates,
    bootstrap_description,
    describe,
    fraction_estimate,
    improvement_estimate,
    mann_whitney,
)
from algorithms.registry import get_arm

BACKENDS = executor.BACKENDS
CENSORED = (
    "runs that hit the episode cap enter every statistic (range, mean, median, IQM, their bootstrap CIs, the "
    "probability of improvement and Mann-Whitney) with their episode count at the cap, a lower bound of their "
    "episodes to converge, and are flagged in `converged`"
)


def overrides_of(args: argparse.Namespace) -> dict[str, Any]:
    """--hyperparams (parsed here, the one time compare parses them) and --max-episodes, for every run."""
    overrides = config.parse_overrides(args.hyperparams)
    if args.max_episodes is not None:
        overrides["max_episodes"] = args.max_episodes
    return overrides


def make_jobs(args: argparse.Namespace) -> list[Job]:
    """One job per (algo, seed), each carrying its RunSpec (bad settings fail here, before any run starts). The
    config is resolved once per algo; only the seed differs."""
    out = Path(args.out).resolve()  # absolute: a Ray task's working directory is not compare's
    overrides = overrides_of(args)
    seeds = range(args.seed_start, args.seed_start + args.seeds)
    jobs = []
    for label in args.algos:
        try:
            spec = resolve_label(label, args.env, args.seed_start, overrides)
        except VcbmGymError as exc:
            raise VcbmGymError(f"{label}: {exc}") from None
        jobs += seed_jobs(label, spec, seeds, lambda seed, label=label: out / label / f"seed{seed}")
    return jobs


def train_command(args: argparse.Namespace, label: str, seed: int) -> list[str]:
    """The `python -m algorithms.train` arguments that train the same run as compare's job, for people reading
    run.json (compare resolves the run in memory and never builds or parses this)."""
    algo, credit = parse_label(label)
    log_dir = Path(args.out).resolve() / label / f"seed{seed}"
    command = ["--algo", algo, *(["--credit", credit] if credit else [])]
    command += ["--env", args.env, "--seed", str(seed), "--log-dir", str(log_dir), "--no-progress"]
    if args.max_episodes is not None:
        command += ["--max-episodes", str(args.max_episodes)]
    return command + (["--hyperparams", *args.hyperparams] if args.hyperparams else [])


NEEDS = "compare measures episodes to converge"


def require_criterion(env_id: str, jobs: list[Job]) -> None:
    """Refuse, before any run, an algo that does not measure episodes to converge (the LLM ones), and an
    env that reports no `first_decision_optimal` at the end of an episode: one random episode per distinct
    env_kwargs (the runners settle which evaluation keys an env reports at its first episode,
    algorithms.common.convergence)."""
    for job in jobs:  # an LLM run reports no episodes to converge either: its runs would be wasted hours
        if not get_arm(job.spec.algo).reports_convergence:
            raise VcbmGymError(
                f"--algos {job.label}: {NEEDS}, which only the tabular and SB3 algos report; "
                "compare LLM algos with python benchmarks/llm_learning.py"
            )
    seen: list[dict[str, Any]] = []
    for job in jobs:
        env_kwargs = dict(job.spec.hyperparams.get("env_kwargs") or {})
        if env_kwargs not in seen:
            seen.append(env_kwargs)
            convergence.require_criterion(env_id, env_kwargs, NEEDS)


def aggregate(args: argparse.Namespace, jobs: list[Job], summaries: dict[Job, dict[str, Any]]) -> dict[str, Any]:
    """results.json: per algo the per-seed outcomes and their statistics; Mann-Whitney for every pair."""
    per_algo: dict[str, Any] = {}
    for label in args.algos:
        runs = sorted((job.seed, summaries[job]) for job in jobs if job.label == label)
        for seed, s in runs:  # an env without the criterion: its runs' convergence fields are null
            if s.get("converged") is None or s.get("final_correct_rate") is None:
                raise convergence.no_criterion_error(
                    args.env, f"{label} seed {seed}'s summary has converged / final_correct_rate null", NEEDS
                )
        converged = [bool(s["converged"]) for _, s in runs]
        for_stats = [int(s["episodes_to_converge"] if s["converged"] else s["episodes_run"]) for _, s in runs]
        final = [float(s["final_correct_rate"]) for _, s in runs]
        entry: dict[str, Any] = {
            "seeds": [seed for seed, _ in runs],
            "converged": converged,
            "n_converged": sum(converged),
            "episodes_to_converge": [s["episodes_to_converge"] if s["converged"] else None for _, s in runs],
            "episodes_for_stats": for_stats,
            "final_correct_rate": final,
            "stats": {**describe(for_stats), "final_correct_rate_mean": sum(final) / len(final)},
            "aggregate": {**aggregate_estimates(for_stats), "fraction_converged": fraction_estimate(sum(converged), len(runs))},
        }
        roles = [s["roles"] for _, s in runs if "roles" in s]
        if roles:
            entry["roles"] = roles
        per_algo[label] = entry
    tests = {
        f"{a}_vs_{b}": mann_whitney(per_algo[a]["episodes_for_stats"], per_algo[b]["episodes_for_stats"])
        for a, b in itertools.combinations(args.algos, 2)
    }
    improvement = {
        f"{a}_vs_{b}": {
            **improvement_estimate(per_algo[a]["episodes_for_stats"], per_algo[b]["episodes_for_stats"], lower_is_better=True),
            "meaning": f"P({a} needs fewer episodes to converge than {b}) + P(tie) / 2, one seed of each drawn at random",
        }
        for a, b in itertools.combinations(args.algos, 2)
    }
    return {
        "env": args.env,
        "seeds": list(range(args.seed_start, args.seed_start + args.seeds)),
        "max_episodes": args.max_episodes,
        "hyperparams": list(args.hyperparams),
        "non_converged_runs": CENSORED,
        "algos": per_algo,
        "mann_whitney": tests,
        "probability_of_improvement": improvement,
        "bootstrap": bootstrap_description(),
    }


def table_markdown(results: dict[str, Any]) -> str:
    """Table II of the VCBM paper: episodes to reach 95% correct first decisions, plus the converged count."""
    n_seeds = len(results["seeds"])
    lines = [
        f"Episodes to reach 95% correct first decisions ({results['env']}, {n_seeds} seeds each).",
        "",
        "| Method | Converged | Range | Mean ± std | Median | Final % |",
        "|---|---|---|---|---|---|",
    ]
    for label, entry in results["algos"].items():
        s = entry["stats"]
        lines.append(
            f"| {label} | {entry['n_converged']}/{s['n']} | {s['min']:,.0f}–{s['max']:,.0f} | "
            f"{s['mean']:,.1f} ± {s['std']:,.1f} | {s['median']:,.1f} | {100 * s['final_correct_rate_mean']:.2f}% |"
        )
    boot = results["bootstrap"]
    lines += [
        "",
        f"Aggregate episodes to converge with {100 * boot['confidence_level']:.0f}% CIs ({boot['method']} bootstrap, "
        f"{boot['n_resamples']:,} resamples of each method's seeds); converged fraction with its exact CI.",
        "",
        "| Method | Median [95% CI] | IQM [95% CI] | Mean [95% CI] | Converged [95% CI] |",
        "|---|---|---|---|---|",
    ]
    for label, entry in results["algos"].items():
        agg = entry["aggregate"]
        fraction = agg["fraction_converged"]
        lines.append(
            f"| {label} | {_with_ci(agg['median'])} | {_with_ci(agg['iqm'])} | {_with_ci(agg['mean'])} | "
            f"{_percent(fraction['estimate'])} [{_percent(fraction['ci_low'])}, {_percent(fraction['ci_high'])}] |"
        )
    if any(entry["n_converged"] < len(entry["seeds"]) for entry in results["algos"].values()):
        lines += [
            "",
            "Runs that hit the episode cap enter every statistic here (range, mean, median, IQM, their CIs, "
            "the probability of improvement and Mann–Whitney) with the cap, a lower bound of their episodes "
            "to converge. The median and IQM do not depend on how far past the cap such runs would have gone "
            "while fewer than half (median) or a quarter (IQM) of a method's runs hit it.",
        ]
    for name, t in results["mann_whitney"].items():
        a, b = name.split("_vs_")
        poi = results["probability_of_improvement"][name]
        lines += [
            "",
            f"Mann–Whitney U ({a} vs {b}, two-sided, normal approximation, tie-corrected): "
            f"U = {t['U']:g}, z = {t['z']:.2f}, p = {'n/a (all values tie)' if t['p'] is None else format(t['p'], '.3g')}, "
            f"rank-biserial r = {t['rank_biserial_r']:.2f}; "
            f"probability of improvement P({a} < {b}) = {_with_ci(poi, '.3f')} "
            "(P(fewer episodes) + P(tie) / 2 = (1 + r) / 2).",
        ]
    return "\n".join(lines) + "\n"


def _percent(value: float) -> str:
    """A fraction as a percentage with one decimal: 199/200 reads 99.5%, never a rounded-up 100%."""
    return f"{100 * value:.1f}%"


def _with_ci(estimate: dict[str, Any], spec: str = ",.1f") -> str:
    """'1,205.0 [1,000.0, 1,260.0]'; a method with one seed has no interval."""
    if estimate["ci_low"] is None:
        return f"{estimate['estimate']:{spec}} [n/a: one seed]"
    return f"{estimate['estimate']:{spec}} [{estimate['ci_low']:{spec}}, {estimate['ci_high']:{spec}}]"


def plot_figure(results: dict[str, Any], path: Path) -> None:
    """Figure 1 of the VCBM paper: per method the min-max band, the mean +- std segment, a marker at the mean
    (log axis); the individual seeds as dots, hollow for runs that hit the cap. A mean - std below
    the smallest value is drawn from the smallest value (a log axis has no room for <= 0)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    from matplotlib.ticker import FuncFormatter

    labels = list(results["algos"])
    fig, ax = plt.subplots(figsize=(7, 1.6 + 0.8 * len(labels)))
    for row, label in enumerate(labels):
        entry = results["algos"][label]
        s = entry["stats"]
        color = f"C{row}"
        ax.barh(row, s["max"] - s["min"], left=s["min"], height=0.5, color=color, alpha=0.25, label=None)
        low = max(s["mean"] - s["std"], s["min"])
        ax.hlines(row, low, s["mean"] + s["std"], color=color, linewidth=6)
        ax.plot(s["mean"], row, marker="D", color="black", markersize=7, zorder=3)
        for value, ok in zip(entry["episodes_for_stats"], entry["converged"]):
            ax.plot(value, row + 0.3, marker="o", markersize=3, color=color, markerfacecolor=color if ok else "none")
    ax.set_xscale("log")
    values = [v for entry in results["algos"].values() for v in entry["episodes_for_stats"]]
    ax.set_xlim(min(values) / 1.25, max(values) * 1.25)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
    ax.xaxis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}" if str(round(v))[0] in "25" else ""))
    ax.set_yticks(range(len(labels)), labels)
    ax.set_ylim(len(labels) - 0.2, -0.6)  # first algo on top
    legend = [
        Patch(color="grey", alpha=0.25, label="min–max"),
        Line2D([], [], color="grey", linewidth=6, label="mean ± std"),
        Line2D([], [], color="black", marker="D", linestyle="none", label="mean"),
        Line2D([], [], color="grey", marker="o", markersize=3, linestyle="none", label="seeds (hollow: hit the cap)"),
    ]
    ax.legend(handles=legend, loc="upper center", bbox_to_anchor=(0.5, -0.35), ncol=4, fontsize=8, frameon=False)
    ax.set_xlabel("episodes to converge (log scale)")
    ax.set_title(f"{results['env']}: episodes to 95% correct first decisions, {len(results['seeds'])} seeds")
    ax.grid(axis="x", which="both", alpha=0.3)
    fig.tight_layout()
    save_figure(fig, path, dpi=150, bbox_inches="tight")
    plt.close(fig)


def build_parser() -> argparse.ArgumentParser:
    parser = cli.ArgumentParser(prog="python -m algorithms.compare", description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="WatchRepair-v0")
    parser.add_argument("--algos", nargs="+", required=True, help="algo names, or ALGO+CREDIT_RULE")
    parser.add_argument("--seeds", type=int, default=20, help="number of seeds per algo")
    parser.add_argument("--seed-start", type=int, default=0, help="first seed (seeds are consecutive)")
    parser.add_argument(
        "--workers",
        type=int,
        default=2,
        help="seeds run at once (process: parallel processes, 0 runs them in this process; "
        "ray: tasks in flight, and the CPUs of a local Ray instance)",
    )
    parser.add_argument("--backend", default="process", help=f"where the seeds run, one of: {', '.join(BACKENDS)}")
    parser.add_argument(
        "--address",
        default=None,
        help="with --backend ray: an existing Ray cluster (e.g. auto, or ray://HOST:10001); "
        "default: a local Ray instance for this compare",
    )
    parser.add_argument("--max-episodes", type=int, default=None, help="episode cap passed to every run")
    parser.add_argument("--hyperparams", nargs="*", action="extend", default=[], metavar="KEY=VALUE", help="passed to every run")
    parser.add_argument("--out", required=True, help="output dir (finished runs found there are reused)")
    parser.add_argument("--no-curves", action="store_true", help="skip the learning-curve figure (reads every run's logs)")
    parser.add_argument("--no-progress", action="store_true")
    return parser


def check_args(args: argparse.Namespace) -> None:
    cli.check_int(args.seeds, "--seeds", 1, MAX_SEEDS)
    cli.check_int(args.workers, "--workers", 0, MAX_WORKERS)
    cli.check_seed(args.seed_start, "--seed-start")
    cli.check_seed(args.seed_start + args.seeds - 1, "--seed-start + --seeds - 1 (the last seed)")
    if args.max_episodes is not None:
        cli.check_int(args.max_episodes, "--max-episodes", 1)
    if len(set(args.algos)) != len(args.algos):
        raise VcbmGymError(f"--algos {args.algos}: expected distinct algos")
    executor.check_backend(args.backend, args.address, args.workers)


def write_outputs(args: argparse.Namespace, out: Path, jobs: list[Job], results: dict[str, Any]) -> str:
    """results.json, table.md, figure.png and (unless --no-curves) the learning curves; the table."""
    table = table_markdown(results)
    write_results(out, results, table)
    plot_figure(results, out / "figure.png")
    if not args.no_curves:
        from algorithms.experiment.plot import plot_learning_curves

        groups = {label: [job.log_dir for job in jobs if job.label == label] for label in args.algos}
        plot_learning_curves(
            groups,
            "correct",
            out / "curves.png",
            title=f"{args.env}: correct first decisions (moving average), mean and 95% CI over seeds",
        )
    return table


def resolved_record(args: argparse.Namespace, jobs: list[Job]) -> dict[str, Any]:
    """run.json's resolved config of every algo, and the train command that runs its first seed (for people)."""
    return {
        label: {
            **next(job.spec for job in jobs if job.label == label).identity(),
            "seed": "per run",
            "argv_first_seed": train_command(args, label, args.seed_start),
        }
        for label in args.algos
    }


def run(argv: Sequence[str] | None = None) -> dict[str, Any]:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    check_args(args)
    started = provenance.start()
    with executor.sigterm_stops():
        jobs = make_jobs(args)  # every algo and config, then the env's criterion: before --out is written
        require_criterion(args.env, jobs)
        out = cli.output_dir(args.out, "--out")
        with locked(out):
            reused = count_finished(jobs)
            summaries = train_jobs(jobs, args.workers, progress=not args.no_progress, backend=args.backend, address=args.address)
            results = aggregate(args, jobs, summaries)
            table = write_outputs(args, out, jobs, results)
            provenance.write_run_record(
                out,
                "python -m algorithms.compare",
                argv,
                started,
                backend=args.backend,
                address=args.address,
                workers=args.workers,
                **runs_record(len(jobs), reused, summaries),
                resolved=resolved_record(args, jobs),
            )
    print(table)
    return results


def main(argv: Sequence[str] | None = None) -> int:
    return cli.main(run, argv)


if __name__ == "__main__":
    sys.exit(main())
