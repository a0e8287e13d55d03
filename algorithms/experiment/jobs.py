"""The runs of an experiment (compare, suite) as jobs of the executor, each carrying its resolved RunSpec.

A method label (`ALGO`, or `ALGO+RULE` for an algo with a credit rule) is resolved once, in memory, by
`algorithms.train.resolve_spec` (zoo YAML, then the command's --hyperparams parsed once, the budget and the
rule); the other seeds are `spec.with_seed(seed)`. A worker trains a job with `algorithms.train.execute`:
no command line is built or parsed after the experiment command's own. A job whose log dir holds a finished
run of the same config hash (and unchanged since: its checksum) is reused, not rerun.
"""

from __future__ import annotations

import contextlib
import io
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from tqdm.auto import tqdm

from algorithms import train
from algorithms.common.errors import VcbmGymError
from algorithms.common.log_dir import finished_summary
from algorithms.common.spec import DEPRECATED_ALGOS, RunOptions, RunSpec
from algorithms.experiment import executor
from algorithms.experiment.distributed import pack_dir, unpack_dir
from algorithms.registry import ALGOS, get_algo, get_arm

MAX_SEEDS = 10_000  # per algo; more is a typo (and would not fit in memory as jobs)
MAX_WORKERS = 256


@dataclass(frozen=True)
class Job:
    label: str  # the method, as given on the command line (e.g. "rudder", "ppo+vcbm_bookmark"), and where it ran
    seed: int
    log_dir: Path
    spec: RunSpec = field(compare=False)  # what the worker trains: its config_hash keys reuse


def parse_label(label: str) -> tuple[str, str | None]:
    """`rudder` -> ("rudder", None); `ppo+vcbm_bookmark` -> ("ppo", "vcbm_bookmark"); `vcbm+`, the deprecated name
    of vcbm-plus, is an algo's name."""
    if label in ALGOS or label in DEPRECATED_ALGOS:  # a name, even the old one with a "+" in it
        return label, None
    algo, plus, credit = label.partition("+")
    get_algo(algo)  # one clear error for an unknown algo
    if plus and (not credit or "+" in credit):
        raise VcbmGymError(f"algo spec {label!r}: expected ALGO or ALGO+CREDIT_RULE")
    return algo, credit or None


def resolve_label(label: str, env: str, seed: int, overrides: Mapping[str, Any]) -> RunSpec:
    """The run of one method: `overrides` (already parsed values) and the label's credit rule on the zoo's entry,
    checked by the algo's arm, its objects built dry (`Arm.validate`): what a run would refuse stops the whole
    experiment before any worker starts, not each of its runs."""
    algo, credit = parse_label(label)
    mapping = dict(overrides) | ({"credit": credit} if credit is not None else {})
    spec = train.resolve_spec(algo, env, seed, mapping)
    get_arm(spec.algo).validate(spec)
    return spec


def seed_jobs(label: str, spec: RunSpec, seeds: range, log_dir_of: Any) -> list[Job]:
    """One job per seed of one resolved method; `log_dir_of(seed)` places each run."""
    return [Job(label, seed, Path(log_dir_of(seed)), spec.with_seed(seed)) for seed in seeds]


class LinePrefixed(io.TextIOBase):
    """A text stream that writes to `stream`, each line started with `prefix`."""

    def __init__(self, stream: TextIO, prefix: str) -> None:
        self.stream, self.prefix, self.at_line_start = stream, prefix, True

    def write(self, text: str) -> int:
        pieces = []
        for line in text.splitlines(keepends=True):
            pieces.append(self.prefix + line if self.at_line_start else line)
            self.at_line_start = line.endswith(("\n", "\r"))
        self.stream.write("".join(pieces))
        return len(text)

    def flush(self) -> None:
        self.stream.flush()

    def fileno(self) -> int:
        return self.stream.fileno()

    def isatty(self) -> bool:
        return self.stream.isatty()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return self.stream.encoding


def run_seed(job: Job) -> bytes | None:
    """One job of the executor: train the spec into its log dir (the experiment owns the log dir: a stale run there
    is replaced). A Ray task on another node than the command returns the log dir packed, for the command to
    unpack into --out (algorithms.experiment.distributed). What the run prints to stderr (an agent's warning)
    names the run: the runs of an experiment share one stderr."""
    with contextlib.redirect_stderr(LinePrefixed(sys.stderr, f"[{job.label} seed {job.seed}] ")):
        train.execute(job.spec, job.log_dir, RunOptions(progress=False, overwrite=True))
    return pack_dir(job.log_dir) if executor.on_remote_node() else None


def count_finished(jobs: list[Job]) -> int:
    return sum(1 for job in jobs if finished_summary(job.log_dir, job.spec)[0] is not None)


def _reusable(jobs: list[Job]) -> dict[Job, dict[str, Any]]:
    """The jobs whose log dir already holds a finished run of their config; says which others are rerun and why."""
    summaries, stale = {}, []
    for job in jobs:
        summary, why = finished_summary(job.log_dir, job.spec)
        if summary is not None:
            summaries[job] = summary
        elif why != "new":
            stale.append(f"{job.label} seed {job.seed}: {why}")
    if summaries:
        print(
            f"reusing {len(summaries)} finished run(s) of the same config; {len(jobs) - len(summaries)} to run", file=sys.stderr
        )
    if stale:
        more = f"; and {len(stale) - 3} more" if len(stale) > 3 else ""
        print(f"rerunning {len(stale)} run(s) found in --out: " + "; ".join(stale[:3]) + more, file=sys.stderr)
    return summaries


def train_jobs(
    jobs: list[Job], workers: int, progress: bool = True, backend: str = "process", address: str | None = None
) -> dict[Job, dict[str, Any]]:
    """Train the jobs that have no finished summary yet (in local processes, or as Ray tasks); every job's summary."""
    summaries = _reusable(jobs)
    todo = [job for job in jobs if job not in summaries]
    bar = tqdm(total=len(todo), desc="runs", unit="run", disable=not progress)
    failures: list[str] = []

    def finished(job: Job, packed: bytes | None, error: str | None) -> None:
        """One job ended: keep its summary, or its failure for the report at the end."""
        if packed is not None:
            unpack_dir(packed, job.log_dir)
        summary, why = finished_summary(job.log_dir, job.spec) if error is None else (None, error)
        if summary is None:  # keep the other seeds going; report at the end
            failures.append(f"{job.label} seed {job.seed}: {why}")
        else:
            summaries[job] = summary
        bar.update(1)
        bar.set_postfix_str(f"{job.label} seed {job.seed}")

    try:
        executor.run_jobs(run_seed, todo, workers=workers, finished=finished, backend=backend, address=address)
    except executor.STOPS as exc:
        kept = f"{count_finished(jobs)} of {len(jobs)} run(s) finished and kept in their log dirs"
        raise executor.stopped(exc, kept) from None
    finally:
        bar.close()
    if failures:
        raise VcbmGymError(f"{len(failures)} run(s) failed (finished ones are kept in their log dirs): " + "; ".join(failures))
    return summaries
