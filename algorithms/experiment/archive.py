"""An experiment's finished runs carried to another machine: `archive` packs them, `run --resume-from` unpacks them.

A registered experiment longer than one machine's lease keeps its progress in a file: the experiment record
(OUT/experiment.json: the spec hash the runs were made under) and every finished run's log dir (a `summary.json`
whose checksum holds), without its TensorBoard event files and model weights where the experiment's outputs read
neither (suites read bsuite's CSV logs, LLM studies their history.json; compare's curve figure reads TensorBoard,
and a benchmark script reads what it chooses, so their runs travel whole). Resuming unpacks them into a new
--out, where the engine reuses each run whose config hash still matches and reruns the rest, and refuses an
archive made under another version of the spec (never pooled), before anything is written. Runs made at several
commits are not archived: an experiment's runs share one code version.

Archived into the zoo's IN_PROGRESS folder, an experiment also gets its row in that folder's README table: its
finished runs, the runs its spec plans and the commit whose code made them.
"""

from __future__ import annotations

import functools
import io
import json
import os
import tarfile
import tempfile
from pathlib import Path
from typing import Any

from algorithms.common import cli
from algorithms.common.errors import VcbmGymError
from algorithms.common.log_dir import EVENT_FILE, read_intact_summary, read_record
from algorithms.experiment import distributed, specs

SUFFIX = ".tar.xz"
IN_PROGRESS = specs.REPO / "benchmarks" / "in_progress"  # the zoo's registered experiments still running
LISTING = "README.md"  # IN_PROGRESS's table of them: | experiment | finished runs | of | made from commit |
WEIGHTS = frozenset({"checkpoints", "model", "adapter"})  # a run's saved models: its score never reads them


def finished_run_dirs(out: Path) -> list[Path]:
    """The log dirs under `out` whose summary.json is intact: the runs a resumed experiment can reuse."""
    return [path.parent for path in sorted(out.rglob("summary.json")) if read_intact_summary(path)[0] is not None]


def keeps_whole_runs(record: dict[str, Any]) -> bool:
    """Whether the experiment's outputs may read anything its runs wrote: all but a suite's and an LLM study's, and
    yes where its spec cannot be found (a benchmark script reads what it chooses)."""
    try:
        return specs.load_spec(str(record.get("experiment"))).kind not in ("suite", "llm")
    except VcbmGymError:
        return True


def carried(path: Path) -> bool:
    """Whether a file of a run (relative to its log dir) is one that scores and reuse read."""
    return not path.name.startswith(EVENT_FILE) and path.parts[0] not in WEIGHTS


def write_archive(out: Path, to: Path) -> tuple[str, int]:
    """Pack `out`'s experiment record and finished runs into `to` (written atomically): (experiment, runs)."""
    record_path = out / specs.RECORD_FILE
    if not record_path.is_file():
        raise VcbmGymError(f"--out {str(out)!r} holds no {specs.RECORD_FILE}: expected the --out of an experiment run")
    if not to.name.endswith(SUFFIX):
        raise VcbmGymError(f"--to {str(to)!r}: expected a file name ending in {SUFFIX}")
    record = cli.read_json_object(record_path, "experiment record")
    whole = keeps_whole_runs(record)
    runs = finished_run_dirs(out)
    commit = code_commit(runs)
    row = listed_row(record, len(runs), commit) if to.parent.resolve() == IN_PROGRESS.resolve() else None
    to.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=to.parent, prefix=f".{to.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle, tarfile.open(fileobj=handle, mode="w:xz") as tar:
            tar.add(record_path, arcname=specs.RECORD_FILE)
            for run_dir in runs:
                files = (p for p in run_dir.rglob("*") if p.is_file() and (whole or carried(p.relative_to(run_dir))))
                for path in sorted(files):
                    tar.add(path, arcname=str(path.relative_to(out)), recursive=False)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # as a file written plainly: mkstemp's 0600 would hide it from a group
        os.replace(tmp, to)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    if row is not None:
        list_in_progress(str(record.get("experiment")), row)
    return str(record.get("experiment")), len(runs)


def code_commit(runs: list[Path]) -> str | None:
    """The commit whose code made the runs (their config.yml's git_commit), None where no run records one."""
    commits = sorted({str(r["git_commit"]) for run in runs if (r := read_record(run)) and r.get("git_commit")})
    if len(commits) > 1:
        made = ", ".join(commit[:7] for commit in commits)
        raise VcbmGymError(f"--out holds runs made at {len(commits)} commits ({made}): expected one code version")
    return commits[0] if commits else None


