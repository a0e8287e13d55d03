"""A worker loop of `algorithms.tune`: ask the study for a trial, train its seeds, tell the study the value.

Every trial's sampled values are applied to the base config in memory and resolved once by
`algorithms.train.resolve_spec` (a RunSpec; the other seeds are `with_seed`); every seed is trained by
`algorithms.train.execute`, the first one with a `Reporter` in `RunOptions.report` (median pruning).
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

from algorithms import train
from algorithms.common import convergence
from algorithms.common.errors import Stopped, VcbmGymError
from algorithms.common.spec import Objective, RunOptions
from algorithms.experiment.study import (
    Settings,
    ask_lock,
    counted_trials,
    discount,
    join_study,
    load_optuna,
    open_study,
    process_owner,
    reap_dead_trials,
    tpe_sampler,
)
from algorithms.registry import get_arm


class Reporter:
    """`RunOptions.report` of the first seed of a trial: every `every` steps the intermediate value goes to the
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
    """A seed's value: episodes to converge (the cap if it did not) for an arm that reports convergence, else the
    task goal completion of its last --final-window iterations."""
    if not get_arm(s.algo).reports_convergence:
        return _final_rate(log_dir, s.final_window)
    if summary.get("converged") is None:  # the env reported no first_decision_optimal (null convergence fields)
        raise convergence.no_criterion_error(
            s.env, f"seed {summary.get('seed')}'s summary has converged null", "tune minimises episodes to converge"
        )
    return float(summary["episodes_to_converge"] if summary["converged"] else summary["episodes_run"])


def evaluate(trial: Any, s: Settings) -> float:
    """Train every seed with the trial's hyperparameters (resolved once, in memory); the objective's mean over the
    seeds. A combination the arm refuses raises VcbmGymError before any seed runs."""
    values = {p.name: p.suggest(trial) for p in s.params}
    spec = train.resolve_spec(s.algo, s.env, s.seeds[0], s.trial_overrides(values))
    results = []
    for index, seed in enumerate(s.seeds):
        log_dir = Path(s.out) / s.study_name / f"trial{trial.number}" / f"seed{seed}"
        reporter = Reporter(trial, s.objective, s.report_every) if index == 0 else None
        summary = train.execute(spec.with_seed(seed), log_dir, RunOptions(progress=False, overwrite=True, report=reporter))
        if reporter is not None:
            reporter.hold(s.budget)
        results.append(run_value(s, summary, log_dir))
        trial.set_user_attr(f"seed{seed}", results[-1])
    return sum(results) / len(results)


def worker_loop(s: Settings, quiet: bool = False) -> int:
    """Ask, evaluate and tell trials until the study holds --trials of them; returns how many ran here."""
    optuna = load_optuna()
    study = open_study(s)
    with ask_lock(s.storage):
        study.sampler = tpe_sampler(s, join_study(study, s))
    ran = 0
    while True:
        with ask_lock(s.storage):
            reap_dead_trials(study)
            if counted_trials(study) >= s.trials:
                return ran
            trial = study.ask()
            trial.set_user_attr("owner", process_owner())
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
