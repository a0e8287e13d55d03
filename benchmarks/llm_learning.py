"""Does the LLM arm learn? LOOP, VCBM-blended LOOP and TRL's GRPO on the embedded text envs, many seeds.

    python benchmarks/llm_learning.py                       # the documented default (about 50 min, 2 cores)
    python benchmarks/llm_learning.py --settings twr-low    # TextWatchRepair at noise 0.25 (about 16 min)
    python benchmarks/llm_learning.py --seeds 2 --iterations 10 --settings twr-low   # a quick look

Each (setting, method, seed) is one `python -m algorithms.train` run of the warm-started tiny
model (`--model tiny`, full fine-tuning) with the zoo entry of its env; a setting only changes the
env's reward noise (`noise_scale`: 1.0 is the paper's noise, 0 none) and the iteration budget. The
default runs TextWatchRepair without noise and at the paper's noise, and the workshop at 0.25;
`twr-low` (TextWatchRepair at 0.25) is not in the default only because it does not fit the hour. Methods:
`loop` (LOO advantage on every token), `vcbm-loop` (VCBM-blended LOOP, the zoo entry's rule) and
`trl-grpo` (TRL's GRPOTrainer objective with its sequence-level group advantage: the external
baseline). Runs go to OUT/<setting>/<method>/seed<k>/; a run whose summary exists for the same
request (the same command line and the same warm-started model, named by its cache key) is reused,
so an interrupted benchmark resumes where it stopped and never reuses a run of another model.

Outputs in OUT:
- `results.json`: per setting and method, the per-iteration mean and 95% t-interval across seeds
  of the optimal-decision rate (the envs' task goal completion: the first decision was the
  optimal one; undecided episodes count as failures), return, invalid-turn rate and the share of
  advantage mass on the deciding turns; iterations to reach 90% optimal decisions per seed (the
  first iteration at which the mean over the last `--window` iterations is >= 0.9; censored at the
  budget, flagged); a Mann-Whitney U test of vcbm-loop against loop on those iterations; the mean
  time per iteration.
- `results.md`: the table; `curves.png`: the learning curves.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from algorithms.common import cli  # noqa: E402

# name -> (env id, noise_scale, iterations). An iteration of TextWatchRepair with 3 turns takes about
# 1.1 s on 2 cores (two runs side by side), one of the 8-station workshop about 4 s; the default
# settings fit 60 minutes there.
SETTINGS = {
    "twr-noiseless": ("TextWatchRepair-v0", 0.0, 100),
    "twr-low": ("TextWatchRepair-v0", 0.25, 100),
    "twr-paper": ("TextWatchRepair-v0", 1.0, 50),
    "workshop-low": ("TextWatchWorkshop-v0", 0.25, 40),
}
DEFAULT_SETTINGS = ("twr-noiseless", "twr-paper", "workshop-low")
METHODS = ("loop", "vcbm-loop", "trl-grpo")
METRICS = {
    "task_goal_completion": "optimal-decision rate",
    "mean_return": "return",
    "invalid_turn_rate": "invalid-turn rate",
    "decision_advantage_mass": "advantage mass on deciding turns",
}
TARGET = 0.9


def _argv(setting: str, method: str, seed: int, iterations: int, log_dir: Path) -> list[str]:
    env_id, noise, _ = SETTINGS[setting]
    # TextWatchRepair with 3 turns (decide, then 2 turns of transport) halves the time per iteration
    # of its default 6 and changes nothing about the decision; the workshop keeps its 8 stations
    key = "max_turns" if env_id == "TextWatchRepair-v0" else "n_stations"
    turns = 3 if env_id == "TextWatchRepair-v0" else 8
    return [
        "--algo",
        method,
        "--env",
        env_id,
        "--seed",
        str(seed),
        "--model",
        "tiny",
        "--iterations",
        str(iterations),
        "--no-progress",
        "--log-dir",
        str(log_dir),
        "--hyperparams",
        f"env_kwargs={{{key}: {turns}, noise_scale: {noise}}}",
    ]


def _one_run(argv: list[str], log_dir: str, warm_start: str) -> dict:
    """Train one run (in a worker process) unless its summary exists for this exact request."""
    log = Path(log_dir)
    request = log / "request.json"
    record = {"argv": argv, "warm_start": warm_start}
    if (log / "summary.json").is_file() and (log / "history.json").is_file() and request.is_file():
        if json.loads(request.read_text()) == record:
            return {"history": json.loads((log / "history.json").read_text()), "reused": True}
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    import contextlib
    import io

    from algorithms.train import run

    shutil.rmtree(log, ignore_errors=True)  # never let an old result stand beside a new request
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        run(argv)
    cli.atomic_write_text(request, json.dumps(record))  # written last: a run is complete only with its request record
    return {"history": json.loads((log / "history.json").read_text()), "reused": False}


def worker_pool(workers: int) -> ProcessPoolExecutor:
    """Worker processes that are spawned, not forked.

    A child forked after this process ran a multi-threaded torch op (it trains the warm-start when
    the cache is cold) inherits a dead OpenMP thread pool and hangs in its first multi-threaded op.
    """
    return ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"))


def iterations_to_target(rates: np.ndarray, window: int, target: float = TARGET) -> tuple[int, bool]:
    """First iteration (1-based) whose trailing mean over `window` iterations is >= target; else (budget, False)."""
    for i in range(window, len(rates) + 1):
        if rates[i - window : i].mean() >= target:
            return i, True
    return len(rates), False


def mean_ci(curves: np.ndarray) -> tuple[list[float], list[float], list[float]]:
    """Per-iteration mean and 95% t-interval across seeds (rows)."""
    from scipy import stats

    mean = curves.mean(axis=0)
    if curves.shape[0] < 2:
        return mean.tolist(), mean.tolist(), mean.tolist()
    half = stats.t.ppf(0.975, curves.shape[0] - 1) * curves.std(axis=0, ddof=1) / np.sqrt(curves.shape[0])
    return mean.tolist(), (mean - half).tolist(), (mean + half).tolist()


def summarise(histories: dict, window: int) -> dict:
    from algorithms.stats import mann_whitney

    out: dict = {}
    for setting, by_method in histories.items():
        out[setting] = {"env": SETTINGS[setting][0], "noise_scale": SETTINGS[setting][1], "methods": {}}
        for method, runs in by_method.items():
            curves = {m: np.array([[h.get(m, np.nan) for h in run] for run in runs]) for m in METRICS}
            hits = [iterations_to_target(curves["task_goal_completion"][k], window) for k in range(len(runs))]
            out[setting]["methods"][method] = {
                "seeds": len(runs),
                "curves": {m: dict(zip(("mean", "low", "high"), mean_ci(c))) for m, c in curves.items()},
                "iterations_to_90": [n for n, _ in hits],
                "reached_90": [ok for _, ok in hits],
                "final_optimal_rate": [float(c[-window:].mean()) for c in curves["task_goal_completion"]],
                "seconds_per_iteration": float(np.mean([h["iteration_time_s"] for run in runs for h in run])),
            }
        methods = out[setting]["methods"]
        if "loop" in methods and "vcbm-loop" in methods:
            out[setting]["mann_whitney_vcbm_vs_loop"] = mann_whitney(
                methods["vcbm-loop"]["iterations_to_90"], methods["loop"]["iterations_to_90"]
            )
    return out


def table(results: dict, window: int, wall_s: float) -> str:
    lines = [
        "| setting | noise | method | seeds at 90% | iterations to 90% (per seed, * censored) | final optimal rate "
        f"(mean of last {window}) | s / iteration |",
        "|---|---|---|---|---|---|---|",
    ]
    for setting, r in results.items():
        for method, m in r["methods"].items():
            per_seed = ", ".join(f"{n}{'' if ok else '*'}" for n, ok in zip(m["iterations_to_90"], m["reached_90"]))
            lines.append(
                f"| {setting} | {r['noise_scale']} | {method} | {sum(m['reached_90'])}/{m['seeds']} | {per_seed} | "
                f"{np.mean(m['final_optimal_rate']):.3f} | {m['seconds_per_iteration']:.2f} |"
            )
    lines.append("")
    for setting, r in results.items():
        if "mann_whitney_vcbm_vs_loop" in r:
            mw = r["mann_whitney_vcbm_vs_loop"]
            p = "undefined (every value tied)" if mw["p"] is None else f"{mw['p']:.3g}"
            lines.append(
                f"- {setting}: Mann-Whitney U (vcbm-loop vs loop, iterations to 90%, censored at the budget) "
                f"U = {mw['U']}, p = {p}"
            )
    lines.append(f"- wall time {wall_s / 60:.1f} min")
    return "\n".join(lines) + "\n"


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    settings = list(results)
    fig, axes = plt.subplots(len(METRICS), len(settings), figsize=(4.5 * len(settings), 2.6 * len(METRICS)), squeeze=False)
    for col, setting in enumerate(settings):
        for row, (metric, label) in enumerate(METRICS.items()):
            ax = axes[row][col]
            for method, m in results[setting]["methods"].items():
                c = m["curves"][metric]
                x = np.arange(1, len(c["mean"]) + 1)
                ax.plot(x, c["mean"], label=method)
                ax.fill_between(x, c["low"], c["high"], alpha=0.2)
            if metric == "task_goal_completion":
                ax.axhline(TARGET, color="grey", lw=0.8, ls="--")
            ax.set_title(f"{setting} (noise {results[setting]['noise_scale']})" if row == 0 else "")
            ax.set_ylabel(label if col == 0 else "")
            ax.set_xlabel("iteration" if row == len(METRICS) - 1 else "")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=110)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--settings", nargs="+", default=list(DEFAULT_SETTINGS), choices=list(SETTINGS))
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--iterations", type=int, default=None, help="override every setting's budget")
    parser.add_argument("--window", type=int, default=5, help="iterations averaged for the 90%% criterion")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", default="runs/llm_learning")
    args = parser.parse_args(argv)
    if args.seeds < 1 or args.workers < 1 or args.window < 1 or (args.iterations is not None and args.iterations < args.window):
        parser.error(
            f"--seeds {args.seeds}, --workers {args.workers}, --window {args.window}, --iterations "
            f"{args.iterations}: expected positive numbers and iterations >= window"
        )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()

    from algorithms.llm.warm_start import cached_warm_start

    warm_start = cached_warm_start().name  # built once, before the workers need it; its name is its key

    jobs = {}
    for setting in args.settings:
        budget = args.iterations or SETTINGS[setting][2]
        for method in args.methods:
            for seed in range(args.seeds):
                log = out / setting / method / f"seed{seed}"
                jobs[(setting, method, seed)] = (_argv(setting, method, seed, budget, log), str(log), warm_start)
    histories: dict = {s: {m: [None] * args.seeds for m in args.methods} for s in args.settings}
    runs_reused = 0
    with worker_pool(args.workers) as pool:
        futures = {pool.submit(_one_run, *job): key for key, job in jobs.items()}
        for done, future in enumerate(as_completed(futures), 1):
            setting, method, seed = futures[future]
            result = future.result()
            histories[setting][method][seed] = result["history"]
            runs_reused += result["reused"]
            final = result["history"][-1].get("task_goal_completion", float("nan"))
            print(
                f"[{done}/{len(jobs)}] {setting} {method} seed {seed}: final optimal rate {final:.2f}"
                f"{' (reused)' if result['reused'] else ''}",
                flush=True,
            )
    wall = time.perf_counter() - start
    results = summarise(histories, args.window)
    payload = {
        "warm_start": warm_start,
        "settings": results,
        "seeds": args.seeds,
        "window": args.window,
        "target": TARGET,
        "wall_time_s": wall,
    }
    cli.atomic_write_json(out / "results.json", payload)
    from algorithms.common.provenance import environment_record

    command = " ".join(["python", "benchmarks/llm_learning.py", *(sys.argv[1:] if argv is None else argv)])
    cli.atomic_write_json(
        out / "run.json",
        {
            "command": command,
            "wall_time_s": wall,
            "warm_start": warm_start,
            "runs": len(jobs),
            "runs_reused": runs_reused,
            **environment_record(),
        },
    )
    (out / "results.md").write_text(table(results, args.window, wall))
    plot(results, out / "curves.png")
    print((out / "results.md").read_text())
    print(f"wrote {out / 'results.json'}, {out / 'results.md'}, {out / 'curves.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
