"""What a command ran and where: the record every CLI that writes a results directory leaves beside its outputs.

`start()` at a command's start, then `write_run_record(out, prog, argv, started, ...)` -> the command line as
one shell-quoted string, the argv, the git commit (and whether the work tree had uncommitted changes) and the
package versions as they were when it started, when it started and how long it took.
`benchmarks/make_results.py` reads these files to say which command, commit and wall time produced each
published number.
"""

from __future__ import annotations

import dataclasses
import datetime
import shlex
import time
from pathlib import Path
from typing import Any, Sequence

from algorithms.common import cli

RUN_RECORD = "run.json"


def command_line(prog: str, argv: Sequence[str]) -> str:
    return shlex.join([*shlex.split(prog), *map(str, argv)])


@dataclasses.dataclass(frozen=True)
class Start:
    """When a command started, and the commit and versions it started with (the code that ran)."""

    wall: float
    clock: float
    environment: dict[str, Any]


def start() -> Start:
    from algorithms.train import (
        environment_record,  # git commit and package versions, as each run records them
    )

    return Start(time.time(), time.perf_counter(), environment_record())


def run_record(prog: str, argv: Sequence[str], started: Start, **extra: Any) -> dict[str, Any]:
    return {
        "command": command_line(prog, argv),
        "argv": [str(a) for a in argv],
        "started_at": datetime.datetime.fromtimestamp(started.wall, datetime.timezone.utc).isoformat(timespec="seconds"),
        "wall_time_s": round(time.perf_counter() - started.clock, 3),
        **started.environment,
        **extra,
    }


def write_run_record(out: str | Path, prog: str, argv: Sequence[str], started: Start, **extra: Any) -> dict[str, Any]:
    """run.json in `out`: the command, its commit and versions (as at its start) and its wall time until now."""
    record = run_record(prog, argv, started, **extra)
    cli.atomic_write_json(Path(out) / RUN_RECORD, record)
    return record
