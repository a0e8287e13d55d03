"""What a command ran and where: the record every CLI that writes a results directory leaves beside its outputs.

`start()` at a command's start, then `write_run_record(out, prog, argv, started, ...)` -> the command line as
one shell-quoted string, the argv, the git commit (and whether the work tree had uncommitted changes) and the
package versions as they were when it started, when it started and how long it took.
`benchmarks/make_results.py` reads these files to say which command, commit and wall time produced each
published number.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import importlib.metadata
import platform
import shlex
import subprocess
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import vcbm_gym
from algorithms.common import cli

RUN_RECORD = "run.json"
REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("numpy", "gymnasium", "stable-baselines3", "torch", "scipy", "pyyaml", "trl", "transformers", "peft", "optuna", "ray")


@functools.cache
def package_versions() -> dict[str, str]:
    """Read once per process: each lookup parses a METADATA file (~1 ms), and a process that runs
    many seeds (compare, the speed benchmark) would pay it per run; the modules loaded do not change."""
    versions = {"python": platform.python_version(), "vcbm-gym": vcbm_gym.__version__}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    return versions


def environment_record() -> dict[str, Any]:
    versions = dict(package_versions())
    commit = dirty = None
    try:
        run = lambda *a: subprocess.run(["git", "-C", str(REPO), *a], capture_output=True, text=True, timeout=10)  # noqa: E731
        head = run("rev-parse", "HEAD")
        if head.returncode == 0:
            commit = head.stdout.strip()
            dirty = bool(run("status", "--porcelain", "--untracked-files=no").stdout.strip())
    except (OSError, subprocess.SubprocessError):
        pass
    return {"versions": versions, "git_commit": commit, "git_dirty": dirty}


def command_line(prog: str, argv: Sequence[str]) -> str:
    return shlex.join([*shlex.split(prog), *map(str, argv)])


def add_report_arguments(parser: argparse.ArgumentParser) -> None:
    """A side-by-side benchmark's `--json` and `--markdown` files (check_report_files, write_report)."""
    parser.add_argument("--json", help="also write the measured rows here")
    parser.add_argument("--markdown", help="also write the printed report here")


def check_report_files(json_path: str | None, markdown_path: str | None) -> None:
    """Refuse a benchmark's unwritable `--json` / `--markdown` file (one line) before it runs anything."""
    for option, path in (("--json", json_path), ("--markdown", markdown_path)):
        if path:
            cli.check_output_file(path, option)


def write_report(
    title: str,
    prog: str,
    argv: Sequence[str],
    record: dict[str, Any],
    rows: list[dict],
    lines: list[str],
    json_path: str | None,
    markdown_path: str | None,
) -> None:
    """A side-by-side benchmark's outputs: `--json` its rows with the command and `record` (environment_record,
    taken before the runs), `--markdown` its printed report under `# title`, with the command and commit."""
    command = command_line(prog, argv)
    if json_path:
        cli.atomic_write_json(json_path, {"command": command, **record, "rows": rows})
    if markdown_path:
        dirty = " (with uncommitted changes)" if record["git_dirty"] else ""
        head = f"Command: `{command}`; commit: {record['git_commit'] or 'not recorded'}{dirty}.\n\n"
        cli.atomic_write_text(markdown_path, f"# {title}\n\n" + head + "```\n" + "\n".join(lines) + "\n```\n")


def measured_report(
    title: str,
    prog: str,
    argv: Sequence[str],
    measure: Callable[[], list[dict]],
    report: Callable[[list[dict], float], list[str]],
    json_path: str | None,
    markdown_path: str | None,
) -> list[dict]:
    """A side-by-side benchmark's run: `measure()` its rows, print `report(rows, seconds taken)` and write it
    (write_report, with the environment read before the runs: the commit they measure)."""
    start = time.perf_counter()
    record = environment_record()
    rows = measure()
    lines = report(rows, time.perf_counter() - start)
    print("\n".join(lines))
    write_report(title, prog, argv, record, rows, lines, json_path, markdown_path)
    return rows


@dataclasses.dataclass(frozen=True)
class Start:
    """When a command started, and the commit and versions it started with (the code that ran)."""

    wall: float
    clock: float
    environment: dict[str, Any]


def start() -> Start:
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