def listed_row(record: dict[str, Any], runs: int, commit: str | None) -> str:
    """The experiment's row in IN_PROGRESS's table, which lists registered experiments' runs made under their spec
    as it stands: a spec outside the zoo, another version of it or overrides of its settings are refused."""
    spec = specs.load_spec(str(record.get("experiment")))
    if record.get("spec_hash") != spec.hash or record.get("deviations"):
        made = f"overrides {record.get('deviations')}" if record.get("spec_hash") == spec.hash else "another spec version"
        raise VcbmGymError(f"experiment {spec.name}: runs made with {made}; {IN_PROGRESS} keeps only its spec's own runs")
    return f"| {spec.name} | {runs} | {specs.planned_runs_text(spec)} | {commit[:7] if commit else '-'} |\n"


def list_in_progress(name: str, row: str | None) -> None:
    """Put `row` in place of the experiment's row in IN_PROGRESS's table (at its end where it has none yet), or
    delete its row where `row` is None."""
    listing = IN_PROGRESS / LISTING
    lines = listing.read_text().splitlines(keepends=True) if listing.is_file() else []
    mine = [i for i, line in enumerate(lines) if line.startswith(f"| {name} |")]
    at = mine[0] if mine else len(lines)
    lines = [line for i, line in enumerate(lines) if i not in mine]
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    if row is not None:
        lines.insert(at, row)
    cli.atomic_write_text(listing, "".join(lines))


def archived_record(path: Path) -> dict[str, Any]:
    """The experiment record an archive was made under, read without unpacking anything."""
    try:
        with tarfile.open(path, mode="r:xz") as tar:
            member = tar.extractfile(specs.RECORD_FILE)
            record = json.load(io.TextIOWrapper(member, encoding="utf-8")) if member else None
    except (OSError, KeyError, ValueError, tarfile.TarError) as exc:
        raise VcbmGymError(
            f"--resume-from {str(path)!r}: not an experiment archive ({exc}); expected an `archive` file"
        ) from None
    if not isinstance(record, dict):
        raise VcbmGymError(f"--resume-from {str(path)!r}: its {specs.RECORD_FILE} is not an object")
    return record


def unpack_archive(path: Path, out: Path) -> None:
    """Unpack the archive into `out`, which must not hold an experiment yet (what is there is never mixed)."""
    if (out / specs.RECORD_FILE).exists():
        raise VcbmGymError(f"--resume-from with --out {str(out)!r}, which already holds an experiment: expected a new --out")
    out.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, mode="r:xz") as tar:
        distributed.extract_data(tar, out)


def in_progress_archive(spec: specs.ExperimentSpec) -> Path | None:
    """The registered experiment's archive in IN_PROGRESS, or None where it has none."""
    path = IN_PROGRESS / f"{spec.name}{SUFFIX}"
    return path if spec.path.parent == specs.SPEC_DIR and path.is_file() else None


def archived_by_method(spec: specs.ExperimentSpec) -> dict[str, list[dict[str, Any]]] | None:
    """The summaries of a registered experiment's finished runs waiting in IN_PROGRESS, by the method each run's log
    dir is under (suites: runs/METHOD/SETTING/seedN, LLM studies: SETTING/METHOD/seedN), or None where it has no
    archive."""
    path = in_progress_archive(spec)
    if path is None:
        return None
    found: dict[str, list[dict[str, Any]]] = {method: [] for method in specs.run_methods(spec)}
    for member, summary in summaries_in(path, path.stat().st_mtime_ns):
        method = next((part for part in Path(member).parts if part in found), None)
        if method is not None:
            found[method].append(summary)
    return found


@functools.lru_cache(maxsize=16)
def summaries_in(path: Path, mtime_ns: int) -> tuple[tuple[str, dict[str, Any]], ...]:
    """(member path, run summary) of each run an archive holds, read once per version of the file (RESULTS.md asks
    twice per spec)."""
    with tarfile.open(path, mode="r:xz") as tar:
        members = [m for m in tar.getmembers() if m.isfile() and Path(m.name).name == "summary.json"]
        return tuple((m.name, json.load(tar.extractfile(m))) for m in members)


def archived_runs(spec: specs.ExperimentSpec) -> int | None:
    """How many finished runs of a registered experiment wait in IN_PROGRESS, or None where it has no archive."""
    path = in_progress_archive(spec)
    return None if path is None else len(summaries_in(path, path.stat().st_mtime_ns))
