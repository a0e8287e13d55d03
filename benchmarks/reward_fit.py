"""Why a reward rule helps SAC or not on episodic-reward MuJoCo: the rule's fit to the dense reward during training.

    python benchmarks/reward_fit.py [--envs EpisodicHopper-v5] [--seeds 1] [--out runs/reward_fit]

The runs are benchmarks/episodic_mujoco.py's `sac+rrd` and `sac+ircr` (the same resolved settings, seeds from 0), with
the fit the SB3 arm records when the env reports the reward it withheld (envs/delayed_reward.py's
`info["withheld_reward"]`, algorithms/sb3/buffers.py's `reward_fit`): after every episode, Pearson's r between the
rewards the rule wrote for the last 10 episodes (before it learned from each) and their withheld dense rewards. For
RRD this is its reward model's held-out fit, per step and across episodes; IRCR's reward is its episode's normalised
return on every step, so its r measures only how well an episode's return ranks its steps' dense rewards.

What it shows beside the episodic_mujoco table: a reward rule can at best hand SAC the dense reward (r = 1), so SAC on
the dense reward (`sac-dense` there) bounds what a perfect redistribution buys at the same budget.

BUDGET: measured in benchmarks/episodic_mujoco.py's first run (two runs side by side on 2 cores, Hopper, 30,000
steps): sac+rrd 836-1,611 s, sac+ircr 478-593 s. One seed of both on 2 workers: about 25 minutes.

Outputs in --out: results.json (per env and method: the fit curve, its mean over the last 10 points, the true-return
curve), table.md, fit_<env>.png (fit and true return against env steps), run.json.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from algorithms.common import cli, provenance  # noqa: E402
from algorithms.experiment import stats  # noqa: E402
from algorithms.experiment.jobs import count_finished, train_jobs  # noqa: E402
from algorithms.experiment.results import locked, runs_record, save_figure, write_results  # noqa: E402
from benchmarks.episodic_mujoco import add_run_arguments, check_run_arguments, evaluations, method_jobs  # noqa: E402

METHODS = ("sac+rrd", "sac+ircr")
FIT_TAG = "credit/reward_fit_corr"
LAST_POINTS = 10


def fit_curve(log_dir: Path) -> tuple[np.ndarray, np.ndarray]:
    """(env steps, r) of FIT_TAG from the run's TensorBoard events."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = sorted(log_dir.glob("*/events.out.tfevents.*"))
    if not events:
        raise FileNotFoundError(f"{log_dir}: no TensorBoard events")
    accumulator = EventAccumulator(str(events[-1].parent), size_guidance={"scalars": 0})
    accumulator.Reload()
    scalars = accumulator.Scalars(FIT_TAG) if FIT_TAG in accumulator.Tags()["scalars"] else []
    return np.array([s.step for s in scalars], dtype=np.int64), np.array([s.value for s in scalars], dtype=np.float64)


def method_results(jobs: list) -> dict[str, Any]:
    runs = []
    for job in jobs:
        steps, r = fit_curve(Path(job.log_dir))
        eval_steps, returns = evaluations(Path(job.log_dir))
        runs.append(
            {
                "fit_steps": steps.tolist(),
                "fit_corr": r.tolist(),
                "fit_corr_last_mean": float(np.mean(r[-LAST_POINTS:])) if len(r) else None,
                "eval_steps": eval_steps.tolist(),
                "true_return": returns.tolist(),
            }
        )
    finals = [run["fit_corr_last_mean"] for run in runs if run["fit_corr_last_mean"] is not None]
    return {"runs": runs, "fit_corr_last_mean": stats.aggregate_estimates(finals)["mean"] if finals else None}


def plot(env: str, results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (fit_ax, return_ax) = plt.subplots(1, 2, figsize=(10, 4))
    for method, res in results.items():
        for seed, run in enumerate(res["runs"]):
            label = f"{method} seed {seed}"
            fit_ax.plot(run["fit_steps"], run["fit_corr"], label=label)
            return_ax.plot(run["eval_steps"], run["true_return"], marker="o", label=label)
    fit_ax.axhline(0.0, color="grey", linewidth=0.8)
    fit_ax.set(xlabel="env steps", ylabel="r(rule's reward, withheld dense reward), last 10 episodes", title=env)
    return_ax.set(xlabel="env steps", ylabel="true return (deterministic policy)", title=env)
    fit_ax.legend()
    return_ax.legend()
    save_figure(fig, path)
    plt.close(fig)


def table(results: dict[str, Any]) -> str:
    lines = [
        "| env | method | seed | fit r, mean of the last 10 points | final true return |",
        "|---|---|---|---|---|",
    ]
    for env, per_method in results["envs"].items():
        for method, res in per_method.items():
            for seed, run in enumerate(res["runs"]):
                fit = run["fit_corr_last_mean"]
                fit_text = "-" if fit is None else f"{fit:.3f}"
                lines.append(f"| {env} | {method} | {seed} | {fit_text} | {run['true_return'][-1]:.1f} |")
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = cli.ArgumentParser(prog="python benchmarks/reward_fit.py", description=__doc__.splitlines()[0])
    parser.add_argument("--envs", nargs="+", default=["EpisodicHopper-v5"])
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    add_run_arguments(parser, seeds=1, engine="sb3")
    parser.add_argument("--out", default="runs/reward_fit")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    check_run_arguments(parser, args)
    return args


def run(argv: list[str]) -> None:
    args = parse_args(argv)
    out = cli.check_output_dir(args.out, "--out")
    jobs_of = method_jobs(args, out)
    jobs = [job for per_env in jobs_of.values() for per_method in per_env.values() for job in per_method]
    started = provenance.start()
    out.mkdir(parents=True, exist_ok=True)
    with locked(out, "reward_fit"):
        reused = count_finished(jobs)
        summaries = train_jobs(jobs, args.workers, progress=not args.no_progress)
        results: dict[str, Any] = {"protocol": vars(args) | {"out": str(out)}, "bootstrap": stats.bootstrap_description()}
        results["envs"] = {env: {m: method_results(js) for m, js in per.items()} for env, per in jobs_of.items()}
        for env, per_method in results["envs"].items():
            plot(env, per_method, out / f"fit_{env}.png")
        write_results(out, results, table(results))
        provenance.write_run_record(
            out, "benchmarks/reward_fit.py", argv, started, workers=args.workers, **runs_record(len(jobs), reused, summaries)
        )
    print(table(results))


def main(argv: list[str] | None = None) -> int:
    return cli.main(run, argv)


if __name__ == "__main__":
    sys.exit(main())
