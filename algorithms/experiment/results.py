"""Writing a results directory (compare, suite, tune): one command at a time per directory (a lock file),
results.json beside its Markdown table, figures, and the run record (run.json, algorithms.common.provenance).
Every file is written to a temporary name beside it and renamed: a reader sees the old file or the new one,
never half of one, and a command stopped mid-write leaves no stray file behind.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from algorithms.common import cli, run_lock
from algorithms.common.errors import VcbmGymError

LOCK_FILE = ".compare.lock"  # compare's and suite's (one name: a compare and a suite must not share --out either)


def locked(out: Path, command: str = "compare") -> contextlib.AbstractContextManager[None]:
    """Hold OUT/.compare.lock for `command` (algorithms.common.run_lock: released when the holder dies, even by
    SIGKILL); a refused command names the one it waits for."""
    path = out / LOCK_FILE
    return run_lock.held(
        path,
        command,
        lambda pid, holder: VcbmGymError(
            f"--out {str(out)!r} is in use by another {holder or 'compare or suite'} (pid {pid}, lock {str(path)!r}): "
            f"expected one command at a time per --out: run this {command} with another --out, or after that one ends"
        ),
    )


def write_results(out: Path, results: Mapping[str, Any], table: str) -> None:
    """OUT/results.json and the same results as OUT/table.md."""
    cli.atomic_write_json(out / "results.json", results)
    cli.atomic_write_text(out / "table.md", table)


@contextlib.contextmanager
def atomic_file(path: Path) -> Iterator[Path]:
    """A temporary name beside `path` to write to (same suffix, so that a plotting library picks the format from it;
    the pid in it, since several processes of one tune study share a directory): renamed to `path` when the block
    ends, removed when it raises."""
    tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp{path.suffix}")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def save_figure(fig: Any, path: Path, **savefig: Any) -> None:
    """A matplotlib figure written atomically (`savefig`: Figure.savefig's keywords)."""
    with atomic_file(path) as tmp:
        fig.savefig(tmp, **savefig)


def runs_record(total: int, reused: int, summaries: Mapping[Any, Mapping[str, Any]]) -> dict[str, Any]:
    """run.json's account of a command's runs: how many were reused from an earlier command, how many ran, and the
    sum of their training wall times (results.json holds none: a resumed command must write the same file)."""
    return {
        "runs": total,
        "runs_reused": reused,
        "runs_run": total - reused,
        "run_time_s_sum": round(sum(float(s.get("wall_time_s", 0.0)) for s in summaries.values()), 3),
    }
