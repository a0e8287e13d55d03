"""`python -m algorithms.tune --algo ALGO --env ENV --trials N`: hyperparameter search with Optuna.

Samples the algo's search space (zoo_configs/search_spaces.yml, or --search-space FILE) with Optuna's TPE
sampler ("Algorithms for Hyper-Parameter Optimization", Bergstra et al., NeurIPS 2011); every trial trains
the same seeds (--seeds-per-trial, from --seed-start) with `algorithms.train`, every hyperparameter not
searched keeping its zoo value. Objective, per arm:
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
host) is marked failed and not counted. --workers W runs W worker loops with the executor
(algorithms.common.executor): W processes here, or W Ray tasks with --backend ray (a local Ray instance, or
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

import contextlib
import copy
import dataclasses
import fcntl
import functools
import json
import math
import os
import socket
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Sequence

import yaml

from algorithms.common import cli, convergence, executor, provenance
from algorithms.common.config import ZOO_CONFIG_DIR, parse_overrides, read_yaml
from algorithms.common.errors import ConfigError, Stopped, VcbmGymError
from algorithms.registry import get_algo

SEARCH_SPACES = ZOO_CONFIG_DIR / "search_spaces.yml"
KINDS = ("float", "int", "categorical")
BACKENDS = executor.BACKENDS
ARMS = {"algorithms.tabular.runner": "tabular", "algorithms.sb3.runner": "sb3", "algorithms.llm.runner": "llm"}
BUDGET_KEYS = ("max_episodes", "iterations", "seed")  # the budget and the seeds are tune's, not searched
DISCOUNTED = "discounted_trials"  # study user attr: trials cut short by a dead or stopped process
SAMPLERS = "sampler_seeds"  # study user attr: the TPE seed of every worker loop that joined, in order


@dataclasses.dataclass(frozen=True)
class Param:
    """One searched hyperparameter and its distribution."""

    name: str
    kind: str
    low: float | None = None
    high: float | None = None
    log: bool = False
    step: int | None = None
    choices: tuple | None = None

    def suggest(self, trial: Any) -> Any:
        if self.kind == "float":
            return trial.suggest_float(self.name, self.low, self.high, log=self.log)
        if self.kind == "int":
            return trial.suggest_int(self.name, int(self.low), int(self.high), step=self.step or 1, log=self.log)
        return trial.suggest_categorical(self.name, list(self.choices))

    def corners(self) -> list[Any]:
        """Values that together reach every edge of the space (checked against the runner before any trial)."""
        if self.kind == "categorical":
            return list(self.choices)
        cast = float if self.kind == "float" else int
        return [cast(self.low), cast(self.high)]


def parse_search_space(spec: Any, where: str) -> list[Param]:
    """{name: {type, low, high, log, step | choices}} -> checked Params; one clear line for each mistake."""
    if not isinstance(spec, dict) or not spec:
        raise ConfigError(f"{where}: expected a non-empty mapping of hyperparameter -> distribution")
    params = []
    for name, dist in spec.items():
        at = f"{where}, {name!r}"
        if not isinstance(name, str) or not name or name.split(".")[0] in BUDGET_KEYS:
            raise ConfigError(f"{at}: expected a hyperparameter name other than {', '.join(BUDGET_KEYS)} (tune sets those)")
        if not isinstance(dist, dict) or dist.get("type") not in KINDS:
            raise ConfigError(f"{at}: {dist!r}: expected a mapping with type one of {', '.join(KINDS)}")
        allowed = (
            {"type", "choices"}
            if dist["type"] == "categorical"
            else {"type", "low", "high", "log"} | ({"step"} if dist["type"] == "int" else set())
        )
        extra = sorted(set(dist) - allowed)
        if extra:
            raise ConfigError(f"{at}: unknown key(s) {', '.join(map(str, extra))}; expected: {', '.join(sorted(allowed))}")
        if dist["type"] == "categorical":
            choices = dist.get("choices")
            if not isinstance(choices, list) or not choices or any(isinstance(c, (dict, list)) for c in choices):
                raise ConfigError(f"{at}: choices={choices!r}: expected a non-empty list of scalars")
            params.append(Param(name, "categorical", choices=tuple(choices)))
            continue
        low, high, log, step = dist.get("low"), dist.get("high"), dist.get("log", False), dist.get("step")
        numbers = (int,) if dist["type"] == "int" else (int, float)
        if any(isinstance(v, bool) or not isinstance(v, numbers) or not math.isfinite(v) for v in (low, high)):
            kind = "integers" if dist["type"] == "int" else "finite numbers"
            raise ConfigError(f"{at}: low={low!r}, high={high!r}: expected {kind}")
        if not low < high or not isinstance(log, bool) or (log and low <= 0):
            raise ConfigError(
                f"{at}: low={low!r}, high={high!r}, log={log!r}: expected low < high, log true or false, and low > 0 with log"
            )
        if step is not None and (isinstance(step, bool) or not isinstance(step, int) or step < 1 or log):
            raise ConfigError(f"{at}: step={step!r}: expected an integer >= 1, and no step with log")
        params.append(Param(name, dist["type"], low, high, log, step))
    return params


def load_search_space(algo: str, path: str | Path | None) -> list[Param]:
    source = Path(path) if path is not None else SEARCH_SPACES
    data = read_yaml(source)
    if not isinstance(data, dict):
        raise ConfigError(f"search space file {str(source)!r}: expected a mapping of algo -> search space")
    if algo not in data:
        raise ConfigError(
            f"search space file {str(source)!r} has no entry for algo {algo!r}; it has: {', '.join(map(str, data)) or 'none'}"
        )
    return parse_search_space(data[algo], f"search space file {str(source)!r}, algo {algo!r}")


def apply_params(base: dict[str, Any], values: dict[str, Any]) -> dict[str, Any]:
    """The top-level hyperparameters that `values` change, dotted names merged into their mapping from `base`."""
    out: dict[str, Any] = {}
    for name, value in values.items():
        top, *path = name.split(".")
        if not path:
            out[top] = value
            continue
        mapping = out.setdefault(top, copy.deepcopy(base.get(top) or {}))
        if not isinstance(mapping, dict):
            raise ConfigError(f"searched hyperparameter {name!r}: {top}={mapping!r} is not a mapping")
        for key in path[:-1]:
            inner = mapping.setdefault(key, {})
            if not isinstance(inner, dict):
                raise ConfigError(f"searched hyperparameter {name!r}: {key}={inner!r} is not a mapping")
            mapping = inner
        mapping[path[-1]] = value
    return out


def overrides_argv(values: dict[str, Any]) -> list[str]:
    """key=value items for --hyperparams (YAML flow style, read back by parse_overrides)."""
    return [
        f"{k}={yaml.safe_dump(v, default_flow_style=True, width=10**6).strip().removesuffix('...').strip()}"
        for k, v in values.items()
    ]


@dataclasses.dataclass(frozen=True)
class Objective:
    direction: str  # "minimize" | "maximize"
    name: str
    intermediate: str

    def intermediate_value(self, metrics: dict[str, float]) -> float | None:
        if "correct_rate" not in metrics:
            return None
        rate = float(metrics["correct_rate"])
        return 1.0 - rate if self.direction == "minimize" else rate


def objective_for(arm: str) -> Objective:
    if arm == "llm":
        return Objective(
            "maximize",
            "task goal completion (optimal-decision rate), mean of the last --final-window iterations and the seeds",
            "task goal completion of the iteration",
        )
    return Objective(
        "minimize",
        "episodes to converge, mean over the seeds (the cap for a run that does not converge)",
        "incorrect-decision rate, 1 - the correct-decision moving average",
    )


@dataclasses.dataclass(frozen=True)
class Settings:
    """Everything a worker (a process here, or a Ray task elsewhere) needs: picklable, resolved."""

    algo: str
    env: str
    arm: str
    trials: int
    seeds: tuple[int, ...]
    budget: int  # per seed: episodes (tabular, SB3) or iterations (LLM)
    report_every: int
    warmup_steps: int
    startup_trials: int
    final_window: int
    sampler_seed: int | None
    study_name: str
    storage: str
    out: str
    params: tuple[Param, ...]
    base: dict[str, Any]  # the resolved hyperparameters of a trial before the searched ones
    fixed: tuple[str, ...]  # --hyperparams given to tune, passed to every run
    budget_flag: tuple[str, ...]  # --max-episodes M / --iterations I when given to tune

    @property
    def objective(self) -> Objective:
        return objective_for(self.arm)

    def identity(self) -> dict[str, Any]:
        """What a study must have been created with to be continued by these settings."""
        return {
            "algo": self.algo,
            "env": self.env,
            "seeds": list(self.seeds),
            "budget": self.budget,
            "fixed": list(self.fixed),
            "search_space": [dataclasses.asdict(p) for p in self.params],
        }


def _optuna() -> Any:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


def storage_of(path: str) -> Any:
    optuna = _optuna()
    from optuna.storages.journal import JournalFileBackend

    return optuna.storages.JournalStorage(JournalFileBackend(path))


def _not_a_journal(path: str, why: str) -> VcbmGymError:
    return VcbmGymError(f"--storage {path!r} {why}: expected an Optuna journal file (or a new path)")


def check_storage(path: str) -> None:
    """One line for a --storage that Optuna would fail on with a traceback, or would damage: a directory, a
    file that is not a journal (one JSON object per line), a journal cut mid-line (its writer died in the
    middle of a write; Optuna would append the next entry to the cut line, and the journal would no longer
    load). The file is read under Optuna's own lock, so that a line another process is writing is not taken
    for a cut one."""
    from optuna.storages.journal import JournalFileSymlinkLock

    if not os.path.lexists(path):
        return
    if not os.path.isfile(path):
        raise _not_a_journal(path, "is a directory" if os.path.isdir(path) else "is not a regular file")
    lock = JournalFileSymlinkLock(path)
    try:
        lock.acquire()
        try:
            data = Path(path).read_bytes()
        finally:
            lock.release()
    except OSError as exc:
        raise _not_a_journal(path, f"cannot be read ({exc.strerror or exc})") from None
    if data and not data.endswith(b"\n"):
        raise _not_a_journal(
            path, "ends in the middle of a line (a process died while writing it; remove that last partial line)"
        )
    for number, line in enumerate(data.splitlines(), 1):
        try:
            entry = json.loads(line)
        except ValueError:  # UnicodeDecodeError too
            entry = None
        if not isinstance(entry, dict) or "op_code" not in entry:
            raise _not_a_journal(path, f"line {number} is not an Optuna journal entry")


def _sampler(s: Settings, seed: int | None) -> Any:
    return _optuna().samplers.TPESampler(n_startup_trials=s.startup_trials, seed=seed)


def open_study(s: Settings) -> Any:
    """Create or load the study; refuse one created for other settings or another direction. Its sampler is
    seeded with --sampler-seed: a worker loop replaces it with its own (join_study)."""
    optuna = _optuna()
    sampler = _sampler(s, s.sampler_seed)
    pruner = optuna.pruners.MedianPruner(n_startup_trials=s.startup_trials, n_warmup_steps=s.warmup_steps)
    try:
        storage = storage_of(s.storage)  # replays the whole journal
        try:  # loading first: create_study appends a (refused) creation entry to the journal at every call
            study = optuna.load_study(study_name=s.study_name, storage=storage, sampler=sampler, pruner=pruner)
        except KeyError:  # no such study yet (another process may be creating it now: load_if_exists)
            study = optuna.create_study(
                study_name=s.study_name,
                storage=storage,
                load_if_exists=True,
                direction=s.objective.direction,
                sampler=sampler,
                pruner=pruner,
            )
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:  # what check_storage missed
        raise _not_a_journal(s.storage, f"cannot be loaded ({type(exc).__name__}: {exc})") from None
    identity = _jsonable(s.identity())
    recorded = study.user_attrs.get("tune")
    if recorded is None:
        study.set_user_attr("tune", identity)
    elif recorded != identity:
        diff = [k for k in identity if recorded.get(k) != identity[k]]
        raise VcbmGymError(
            f"study {s.study_name!r} in {s.storage!r} was created with other settings ({', '.join(diff)} "
            "differ): expected the same --algo, --env, seeds, budget, --hyperparams and search space, "
            "or another --study-name"
        )
    if study.direction.name.lower() != s.objective.direction:
        raise VcbmGymError(
            f"study {s.study_name!r} in {s.storage!r} is to {study.direction.name.lower()}: expected "
            f"{s.objective.direction} for algo {s.algo!r}"
        )
    return study


def join_study(study: Any, s: Settings) -> int | None:
    """Record this worker loop in the study and return its TPE seed: --sampler-seed + the number of loops
    that joined the study before it (any process, any machine), so that no two loops draw the same random
    stream, and a single-process tune proposes what its seed says. Called with the ask lock held."""
    joined = list(study.user_attrs.get(SAMPLERS, []))
    seed = None if s.sampler_seed is None else (s.sampler_seed + len(joined)) % (cli.MAX_SEED + 1)
    study.set_user_attr(SAMPLERS, [*joined, {"owner": _owner(), "seed": seed}])
    return seed


def _jsonable(data: Any) -> Any:
    return json.loads(json.dumps(data))


@contextlib.contextmanager
def ask_lock(storage: str):
    """One process at a time counts the study's trials and asks for a new one (so --trials is exact)."""
    with open(f"{storage}.ask-lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def discount(study: Any, number: int) -> None:
    """Record (in the study) that trial `number` did not run to its end for reasons of its own process:
    it does not count towards --trials. Called with the ask lock held."""
    study.set_user_attr(DISCOUNTED, sorted({*study.user_attrs.get(DISCOUNTED, []), int(number)}))


def reap_dead_trials(study: Any) -> int:
    """Mark failed the running trials whose process (on this host) is gone; they do not count towards --trials."""
    optuna = _optuna()
    host, reaped = socket.gethostname(), 0
    for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        owner_host, _, pid = str(trial.user_attrs.get("owner", "")).rpartition(":")
        if owner_host == host and pid.isdigit() and not _alive(int(pid)):
            discount(study, trial.number)
            study.tell(trial.number, state=optuna.trial.TrialState.FAIL)
            reaped += 1
    return reaped


def counted_trials(study: Any) -> int:
    discounted = set(study.user_attrs.get(DISCOUNTED, []))
    return sum(1 for t in study.get_trials(deepcopy=False) if t.number not in discounted)


class Reporter:
    """RunContext.report for the first seed of a trial: every `every` steps the intermediate value goes to the
    study, and a trial the pruner rejects stops there (optuna.TrialPruned). Only the first seed reports:
    Optuna's median rule compares the best value a trial has reported so far, so reports of a later seed would
    be masked by the first seed's best. A first seed that stops early (it converged) holds its last value for
    the rest of the budget (`hold`), as algorithms.plot draws it, so that it counts at every later step."""

    def __init__(self, trial: Any, objective: Objective, every: int) -> None:
        self.trial, self.objective, self.every = trial, objective, every
        self.latest: tuple[int, float] | None = None  # the last step seen (reported or not) and its value

    def __call__(self, step: int, metrics: dict[str, float]) -> None:
        value = self.objective.intermediate_value(metrics)
        if value is None or not math.isfinite(value):
            return
        self.latest = (step, value)
        if step % self.every:
            return
        self.trial.report(value, step)
        if self.trial.should_prune():
            import optuna

            raise optuna.TrialPruned(f"pruned at step {step} of the first seed (intermediate value {value:.4g})")

    def hold(self, budget: int) -> None:
        """Report the run's last value at every reporting step after the run's end, up to the budget."""
        if self.latest is None:
            return
        step, value = self.latest
        for later in range((step // self.every + 1) * self.every, budget + 1, self.every):
            self.trial.report(value, later)


def _final_rate(log_dir: Path, window: int) -> float:
    import json

    entries = json.loads((log_dir / "history.json").read_text())
    rates = [float(e["task_goal_completion"]) for e in entries if "task_goal_completion" in e]
    if not rates:
        raise VcbmGymError(
            f"run {str(log_dir)!r} logged no task_goal_completion: expected an env that reports it "
            "(the embedded text envs, AppWorld-v0)"
        )
    tail = rates[-window:]
    return sum(tail) / len(tail)


def run_value(s: Settings, summary: dict[str, Any], log_dir: Path) -> float:
    if s.arm == "llm":
        return _final_rate(log_dir, s.final_window)
    if summary.get("converged") is None:  # the env reported no first_decision_optimal (null convergence fields)
        raise convergence.no_criterion_error(
            s.env, f"seed {summary.get('seed')}'s summary has converged null", "tune minimises episodes to converge"
        )
    return float(summary["episodes_to_converge"] if summary["converged"] else summary["episodes_run"])


def evaluate(trial: Any, s: Settings) -> float:
    """Train every seed with the trial's hyperparameters; the objective's mean over the seeds."""
    from algorithms.train import run as train

    values = {p.name: p.suggest(trial) for p in s.params}
    overrides = overrides_argv(apply_params(s.base, values))
    results = []
    for index, seed in enumerate(s.seeds):
        log_dir = Path(s.out) / s.study_name / f"trial{trial.number}" / f"seed{seed}"
        argv = [
            "--algo",
            s.algo,
            "--env",
            s.env,
            "--seed",
            str(seed),
            "--log-dir",
            str(log_dir),
            "--no-progress",
            "--overwrite",
            *s.budget_flag,
            "--hyperparams",
            *s.fixed,
            *overrides,
        ]
        reporter = Reporter(trial, s.objective, s.report_every) if index == 0 else None
        summary = train(argv, report=reporter)
        if reporter is not None:
            reporter.hold(s.budget)
        results.append(run_value(s, summary, log_dir))
        trial.set_user_attr(f"seed{seed}", results[-1])
    return sum(results) / len(results)


def worker_loop(s: Settings, quiet: bool = False) -> int:
    """Ask, evaluate and tell trials until the study holds --trials of them; returns how many ran here."""
    optuna = _optuna()
    study = open_study(s)
    with ask_lock(s.storage):
        study.sampler = _sampler(s, join_study(study, s))
    ran = 0
    while True:
        with ask_lock(s.storage):
            reap_dead_trials(study)
            if counted_trials(study) >= s.trials:
                return ran
            trial = study.ask()
            trial.set_user_attr("owner", _owner())
        ran += 1
        start = time.perf_counter()
        try:
            value = evaluate(trial, s)
        except optuna.TrialPruned as exc:
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            outcome = str(exc)
        except BaseException as exc:
            if not isinstance(exc, VcbmGymError) or isinstance(exc, Stopped):
                # Ctrl-C, SIGTERM (executor.Terminated), or a bug: the trial does not count, the error is not hidden
                trial.set_user_attr("failure", f"{type(exc).__name__}: {exc}")
                with ask_lock(s.storage):
                    discount(study, trial.number)
                study.tell(trial, state=optuna.trial.TrialState.FAIL)
                raise
            # a sampled combination the runner refuses: that trial fails, the study goes on
            trial.set_user_attr("failure", str(exc))
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
            outcome = f"failed: {exc}"
        else:
            study.tell(trial, value)
            outcome = f"value {value:.6g}"
        if not quiet:
            params = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in trial.params.items())
            print(f"trial {trial.number} ({time.perf_counter() - start:.1f} s, {params}): {outcome}", flush=True)


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
        signame, code = executor.stop_of(exc)
        raise Stopped(
            f"{signame}: the study's finished trials are kept in {s.storage!r} (running ones are not counted); "
            "rerun the same command to continue",
            code,
        ) from None
    if errors:
        raise VcbmGymError(f"{len(errors)} tune worker(s) failed: " + "; ".join(errors))
    return sum(ran)


def best_snippet(study: Any, s: Settings) -> str:
    """The best trial's hyperparameters (and tune's fixed --hyperparams) as a zoo_configs entry."""
    best = study.best_trial
    values = {**parse_overrides(s.fixed), **apply_params(s.base, best.params)}
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
        for name, draw in (
            ("study_history.png", ovm.plot_optimization_history),
            ("study_intermediate.png", ovm.plot_intermediate_values),
        ):
            ax = draw(study)
            fig = ax.figure
            fig.set_size_inches(8, 4.5)
            tmp = out / f".{name}.{os.getpid()}.tmp.png"  # several tune processes of one study share out
            fig.savefig(tmp, dpi=120, bbox_inches="tight")
            os.replace(tmp, out / name)
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


def resolve_settings(args: Any) -> tuple[Settings, dict[str, Any]]:
    """Check everything and resolve the base config once (and at every edge of the search space), before any trial."""
    from algorithms.train import resolve_argv

    cli.check_int(args.trials, "--trials", 1, 100_000)
    cli.check_int(args.seeds_per_trial, "--seeds-per-trial", 1, 1_000)
    cli.check_seed(args.seed_start, "--seed-start")
    cli.check_seed(args.seed_start + args.seeds_per_trial - 1, "--seed-start + --seeds-per-trial - 1 (the last seed)")
    cli.check_int(args.startup_trials, "--startup-trials", 0)
    cli.check_int(args.final_window, "--final-window", 1)
    cli.check_int(args.workers, "--workers", 1, 256)
    if args.sampler_seed is not None:
        cli.check_seed(args.sampler_seed, "--sampler-seed")
    executor.check_backend(args.backend, args.address, args.workers, "tune --backend ray")
    arm = ARMS.get(get_algo(args.algo).runner)
    if arm is None:
        raise VcbmGymError(f"--algo {args.algo!r}: expected a tabular, SB3 or LLM algo")
    if arm == "llm" and args.max_episodes is not None:
        raise VcbmGymError(f"--max-episodes {args.max_episodes} with LLM algo {args.algo!r}: expected --iterations")
    if arm != "llm" and args.iterations is not None:
        raise VcbmGymError(f"--iterations {args.iterations} with algo {args.algo!r}: expected --max-episodes")
    budget_flag: tuple[str, ...] = ()
    if args.max_episodes is not None:
        budget_flag = ("--max-episodes", str(cli.check_int(args.max_episodes, "--max-episodes", 1)))
    if args.iterations is not None:
        budget_flag = ("--iterations", str(cli.check_int(args.iterations, "--iterations", 1)))
    params = load_search_space(args.algo, args.search_space)
    fixed = tuple(args.hyperparams)
    parse_overrides(fixed)  # malformed items: one line now
    base_argv = ["--algo", args.algo, "--env", args.env, "--seed", str(args.seed_start), *budget_flag, "--hyperparams", *fixed]
    try:
        base = resolve_argv(base_argv).hyperparams
        for param in params:  # every edge of every searched value must be accepted by the runner
            for value in param.corners():
                resolve_argv([*base_argv, *overrides_argv(apply_params(base, {param.name: value}))])
    except VcbmGymError as exc:
        raise VcbmGymError(f"search space of {args.algo!r} on {args.env}: {exc}") from None
    if arm != "llm":  # the objective is episodes to converge: an env without the criterion has none
        convergence.require_criterion(args.env, base.get("env_kwargs") or {}, "tune minimises episodes to converge")
    budget = int(base["iterations"] if arm == "llm" else base["max_episodes"])
    if args.report_every is not None:
        cli.check_int(args.report_every, "--report-every", 1)
    report_every = args.report_every or (1 if arm == "llm" else 100)
    warmup = args.warmup_steps if args.warmup_steps is not None else budget // 10
    cli.check_int(warmup, "--warmup-steps", 0)
    out = Path(args.out or Path("runs") / "tune" / args.algo / args.env)
    storage = Path(args.storage) if args.storage else out / "study.journal"
    settings = Settings(
        algo=args.algo,
        env=args.env,
        arm=arm,
        trials=args.trials,
        seeds=tuple(range(args.seed_start, args.seed_start + args.seeds_per_trial)),
        budget=budget,
        report_every=report_every,
        warmup_steps=warmup,
        startup_trials=args.startup_trials,
        final_window=args.final_window,
        sampler_seed=args.sampler_seed,
        study_name=args.study_name or f"{args.algo}-{args.env}",
        storage=str(storage.resolve()),
        out=str(out.resolve()),
        params=tuple(params),
        base=base,
        fixed=fixed,
        budget_flag=budget_flag,
    )
    check_storage(settings.storage)
    return settings, base


def run(argv: Sequence[str] | None = None) -> dict[str, Any]:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    started = provenance.start()
    with executor.sigterm_stops():
        return _run(args, argv, started)


def _run(args: Any, argv: list[str], started: provenance.Start) -> dict[str, Any]:
    settings, base = resolve_settings(args)
    out = cli.output_dir(settings.out, "--out")
    cli.output_dir(Path(settings.storage).parent, "--storage's directory")
    open_study(settings)  # a study created with other settings is refused before tune_config.yml is written
    objective = settings.objective
    config = {
        **{k: v for k, v in dataclasses.asdict(settings).items() if k not in ("params", "base")},
        "objective": dataclasses.asdict(objective),
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
        "base_hyperparams": base,
        "backend": args.backend,
        "address": args.address,
        "workers": args.workers,
        **started.environment,
    }
    cli.atomic_write_text(out / "tune_config.yml", yaml.safe_dump(_jsonable(config), sort_keys=False))
    ran = run_workers(settings, args.workers, args.backend, args.address)

    optuna = _optuna()
    study = open_study(settings)
    cli.atomic_write_json(out / "trials.json", trials_record(study))
    complete = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    if not complete:
        states = {t.state.name for t in study.trials}
        raise VcbmGymError(
            f"study {settings.study_name!r} has no complete trial ({len(study.trials)} trial(s): "
            f"{', '.join(sorted(states))}); see {str(out / 'trials.json')!r}"
        )
    snippet = best_snippet(study, settings)
    cli.atomic_write_text(out / "best.yml", snippet)
    plots = plot_study(study, out)
    best = study.best_trial
    counts = {state: sum(1 for t in study.trials if t.state.name == state) for state in ("COMPLETE", "PRUNED", "FAIL")}
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
    print(snippet, end="")
    print(f"wrote {out / 'best.yml'}, {out / 'trials.json'}, {', '.join(str(p) for p in plots)}, {out / 'tune_config.yml'}")
    return {
        "best_value": best.value,
        "best_params": best.params,
        "best_trial": best.number,
        "trials": len(study.trials),
        "ran": ran,
        "states": counts,
    }


def main(argv: Sequence[str] | None = None) -> int:
    return cli.main(run, argv)


if __name__ == "__main__":
    sys.exit(main())
