"""The Optuna study of `algorithms.tune`, shared by processes and machines through a journal file.

`Settings` are tune's resolved, picklable settings (what every worker loop needs); `open_study` creates or loads
the study and refuses one created for other settings; an ask lock beside the journal makes the count of the
study's trials exact across processes; a trial whose process died (same host) is failed and discounted.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import functools
import json
import os
import socket
from pathlib import Path
from typing import Any

from algorithms.common import cli
from algorithms.common.errors import VcbmGymError
from algorithms.common.spec import Objective
from algorithms.experiment import executor
from algorithms.experiment.search_space import Param, apply_params
from algorithms.registry import get_arm

DISCOUNTED = "discounted_trials"  # study user attr: trials cut short by a dead or stopped process
SAMPLERS = "sampler_seeds"  # study user attr: the TPE seed of every worker loop that joined, in order


def trial_overrides(
    fixed_values: dict[str, Any], base: dict[str, Any], values: dict[str, Any], budget_values: dict[str, Any]
) -> dict[str, Any]:
    """The hyperparameters a trial sets over the zoo's: --hyperparams, then the searched values (dotted names merged
    into their mapping of `base`), then the budget (as train folds --hyperparams, then --max-episodes)."""
    return {**fixed_values, **apply_params(base, values), **budget_values}


@dataclasses.dataclass(frozen=True)
class Settings:
    """Everything a worker (a process here, or a Ray task elsewhere) needs: picklable, resolved."""

    algo: str
    env: str
    arm: str  # the arm's name (tabular, sb3, llm), for the record
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
    fixed: tuple[str, ...]  # --hyperparams given to tune, as given (the study's identity, and the record)
    budget_flag: tuple[str, ...]  # --max-episodes M / --iterations I when given to tune (the record)
    fixed_values: dict[str, Any]  # --hyperparams parsed (once, by tune's command line): under every trial's values
    budget_values: dict[str, Any]  # {budget_key: M} when the budget flag was given: over every trial's values

    @property
    def objective(self) -> Objective:
        return get_arm(self.algo).objective

    def trial_overrides(self, values: dict[str, Any]) -> dict[str, Any]:
        return trial_overrides(self.fixed_values, self.base, values, self.budget_values)

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


def load_optuna() -> Any:
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


@functools.cache
def _stop_safe_backend() -> type:
    from optuna.storages.journal import JournalFileBackend

    class StopSafeJournalFileBackend(JournalFileBackend):
        """Optuna's journal file, whose writes (lock, append, unlock) a stop cannot cut (executor.stops_held)."""

        def append_logs(self, logs: list[dict[str, Any]]) -> None:
            with executor.stops_held():
                super().append_logs(logs)

    return StopSafeJournalFileBackend


def storage_of(path: str) -> Any:
    return load_optuna().storages.JournalStorage(_stop_safe_backend()(path))


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
        with executor.stops_held():
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


def tpe_sampler(s: Settings, seed: int | None) -> Any:
    return load_optuna().samplers.TPESampler(n_startup_trials=s.startup_trials, seed=seed)


def open_study(s: Settings) -> Any:
    """Create or load the study; refuse one created for other settings or another direction. Its sampler is
    seeded with --sampler-seed: a worker loop replaces it with its own (join_study)."""
    optuna = load_optuna()
    sampler = tpe_sampler(s, s.sampler_seed)
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
    study.set_user_attr(SAMPLERS, [*joined, {"owner": process_owner(), "seed": seed}])
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


def process_owner() -> str:
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
    optuna = load_optuna()
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
