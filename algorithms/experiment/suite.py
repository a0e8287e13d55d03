"""`python -m algorithms.suite --experiment umbrella_length --algos vcbm ppo+rudder --seeds 3 --out DIR`: bsuite sweeps.

Resolves every (algo, bsuite_id) once in memory (`algorithms.train.resolve_spec`) and trains every seed with
`algorithms.train.execute` on the executor (compare's jobs, reuse and stopping: algorithms.experiment.jobs),
one log dir per run (`DIR/runs/<algo>/<experiment>-<setting>/seed<k>/`, where the run's env writes bsuite's
own CSV log into `env_log/`), then scores them with bsuite's own analysis code (algorithms.bsuite_score:
`bsuite.logging.csv_load` and each experiment's `analysis.score`; nothing is re-computed here) and writes
`DIR/results.json`, `DIR/table.md`, bsuite's own scaling plot per experiment and algo
(`DIR/<experiment>_<algo>.png`, the experiment's `analysis.plot_scale`) and `DIR/run.json` (command, commit,
versions, wall time, protocol).

Protocols (`--protocol`):
- `bsuite` (the default): every setting of the experiment's sweep, each for bsuite's own number of episodes
  (`bsuite_num_episodes`: 10,000 for the umbrella experiments, 1,000 for discounting_chain), as bsuite's
  paper scores an agent (Osband et al. 2020, "Behaviour Suite for Reinforcement Learning", Sec. 2).
- `short`: the settings and episode budget of SHORT_PROTOCOL, sized so that PPO and its credit rules on two
  experiments fit a CI-sized budget. bsuite scores a partial run at its last logged episode; a short score is
  not bsuite's score of the full sweep, and every output says which protocol made it.

Per experiment and algo: bsuite's score of the seeds pooled (bsuite averages the runs' regret at each
episode), each seed's own score, their mean with a percentile-bootstrap 95% CI over seeds
(algorithms.experiment.stats, fixed bootstrap seed), and per setting the regret per episode (or, where bsuite
logs no regret, the return per episode) at the last logged episode, mean over seeds. Every run is trained for its whole budget
(`stop_at_convergence: false`): bsuite's regret counts every episode.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import logging
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from algorithms import bsuite_score
from algorithms.common import cli, config, provenance
from algorithms.common.errors import VcbmGymError
from algorithms.common.extras import require_extra
from algorithms.experiment import executor, stats
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
from algorithms.experiment.results import atomic_file, locked, runs_record, write_results
from algorithms.registry import get_arm

EXPERIMENTS = ("umbrella_length", "umbrella_distract", "discounting_chain", "memory_len", "memory_size")
PROTOCOLS = ("bsuite", "short")
# experiment -> (setting indices, episodes per setting): short chains and budgets that fit CI-sized runs
SHORT_PROTOCOL: dict[str, tuple[tuple[int, ...], int]] = {
    "umbrella_length": ((0, 2, 5, 9), 1_000),  # chain lengths 1, 3, 6, 10
    "umbrella_distract": ((0, 4, 8, 12), 1_000),  # 1 to 17 distractor bits at chain length 20
    "discounting_chain": ((0, 1), 200),
    "memory_len": ((0, 2, 5, 9), 1_000),
    "memory_size": ((0, 2, 4, 6), 1_000),
}
SETTING_VARS = ("chain_length", "n_distractor", "mapping_seed", "memory_length", "num_bits")
SUITE_ENV_KWARGS = {  # env_kwargs the suite sets for every run -> why the user may not
    "bsuite_id": "the suite sets each run's setting from --experiment and --settings",
    "log_dir": "the suite writes each run's bsuite log into that run's own dir under --out, where it is scored",
}


@dataclasses.dataclass(frozen=True)
class Setting:
    """One bsuite_id and the episodes a run of it plays."""

    bsuite_id: str
    episodes: int

    @property
    def experiment(self) -> str:
        return self.bsuite_id.partition("/")[0]

    @property
    def env_id(self) -> str:
        return f"bsuite:{self.bsuite_id}"

    @property
    def dir_name(self) -> str:
        return self.bsuite_id.replace("/", "-")


def protocol_settings(
    experiment: str, protocol: str, episodes: int | None = None, indices: Sequence[int] | None = None
) -> list[Setting]:
    """The settings a protocol plays of one experiment; `episodes` and `indices` (settings of bsuite's sweep)
    replace the protocol's budget and settings."""
    from bsuite import sweep

    available = sorted(int(key.partition("/")[2]) for key in sweep.SETTINGS if key.partition("/")[0] == experiment)
    if protocol == "short":
        chosen, budget = SHORT_PROTOCOL[experiment]
    else:
        chosen, budget = available, int(importlib.import_module(f"bsuite.experiments.{experiment}.sweep").NUM_EPISODES)
    if indices is not None:
        unknown = sorted(set(indices) - set(available))
        if unknown:
            raise VcbmGymError(f"--settings {unknown}: {experiment} has settings 0 to {available[-1]}")
        chosen = sorted(set(indices))
    return [Setting(f"{experiment}/{index}", episodes or budget) for index in chosen]


def check_algos(labels: Sequence[str]) -> None:
    """Only arms that train on a Gymnasium env by episodes (tabular, SB3) take the suite's settings."""
    for label in labels:
        arm = get_arm(parse_label(label)[0])
        if not arm.reports_convergence:
            raise VcbmGymError(
                f"--algos {label}: the suite takes tabular or SB3 algos, not {arm.name} ones (bsuite's envs are not text envs)"
            )


def check_env_kwargs(env_kwargs: Any, source: str) -> None:
    """The suite owns two env_kwargs: each run's setting and where its bsuite log goes (its own run dir, where
    scoring reads it; a shared log_dir makes every seed after the first fail on the file the first one holds)."""
    if not isinstance(env_kwargs, Mapping):
        return  # the arm refuses a non-mapping in its own words
    for key, owner in SUITE_ENV_KWARGS.items():
        if key in env_kwargs:
            raise VcbmGymError(f"{source} env_kwargs {key}={env_kwargs[key]!r}: {owner}; expected env_kwargs without {key}")


def make_jobs(args: argparse.Namespace, settings: list[Setting], runs_dir: Path) -> list[Job]:
    """One job per (algo, setting, seed), each carrying its RunSpec, resolved once per (algo, setting) in memory
    (bad settings fail here, before any run). --hyperparams are parsed here, once."""
    overrides = config.parse_overrides(args.hyperparams)
    check_env_kwargs(overrides.get("env_kwargs"), "--hyperparams")
    seeds = range(args.seed_start, args.seed_start + args.seeds)
    jobs = []
    for label in args.algos:
        for setting in settings:
            # every episode counts in bsuite's regret: no stop at convergence; --hyperparams may still say otherwise
            mapping = {"stop_at_convergence": False, "max_episodes": setting.episodes, **overrides}
            try:
                spec = resolve_label(label, setting.env_id, args.seed_start, mapping)
                check_env_kwargs(spec.hyperparams.get("env_kwargs"), f"the zoo config of {spec.algo}:")
            except VcbmGymError as exc:
                raise VcbmGymError(f"{label} on {setting.bsuite_id}: {exc}") from None
            where = runs_dir / label / setting.dir_name
            jobs += seed_jobs(f"{label} on {setting.bsuite_id}", spec, seeds, lambda seed, where=where: where / f"seed{seed}")
    return jobs


def setting_table(log_dirs: list[Path]) -> list[dict[str, Any]]:
    """Per bsuite_id: the last logged episode and the regret (else return) per episode there, mean over runs."""
    frame, _ = bsuite_score.load_results(log_dirs)
    rows = []
    for bsuite_id, runs in frame.groupby("bsuite_id"):
        last = runs.sort_values("episode").groupby("agent_name").tail(1)  # each run's last logged episode
        column = "total_regret" if "total_regret" in last and last.total_regret.notna().all() else "total_return"
        per_episode = (last[column] / last.episode).to_numpy(dtype=float)
        setting = {var: last[var].iloc[0].item() for var in SETTING_VARS if var in last and last[var].notna().all()}
        rows.append(
            {
                "bsuite_id": str(bsuite_id),
                **setting,
                "episodes": int(last.episode.min()),
                "measure": "regret_per_episode" if column == "total_regret" else "return_per_episode",
                "mean": float(per_episode.mean()),
                "per_run": per_episode.tolist(),
            }
        )
    rows.sort(key=lambda row: int(row["bsuite_id"].partition("/")[2]))
    return rows


def env_logs(jobs: list[Job]) -> list[Path]:
    return [job.log_dir / "env_log" for job in jobs]


def aggregate(args: argparse.Namespace, experiments: dict[str, list[Setting]], jobs: list[Job]) -> dict[str, Any]:
    changed = [option for option, value in (("--settings", args.settings), ("--episodes", args.episodes)) if value is not None]
    protocol = args.protocol + (f" with {' and '.join(changed)} (not the protocol's settings)" if changed else "")
    results: dict[str, Any] = {"protocol": protocol, "seeds": list(range(args.seed_start, args.seed_start + args.seeds))}
    results["experiments"] = {}
    for experiment, settings in experiments.items():
        ids = {setting.bsuite_id for setting in settings}
        per_algo = {}
        for label in args.algos:
            mine = [job for job in jobs if job.label.partition(" on ")[0] == label and job.label.partition(" on ")[2] in ids]
            by_seed = {seed: [job for job in mine if job.seed == seed] for seed in results["seeds"]}
            seed_scores = [bsuite_score.experiment_score(env_logs(seed_jobs), experiment) for seed_jobs in by_seed.values()]
            per_algo[label] = {
                "score": bsuite_score.experiment_score(env_logs(mine), experiment),
                "seed_scores": seed_scores,
                "seed_mean": stats.aggregate_estimates(seed_scores)["mean"],
                "settings": setting_table(env_logs(mine)),
            }
        results["experiments"][experiment] = {
            "settings": [dataclasses.asdict(setting) for setting in settings],
            "algos": per_algo,
        }
    results["bootstrap"] = stats.bootstrap_description()
    return results


def _ci(estimate: dict[str, Any]) -> str:
    low, high = estimate.get("ci_low"), estimate.get("ci_high")
    return f"{estimate['estimate']:.3f}" + (f" [{low:.3f}, {high:.3f}]" if low is not None and high is not None else "")


def table_markdown(results: dict[str, Any]) -> str:
    lines = [f"bsuite sweep, protocol `{results['protocol']}`, seeds {results['seeds']}", ""]
    for experiment, block in results["experiments"].items():
        episodes = sorted({setting["episodes"] for setting in block["settings"]})
        lines += [f"### {experiment} ({len(block['settings'])} settings, {'/'.join(map(str, episodes))} episodes each)", ""]
        lines += ["| algo | bsuite score (seeds pooled) | mean of seed scores [95% CI] | seed scores |", "|---|---|---|---|"]
        for label, algo in block["algos"].items():
            seeds = ", ".join(f"{score:.2f}" for score in algo["seed_scores"])
            lines.append(f"| {label} | {algo['score']:.3f} | {_ci(algo['seed_mean'])} | {seeds} |")
        first = next(iter(block["algos"].values()))["settings"]
        measure = first[0]["measure"].replace("_", " ") if first else "regret per episode"
        keys = [var for var in SETTING_VARS if first and var in first[0]]
        lines += ["", f"{measure} at the last episode, mean over seeds:", ""]
        lines += [
            "| bsuite_id | " + " | ".join(keys + list(block["algos"])) + " |",
            "|---" * (1 + len(keys) + len(block["algos"])) + "|",
        ]
        for index, row in enumerate(first):
            cells = [str(row[var]) for var in keys]
            cells += [f"{algo['settings'][index]['mean']:.3f}" for algo in block["algos"].values()]
            lines.append(f"| {row['bsuite_id']} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def plot_experiments(results: dict[str, Any], jobs: list[Job], out: Path) -> list[str]:
    """bsuite's own plots per experiment and algo: `analysis.plot_scale` (regret at bsuite's last episode
    against the setting) where every run played bsuite's episodes, else, or where bsuite's plot_scale fails on
    this pandas / plotnine, `analysis.plot_learning` (regret through time). A plot bsuite cannot draw is one
    warning line: the scores stand without it."""
    logging.getLogger("matplotlib.font_manager").setLevel(logging.ERROR)  # plotnine's serif font, absent here
    written = []
    for experiment, block in results["experiments"].items():
        analysis = importlib.import_module(f"bsuite.experiments.{experiment}.analysis")
        ids = {setting["bsuite_id"] for setting in block["settings"]}
        full = all(setting["episodes"] >= analysis.NUM_EPISODES for setting in block["settings"])
        plots = [
            getattr(analysis, name) for name in ("plot_scale", "plot_learning")[0 if full else 1 :] if hasattr(analysis, name)
        ]
        for label in block["algos"]:
            mine = [job for job in jobs if job.label.partition(" on ")[0] == label and job.label.partition(" on ")[2] in ids]
            frame, _ = bsuite_score.load_results(env_logs(mine))
            name = f"{experiment}_{label}.png".replace("+", "_plus_")
            failures = []
            for plot in plots:
                try:
                    with atomic_file(out / name) as tmp:
                        plot(frame).save(tmp, width=6, height=4, dpi=100, verbose=False)
                except Exception as exc:  # bsuite's plotting code against this plotnine / pandas
                    failures.append(f"{plot.__name__}: {executor.failure_line(exc)}")
                    continue
                written.append(name)
                break
            else:
                print(f"warning: bsuite cannot plot {experiment} / {label} here ({'; '.join(failures)})", file=sys.stderr)
    return written


def build_parser() -> argparse.ArgumentParser:
    parser = cli.ArgumentParser(prog="python -m algorithms.suite", description=__doc__.splitlines()[0])
    parser.add_argument("--experiment", nargs="+", required=True, help=f"bsuite experiments: {', '.join(EXPERIMENTS)}")
    parser.add_argument("--algos", nargs="+", required=True, help="tabular or SB3 algos, ALGO+RULE for a credit rule")
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--seed-start", type=int, default=0)
    parser.add_argument("--protocol", default=None, help=f"one of {', '.join(PROTOCOLS)} (default: bsuite's own)")
    parser.add_argument("--short", action="store_true", help="the same as --protocol short")
    parser.add_argument("--episodes", type=int, default=None, help="episodes per setting (default: the protocol's)")
    parser.add_argument("--settings", type=int, nargs="+", default=None, help="setting indices (default: the protocol's)")
    parser.add_argument("--hyperparams", nargs="*", action="extend", default=[], metavar="KEY=VALUE")
    parser.add_argument("--out", required=True, help="results directory (runs go to OUT/runs)")
    parser.add_argument("--workers", type=int, default=1, help="runs at once (0: in this process)")
    parser.add_argument("--backend", default="process", help=f"one of {', '.join(executor.BACKENDS)}")
    parser.add_argument("--address", default=None, help="with --backend ray: an existing cluster")
    parser.add_argument("--no-progress", action="store_true")
    return parser


def check_args(args: argparse.Namespace) -> None:
    if args.short:
        if args.protocol not in (None, "short"):
            raise VcbmGymError(f"--short with --protocol {args.protocol!r}: expected one of them (--short is --protocol short)")
        args.protocol = "short"
    args.protocol = args.protocol or "bsuite"
    cli.check_int(args.seeds, "--seeds", 1, MAX_SEEDS)
    cli.check_int(args.workers, "--workers", 0, MAX_WORKERS)
    cli.check_seed(args.seed_start, "--seed-start")
    cli.check_seed(args.seed_start + args.seeds - 1, "--seed-start + --seeds - 1 (the last seed)")
    if args.episodes is not None:
        cli.check_int(args.episodes, "--episodes", 1)
    if args.protocol not in PROTOCOLS:
        raise VcbmGymError(f"--protocol {args.protocol!r}: expected one of {', '.join(PROTOCOLS)}")
    for experiment in args.experiment:
        if experiment not in EXPERIMENTS:
            raise VcbmGymError(f"--experiment {experiment!r}: expected one of {', '.join(EXPERIMENTS)}")
    for option, values in (("--experiment", args.experiment), ("--algos", args.algos)):
        if len(set(values)) != len(values):
            raise VcbmGymError(f"{option} {values}: expected distinct values")
    executor.check_backend(args.backend, args.address, args.workers)
    check_algos(args.algos)
    require_extra("the suite", "bsuite")


def run(argv: Sequence[str] | None = None) -> dict[str, Any]:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    check_args(args)
    started = provenance.start()
    out = Path(args.out).resolve()
    experiments = {
        experiment: protocol_settings(experiment, args.protocol, args.episodes, args.settings) for experiment in args.experiment
    }
    settings = [setting for block in experiments.values() for setting in block]
    with executor.sigterm_stops():
        jobs = make_jobs(args, settings, out / "runs")  # every algo and setting resolved before --out is written
        out = cli.output_dir(out, "--out")
        with locked(out, "suite"):
            reused = count_finished(jobs)
            summaries = train_jobs(jobs, args.workers, progress=not args.no_progress, backend=args.backend, address=args.address)
            results = aggregate(args, experiments, jobs)
            table = table_markdown(results)
            write_results(out, results, table)
            plots = plot_experiments(results, jobs, out)
            provenance.write_run_record(
                out, "python -m algorithms.suite", argv, started, protocol=args.protocol, plots=plots,
                workers=args.workers, backend=args.backend, **runs_record(len(jobs), reused, summaries),
            )  # fmt: skip
    print(table)
    return results


def main(argv: Sequence[str] | None = None) -> int:
    return cli.main(run, argv)


if __name__ == "__main__":
    sys.exit(main())
