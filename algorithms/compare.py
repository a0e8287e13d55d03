"""`python -m algorithms.compare --env WatchRepair-v0 --algos vcbm rudder --seeds 20 --out DIR`: Table II and Figure 1.

Runs every (algo, seed) through `algorithms.train.run` in a process pool, one log dir per run
(`DIR/<algo>/seed<k>/`, where train writes summary.json, config.yml and TensorBoard events), then
writes `DIR/results.json`, `DIR/table.md` (paper 000 Table II) and `DIR/figure.png` (Figure 1), and
prints the table.

Resuming: a run whose log dir already holds a summary.json written for the same request (algo,
credit rule, env, seed, episode cap and hyperparameter overrides, read back from its config.yml)
is reused, not rerun; so a killed comparison rerun with the same arguments computes only the
missing seeds and ends with the same results.json. results.json holds no wall times for that reason.
Reuse is keyed on the command line, not on the contents of zoo_configs/: after editing a zoo
config, compare into a fresh --out.

Non-converged runs (the episode cap ended them) are counted and flagged; they enter the statistics
with their episode count at the cap, a lower bound of their true episodes-to-converge (so the
mean, median and the Mann-Whitney test are conservative in their favour), and the table says how
many there are.

An algo of the form `ALGO+RULE` (e.g. `ppo+vcbm_bookmark`) runs `--algo ALGO --credit RULE`.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import Any, Sequence

import yaml
from tqdm.auto import tqdm

from algorithms.common.errors import VcbmGymError
from algorithms.registry import ALGOS, get_algo
from algorithms.stats import describe, mann_whitney


@dataclass(frozen=True)
class Job:
    label: str  # as given on the command line, e.g. "rudder" or "ppo+vcbm_bookmark"
    seed: int
    log_dir: Path
    argv: tuple[str, ...]


def algo_argv(label: str) -> list[str]:
    """`rudder` -> [--algo rudder]; `ppo+vcbm_bookmark` -> [--algo ppo --credit vcbm_bookmark]."""
    if label in ALGOS:  # a registered name, even one with a "+" in it (vcbm+)
        return ["--algo", label]
    algo, plus, credit = label.partition("+")
    get_algo(algo)  # one clear error for an unknown algo
    if plus and (not credit or "+" in credit):
        raise VcbmGymError(f"algo spec {label!r}: expected ALGO or ALGO+CREDIT_RULE")
    return ["--algo", algo] + (["--credit", credit] if plus else [])


def make_jobs(args: argparse.Namespace) -> list[Job]:
    jobs = []
    for label, seed in itertools.product(args.algos, range(args.seed_start, args.seed_start + args.seeds)):
        log_dir = Path(args.out) / label / f"seed{seed}"
        argv = [*algo_argv(label), "--env", args.env, "--seed", str(seed), "--log-dir", str(log_dir), "--no-progress"]
        if args.max_episodes is not None:
            argv += ["--max-episodes", str(args.max_episodes)]
        if args.hyperparams:
            argv += ["--hyperparams", *args.hyperparams]
        jobs.append(Job(label, seed, log_dir, tuple(argv)))
    return jobs


def finished_summary(job: Job) -> dict[str, Any] | None:
    """The summary of a previous run of exactly this job, or None if it must (re)run."""
    summary_path, config_path = job.log_dir / "summary.json", job.log_dir / "config.yml"
    if not (summary_path.is_file() and config_path.is_file()):
        return None
    try:
        summary = json.loads(summary_path.read_text())
        command_line = (yaml.safe_load(config_path.read_text()) or {}).get("command_line", {})
    except (json.JSONDecodeError, yaml.YAMLError):
        return None  # a run killed while writing: redo it
    algo, _, credit = (job.label, "", "") if job.label in ALGOS else job.label.partition("+")
    i = job.argv.index
    wanted = {
        "algo": algo,
        "env": job.argv[i("--env") + 1],
        "seed": job.seed,
        "max_episodes": int(job.argv[i("--max-episodes") + 1]) if "--max-episodes" in job.argv else None,
        "hyperparams": list(job.argv[i("--hyperparams") + 1 :]) if "--hyperparams" in job.argv else [],
    }
    if credit:
        wanted["credit"] = credit
    if any(command_line.get(key) != value for key, value in wanted.items()):
        return None
    return summary


def _init_worker() -> None:
    """The seeds are the parallelism; BLAS/OpenMP threads would only contend. Set through the
    environment so that torch is imported only by the runs that use it."""
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(name, "1")
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(1)


def _run_job(argv: Sequence[str]) -> dict[str, Any]:
    from algorithms.train import run

    return run(list(argv))


def run_jobs(jobs: list[Job], workers: int, progress: bool = True) -> dict[Job, dict[str, Any]]:
    """Run the jobs that have no finished summary yet; return every job's summary."""
    summaries = {job: s for job in jobs if (s := finished_summary(job)) is not None}
    todo = [job for job in jobs if job not in summaries]
    if summaries:
        print(f"reusing {len(summaries)} finished run(s) from previous invocations; {len(todo)} to run", file=sys.stderr)
    bar = tqdm(total=len(todo), desc="runs", unit="run", disable=not progress)
    failures = []
    try:
        if workers == 0:  # in this process: for tests and debugging
            _init_worker()
            for job in todo:
                summaries[job] = _run_job(job.argv)
                bar.update(1)
        else:
            with ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn"), initializer=_init_worker) as pool:
                futures = {pool.submit(_run_job, job.argv): job for job in todo}
                for future in as_completed(futures):
                    job = futures[future]
                    try:
                        summaries[job] = future.result()
                    except Exception as exc:  # keep the other seeds going; report at the end
                        failures.append(f"{job.label} seed {job.seed}: {type(exc).__name__}: {exc}")
                    bar.update(1)
                    bar.set_postfix_str(f"{job.label} seed {job.seed}")
    finally:
        bar.close()
    if failures:
        raise VcbmGymError(f"{len(failures)} run(s) failed (finished ones are kept in their log dirs): " + "; ".join(failures))
    return summaries


