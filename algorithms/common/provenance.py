"""What a command ran and where: the record every CLI that writes a results directory leaves beside its outputs.

`run_record(prog, argv, wall_time_s, ...)` -> the command line as one shell-quoted string, the argv, the git
commit (and whether the work tree had uncommitted changes), the package versions, when it started and how long
it took. `benchmarks/make_results.py` reads these files to say which command, commit and wall time produced
each published number.
"""

from __future__ import annotations

import datetime
import shlex
from pathlib import Path
from typing import Any, Sequence

from algorithms.common import cli

RUN_RECORD = "run.json"


def command_line(prog: str, argv: Sequence[str]) -> str:
    return shlex.join([*shlex.split(prog), *map(str, argv)])


def run_record(prog: str, argv: Sequence[str], started: float, wall_time_s: float, **extra: Any) -> dict[str, Any]:
    from algorithms.train import (
        environment_record,  # git commit and package versions, as each run records them
    )

    return {
        "command": command_line(prog, argv),
        "argv": [str(a) for a in argv],
        "started_at": datetime.datetime.fromtimestamp(started, datetime.timezone.utc).isoformat(timespec="seconds"),
        "wall_time_s": round(float(wall_time_s), 3),
        **environment_record(),
        **extra,
    }


def write_run_record(out: str | Path, prog: str, argv: Sequence[str], started: float, wall_time_s: float,
                     **extra: Any) -> dict[str, Any]:
    record = run_record(prog, argv, started, wall_time_s, **extra)
    cli.atomic_write_json(Path(out) / RUN_RECORD, record)
    return record
