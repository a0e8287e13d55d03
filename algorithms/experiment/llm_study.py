"""An LLM-arm learning study as data: settings and methods from an experiment spec (kind `llm`), seeds from its seeds.

Each (setting, method, seed) is one `python -m algorithms.train` run of the warm-started tiny model (`--model tiny`,
full fine-tuning) with the zoo entry of its env and algo, plus the setting's hyperparameters (the same for every
method of a setting, so that only the method's own arguments differ) and the method's (`algo`, `credit`,
`hyperparams`: e.g. `objective=gspo` or `ratio_sharing=effect`). A spec's `run`:

    settings: {NAME: {env, iterations, turns, rollouts, group, epochs, learning_rate, noise_scale | env_kwargs}}
    methods: {LABEL: {algo: loop, credit: grpo, hyperparams: ["ratio_sharing=effect"]}}
    window: 5          # iterations averaged for the target criterion
    target: 0.9        # the rate whose first crossing times a run (default 0.9)
    seconds_per_iteration: 0.53   # measured, for `plan`

A watch env's setting (TextWatchRepair-v0, TextWatchWorkshop-v0) names its noise scale, and `turns` is its max_turns or
its number of stations; any other env's setting names its `env_kwargs` whole (they replace the zoo entry's), and
`turns` is the trainer's max_turns.

Per seed the study records iterations until the trailing mean of the task's success rate (`task_goal_completion`:
the optimal decision on the watch envs) over `window` iterations first reaches the target (censored at the budget: a
lower bound, in the run's favour) and the final rate (the mean of the last `window` iterations). A run is reused when
its log dir holds a finished run of the same resolved config and warm-start model; the others train on the executor's
worker processes. The helpers the LLM benchmarks share (jobs, reuse, the target criterion, t-intervals,
results.json / run.json / results.md) live here; those of their command line in algorithms.experiment.llm_options.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import yaml

from algorithms.common import cli
from algorithms.common.errors import VcbmGymError
from algorithms.experiment import executor

TARGET = 0.9
START_S = 12.0  # CPU seconds of a run's process start, imports, model load and log writing (measured: 11)
SETTING_KEYS = ("env", "iterations", "turns", "rollouts", "group", "epochs", "learning_rate")
# The watch envs' env kwarg that `turns` sets; their settings name a noise scale, every other env's its env_kwargs
WATCH_TURN_KEYS = {"TextWatchRepair-v0": "max_turns", "TextWatchWorkshop-v0": "n_stations"}
METHOD_KEYS = {"algo", "credit", "hyperparams"}
OUTPUT_FILE = "output.txt"  # in a run's log dir: what the run printed, its warnings included


@dataclass(frozen=True)
class Setting:
    env_id: str
    noise_scale: float | None  # the watch envs' only
    iterations: int
    turns: int  # the trainer's max_turns (on the watch envs also TextWatchRepair's max_turns or the workshop's n_stations)
    rollouts: int  # generation_batch_size: rollouts per iteration
    group: int  # num_generations: K rollouts per task (the LOO group)
    epochs: int  # num_iterations: optimizer steps over each batch
    learning_rate: float
    env_kwargs: tuple[tuple[str, Any], ...] = ()  # any other env's constructor arguments, whole

    def hyperparams(self) -> list[str]:
        return setting_hyperparams(self)


def setting_hyperparams(setting: Any) -> list[str]:
    """The train overrides of a setting (a `Setting` here or benchmarks/llm_learning.py's, with the same fields)."""
    if setting.env_id in WATCH_TURN_KEYS:
        env_kwargs = f"{{{WATCH_TURN_KEYS[setting.env_id]}: {setting.turns}, noise_scale: {setting.noise_scale}}}"
    else:
        env_kwargs = yaml.safe_dump(dict(setting.env_kwargs), default_flow_style=True, width=10_000).strip()
    return [
        f"env_kwargs={env_kwargs}",
        f"max_turns={setting.turns}",
        f"generation_batch_size={setting.rollouts}",
        f"num_generations={setting.group}",
        f"num_iterations={setting.epochs}",
        f"learning_rate={setting.learning_rate}",
    ]


@dataclass(frozen=True)
class Method:
    algo: str
    credit: str | None = None
    hyperparams: tuple[str, ...] = ()

    def argv(self) -> list[str]:
        return ["--algo", self.algo, *(["--credit", self.credit] if self.credit else [])]


@dataclass(frozen=True)
class Job:
    setting: str
    method: str
    seed: int
    argv: tuple[str, ...]
    log_dir: str
    warm_start: str
    cost_s: float


def settings_of(run: dict[str, Any]) -> dict[str, Setting]:
    settings = run.get("settings")
    if not isinstance(settings, dict) or not settings:
        raise VcbmGymError(f"run.settings={settings!r}: expected {{NAME: {{{', '.join(SETTING_KEYS)}, ...}}}}")
    out = {}
    for name, s in settings.items():
        env_id = s.get("env") if isinstance(s, dict) else None
        own = ("noise_scale",) if env_id in WATCH_TURN_KEYS else ("env_kwargs",)
        if not isinstance(s, dict) or set(s) != {*SETTING_KEYS, *own}:
            raise VcbmGymError(f"run.settings.{name}={s!r}: expected exactly the keys {', '.join((*SETTING_KEYS, *own))}")
        if "env_kwargs" in s and not isinstance(s["env_kwargs"], dict):
            raise VcbmGymError(f"run.settings.{name}.env_kwargs={s['env_kwargs']!r}: expected a mapping of the env's arguments")
        out[name] = Setting(
            s["env"], float(s["noise_scale"]) if "noise_scale" in s else None, int(s["iterations"]), int(s["turns"]),
            int(s["rollouts"]), int(s["group"]), int(s["epochs"]), float(s["learning_rate"]),
            tuple(sorted((s.get("env_kwargs") or {}).items())),
        )  # fmt: skip
    return out


def target_of(run: dict[str, Any]) -> float:
    """The spec's target rate (`run.target`, default 0.9), a number in (0, 1]."""
    target = run.get("target", TARGET)
    if isinstance(target, bool) or not isinstance(target, (int, float)) or not 0 < target <= 1:
        raise VcbmGymError(f"run.target={target!r}: expected a rate in (0, 1]")
    return float(target)


def target_keys(target: float = TARGET) -> tuple[str, str]:
    """The results' keys of a target: iterations to it per seed, and whether each seed reached it (e.g. iterations_to_90)."""
    percent = f"{100 * target:g}".replace(".", "_")
    return f"iterations_to_{percent}", f"reached_{percent}"


def methods_of(run: dict[str, Any]) -> dict[str, Method]:
    methods = run.get("methods")
    if not isinstance(methods, dict) or not methods:
        raise VcbmGymError(f"run.methods={methods!r}: expected {{LABEL: {{algo[, credit, hyperparams]}}}}")
    out = {}
    for label, m in methods.items():
        if not isinstance(m, dict) or "algo" not in m or not set(m) <= METHOD_KEYS:
            raise VcbmGymError(f"run.methods.{label}={m!r}: expected {{algo[, credit, hyperparams]}}")
        out[label] = Method(m["algo"], m.get("credit"), tuple(map(str, m.get("hyperparams") or ())))
    return out


def train_argv(
    algo: Sequence[str], env_id: str, seed: int, iterations: int, log_dir: Path, hyperparams: Sequence[str]
) -> list[str]:
    """The `algorithms.train` command line of one run of the warm-started tiny model: `algo` (--algo and what goes
    with it), then the env, seed, budget, log dir and train overrides."""
    return [
        *algo, "--env", env_id, "--seed", str(seed), "--model", "tiny", "--iterations", str(iterations),
        "--no-progress", "--log-dir", str(log_dir), "--hyperparams", *hyperparams,
    ]  # fmt: skip


def run_argv(setting: Setting, method: Method, seed: int, iterations: int, log_dir: Path) -> list[str]:
    """The `algorithms.train` command line of one run."""
    return train_argv(method.argv(), setting.env_id, seed, iterations, log_dir, [*setting.hyperparams(), *method.hyperparams])


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


def finished_history(job: Job) -> tuple[list[dict] | None, str]:
    """(history, "") when job.log_dir holds a finished run of exactly this config and warm-start, else (None, why not)."""
    from algorithms.common.log_dir import finished_summary
    from algorithms.train import resolve_argv

    log = Path(job.log_dir)
    summary, why = finished_summary(log, resolve_argv(list(job.argv)))
    if summary is None:
        return None, why
    try:
        request = json.loads((log / "request.json").read_text())
        history = json.loads((log / "history.json").read_text())
    except (OSError, ValueError):
        return None, "no request.json or history.json"
    if request.get("warm_start") != job.warm_start:
        return None, f"made with warm-start {request.get('warm_start')!r}"
    return history, ""


def train_one(job: Job) -> None:
    """One job of the executor (a spawned process): train the run into its log dir, replacing what is there, and keep
    what the run prints there (OUTPUT_FILE)."""
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from algorithms.train import run

    log = Path(job.log_dir)
    shutil.rmtree(log, ignore_errors=True)  # never let an old result stand beside a new request
    printed = io.StringIO()  # not the study's output: one progress line per run
    try:
        with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
            run(list(job.argv))
    finally:
        if log.is_dir():
            cli.atomic_write_text(log / OUTPUT_FILE, printed.getvalue())
    cli.atomic_write_json(log / "request.json", {"argv": list(job.argv), "warm_start": job.warm_start})


def final_rate(history: list[dict]) -> str:
    """A run's progress line: its last iteration's success rate (one iteration's episodes; the measure's final rate
    is the mean over the study's window)."""
    return f"last iteration's success rate {history[-1].get('task_goal_completion', float('nan')):.2f}"


def run_reusing(jobs: list[Job], workers: int, start: float, describe: Callable[[list[dict]], str]) -> tuple[dict, int]:
    """Every job's history: a finished run of the same config is reused, the others train on `workers` processes (a
    stop keeps the finished ones; a failed run is one line after the others end). (histories, how many were reused);
    `describe(history)` words a run's progress line."""
    histories: dict[Job, list] = {}
    stale = []
    for job in jobs:
        history, why = finished_history(job)
        if history is not None:
            histories[job] = history
        elif why != "new":
            stale.append(f"{job.setting} {job.method} seed {job.seed}: {why}")
    reused = len(histories)
    todo = [job for job in jobs if job not in histories]
    print(f"reusing {reused} finished run(s) of the same config; {len(todo)} to run", flush=True)
    if stale:
        print(f"rerunning {len(stale)} run(s): " + "; ".join(stale[:3]) + (" ..." if len(stale) > 3 else ""), flush=True)
    failures: list[str] = []

    def finished(job: Job, result: Any, error: str | None) -> None:
        history, why = finished_history(job) if error is None else (None, error)
        if history is None:
            failures.append(f"{job.setting} {job.method} seed {job.seed}: {why}")
            return
        histories[job] = history
        print(
            f"[{len(histories) - reused}/{len(todo)}] {job.setting} {job.method} seed {job.seed}: {describe(history)} "
            f"({time.perf_counter() - start:.0f} s since the study began)",
            flush=True,
        )

    with executor.sigterm_stops():
        try:
            executor.run_jobs(train_one, todo, workers=workers, finished=finished)
        except executor.STOPS as exc:
            raise executor.stopped(exc, f"{len(histories)} of {len(jobs)} run(s) kept") from None
    if failures:
        raise VcbmGymError(f"{len(failures)} run(s) failed (finished ones are kept): " + "; ".join(failures))
    return histories, reused


@dataclass
class Trained:
    """What `train_reusing` ran: the jobs, their histories, how many were reused, the wall time and the provenance."""

    jobs: list[Job]
    histories: dict[Job, list]
    reused: int
    wall_s: float
    warm_start: str
    record: dict[str, Any]


def train_reusing(
    jobs_of: Callable[[str], list[Job]],
    workers: int,
    describe: Callable[[list[dict]], str],
    model_folder: Callable[[], Path] | None = None,
) -> Trained:
    """A benchmark's runs: `jobs_of(warm_start key)` gives the jobs; finished ones are reused (`run_reusing`).
    `model_folder`: the cache folder of the runs' warm-started model (default: the single-role one's)."""
    start = time.perf_counter()
    from algorithms.common.provenance import environment_record
    from algorithms.llm.model.warm_start import cached_warm_start

    record = environment_record()  # the commit the runs ran on, read before they start
    warm_start = (model_folder or cached_warm_start)().name  # built once, before the workers need it; its name is its key
    jobs = jobs_of(warm_start)
    histories, reused = run_reusing(jobs, workers, start, describe)
    return Trained(jobs, histories, reused, time.perf_counter() - start, warm_start, record)


def grouped(trained: Trained, settings: Sequence[str], methods: Sequence[str]) -> dict[str, dict[str, list]]:
    """{setting: {method: [history per seed]}}, settings and methods in the given order, seeds ascending."""
    out: dict[str, dict[str, list]] = {}
    order = list(settings)
    for job in sorted(trained.jobs, key=lambda j: (order.index(j.setting), methods.index(j.method), j.seed)):
        out.setdefault(job.setting, {}).setdefault(job.method, []).append(trained.histories[job])
    return out


def write_outputs(
    out: Path, command: str, trained: Trained, payload: dict, markdown: str, plot: Callable[[Path], None], **run: Any
) -> None:
    """A benchmark's results.json, run.json (command, wall time, warm start, runs, runs reused, `run`, provenance),
    results.md and curves.png, each written atomically; then the tables on stdout."""
    cli.atomic_write_json(out / "results.json", payload)
    cli.atomic_write_json(
        out / "run.json",
        {"command": command, "wall_time_s": trained.wall_s, "warm_start": trained.warm_start, "runs": len(trained.jobs),
         "runs_reused": trained.reused, **run, **trained.record},
    )  # fmt: skip
    cli.atomic_write_text(out / "results.md", markdown)
    plot(out / "curves.png")
    print(markdown)


def summarise_method(runs: list[list[dict]], window: int, target: float = TARGET) -> dict[str, Any]:
    """One method's seeds in one setting: the success-rate curve with its t-interval, iterations to the target
    (censored at the budget) and the final rate, per seed."""
    rates = np.array([[h.get("task_goal_completion", np.nan) for h in run] for run in runs], dtype=float)
    hits = [iterations_to_target(rates[k], window, target) for k in range(len(runs))]
    to_target, reached = target_keys(target)
    summary = {
        "seeds": len(runs),
        "curves": {"task_goal_completion": dict(zip(("mean", "low", "high"), mean_ci(rates)))},
        to_target: [n for n, _ in hits],
        reached: [ok for _, ok in hits],
        "final_optimal_rate": [float(r[-window:].mean()) for r in rates],
        "seconds_per_iteration": float(np.mean([h["iteration_time_s"] for run in runs for h in run])),
    }
    coverage = [[h["empo_cell_coverage"] for h in run if "empo_cell_coverage" in h] for run in runs]
    if all(coverage):
        summary["empo_cell_coverage"] = [float(np.mean(c)) for c in coverage]
    return summary


def cell_coverage_cell(method: dict[str, Any]) -> str:
    """EMPO's cell coverage (the share of responses in an effect cell of two or more, its paper's statistic), mean over
    iterations and seeds, with the per-seed range; "-" for a method without ratio sharing."""
    per_seed = method.get("empo_cell_coverage")
    return f"{np.mean(per_seed):.3f} ({min(per_seed):.3f}-{max(per_seed):.3f})" if per_seed else "-"


def method_rows(results: dict[str, Any], window: int, noise: bool = False, target: float = TARGET) -> list[str]:
    """The markdown table of every setting's methods: seeds at the target, iterations to it per seed, final rate,
    s / iteration (with `noise`, a column of each setting's noise scale after its name)."""
    to_target, reached = target_keys(target)
    percent = f"{100 * target:g}%"
    columns = [
        "setting",
        *(["noise"] if noise else []),
        "method",
        f"seeds at {percent}",
        f"iterations to {percent} (per seed, * censored)",
        f"final success rate (mean of last {window})",
        "s / iteration",
    ]
    coverage = any("empo_cell_coverage" in m for r in results.values() for m in r["methods"].values())
    columns += ["EMPO cell coverage (mean, seed range)"] if coverage else []
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for name, r in results.items():
        for label, m in r["methods"].items():
            per_seed = ", ".join(f"{n}{'' if ok else '*'}" for n, ok in zip(m[to_target], m[reached]))
            cells = [
                name,
                *([str(r["noise_scale"])] if noise else []),
                label,
                f"{sum(m[reached])}/{m['seeds']}",
                per_seed,
                f"{np.mean(m['final_optimal_rate']):.3f}",
                f"{m['seconds_per_iteration']:.2f}",
                *([cell_coverage_cell(m)] if coverage else []),
            ]
            lines.append("| " + " | ".join(cells) + " |")
    return lines


def table(results: dict[str, Any], window: int, target: float = TARGET) -> str:
    return "\n".join(method_rows(results, window, target=target)) + "\n"


def plan_jobs(run: dict[str, Any], seeds: range, out: Path, iterations: int | None, warm_starts: dict[str, str]) -> list[Job]:
    """Every (setting, method, seed) of the study, resolved once before any worker starts (a bad method fails here);
    `warm_starts`: {setting: the key of the warm-started model its runs load}."""
    from algorithms.train import resolve_argv

    settings, methods = settings_of(run), methods_of(run)
    rate = float(run.get("seconds_per_iteration", 1.0))
    jobs = []
    for name, setting in settings.items():
        budget = iterations or setting.iterations
        for label, method in methods.items():
            resolve_argv(run_argv(setting, method, seeds.start, budget, out / "unused"))
            for seed in seeds:
                log_dir = out / name / label.replace("/", "_") / f"seed{seed}"
                argv = tuple(run_argv(setting, method, seed, budget, log_dir))
                jobs.append(Job(name, label, seed, argv, str(log_dir), warm_starts[name], START_S + budget * rate))
    return sorted(jobs, key=lambda job: -job.cost_s)


def prebuilt_warm_starts(run: dict[str, Any]) -> dict[str, str]:
    """Builds the warm-started models the study's runs load before any worker starts (else the first runs of an env
    build it, several at once): that of each setting's env that has its own (algorithms.llm.model.env_models), else
    the shared one. Returns {setting: that model's name, its key}, which each run records and resume checks."""
    from algorithms.llm.model.env_registry import env_tiny_model
    from algorithms.llm.model.warm_start import cached_warm_start

    settings = settings_of(run)
    keys = {}
    for env_id in sorted({setting.env_id for setting in settings.values()}):
        env_model = env_tiny_model(env_id)
        keys[env_id] = (cached_warm_start() if env_model is None else env_model.warm_start()).name
    return {name: keys[setting.env_id] for name, setting in settings.items()}


def one_or_each(warm_starts: dict[str, str]) -> str | dict[str, str]:
    """What the study's outputs record as `warm_start`: the key where one model serves every setting, else
    {setting: key}."""
    keys = set(warm_starts.values())
    return keys.pop() if len(keys) == 1 else dict(warm_starts)


def run_study(
    run: dict[str, Any], seeds: range, out: Path, workers: int, iterations: int | None = None, command: str | None = None
) -> dict[str, Any]:
    """Train every run of the study (reusing finished ones) and write OUT/results.json, results.md and run.json."""
    settings_of(run), methods_of(run)  # the data checked before anything is built or written
    window, target = int(run.get("window", 5)), target_of(run)
    from algorithms.common.provenance import environment_record

    record = environment_record()  # the commit the runs ran on, read before they start
    warm_starts = prebuilt_warm_starts(run)
    jobs = plan_jobs(run, seeds, out, iterations, warm_starts)
    warm_start = one_or_each(warm_starts)
    out = cli.output_dir(out, "--out")
    start = time.perf_counter()
    histories, reused = run_reusing(jobs, workers, start, final_rate)
    wall = time.perf_counter() - start
    results: dict[str, Any] = {}
    for name, setting in settings_of(run).items():
        methods = {}
        for label in methods_of(run):
            runs = [histories[j] for j in sorted(jobs, key=lambda j: j.seed) if j.setting == name and j.method == label]
            methods[label] = summarise_method(runs, window, target)
        results[name] = {"env": setting.env_id, "noise_scale": setting.noise_scale,
                         **({"env_kwargs": dict(setting.env_kwargs)} if setting.env_kwargs else {}),
                         "iterations": iterations or setting.iterations,
                         "hyperparameters": setting.hyperparams(), "methods": methods}  # fmt: skip
    payload = {"warm_start": warm_start, "target": target, "window": window, "seeds": list(seeds), "settings": results}
    cli.atomic_write_json(out / "results.json", payload)
    cli.atomic_write_text(out / "results.md", table(results, window, target))
    cli.atomic_write_json(
        out / "run.json",
        {"command": command, "wall_time_s": wall, "warm_start": warm_start, "runs": len(jobs), "runs_reused": reused,
         "run_time_s_sum": sum(h["iteration_time_s"] for j in jobs for h in histories[j]), **record},
    )  # fmt: skip
    print(table(results, window, target))
    return payload