def aggregate(args: argparse.Namespace, jobs: list[Job], summaries: dict[Job, dict[str, Any]]) -> dict[str, Any]:
    """results.json: per algo the per-seed outcomes and their statistics; Mann-Whitney for every pair."""
    per_algo: dict[str, Any] = {}
    for label in args.algos:
        runs = sorted((job.seed, summaries[job]) for job in jobs if job.label == label)
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
        }
        roles = [s["roles"] for _, s in runs if "roles" in s]
        if roles:
            entry["roles"] = roles
        per_algo[label] = entry
    tests = {
        f"{a}_vs_{b}": mann_whitney(per_algo[a]["episodes_for_stats"], per_algo[b]["episodes_for_stats"])
        for a, b in itertools.combinations(args.algos, 2)
    }
    return {
        "env": args.env,
        "seeds": list(range(args.seed_start, args.seed_start + args.seeds)),
        "max_episodes": args.max_episodes,
        "hyperparams": list(args.hyperparams),
        "non_converged_runs": "enter the statistics with their episode count at the cap (a lower bound), flagged in `converged`",
        "algos": per_algo,
        "mann_whitney": tests,
    }


def table_markdown(results: dict[str, Any]) -> str:
    """Paper 000 Table II: episodes to reach 95% correct first decisions, plus the converged count."""
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
    if any(entry["n_converged"] < len(entry["seeds"]) for entry in results["algos"].values()):
        lines += ["", "Runs that hit the episode cap enter the statistics with the cap (a lower bound)."]
    for name, t in results["mann_whitney"].items():
        a, b = name.split("_vs_")
        lines += [
            "",
            f"Mann–Whitney U ({a} vs {b}, two-sided, normal approximation, tie-corrected): "
            f"U = {t['U']:g}, z = {t['z']:.2f}, p = {'n/a (all values tie)' if t['p'] is None else format(t['p'], '.3g')}, rank-biserial r = {t['rank_biserial_r']:.2f}.",
        ]
    return "\n".join(lines) + "\n"


def plot_figure(results: dict[str, Any], path: Path) -> None:
    """Paper 000 Figure 1: per method the min-max band, the mean +- std segment, a marker at the mean
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
    fig.savefig(path, dpi=150, bbox_inches="tight")
    plt.close(fig)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # type: ignore[override]
        raise VcbmGymError(message)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m algorithms.compare", description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="WatchRepair-v0")
    parser.add_argument("--algos", nargs="+", required=True, help="algo names, or ALGO+CREDIT_RULE")
    parser.add_argument("--seeds", type=int, default=20, help="number of seeds per algo")
    parser.add_argument("--seed-start", type=int, default=0, help="first seed (seeds are consecutive)")
    parser.add_argument("--workers", type=int, default=2, help="parallel processes (0: run in this process)")
    parser.add_argument("--max-episodes", type=int, default=None, help="episode cap passed to every run")
    parser.add_argument("--hyperparams", nargs="*", default=[], metavar="KEY=VALUE", help="passed to every run")
    parser.add_argument("--out", required=True, help="output dir (finished runs found there are reused)")
    parser.add_argument("--no-progress", action="store_true")
    return parser


def run(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.seeds < 1 or args.workers < 0:
        raise VcbmGymError(f"--seeds {args.seeds} --workers {args.workers}: expected seeds >= 1 and workers >= 0")
    if len(set(args.algos)) != len(args.algos):
        raise VcbmGymError(f"--algos {args.algos}: expected distinct algos")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    jobs = make_jobs(args)
    summaries = run_jobs(jobs, args.workers, progress=not args.no_progress)
    results = aggregate(args, jobs, summaries)
    (out / "results.json").write_text(json.dumps(results, indent=2))
    table = table_markdown(results)
    (out / "table.md").write_text(table)
    plot_figure(results, out / "figure.png")
    print(table)
    return results


def main(argv: Sequence[str] | None = None) -> int:
    try:
        run(argv)
    except VcbmGymError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
