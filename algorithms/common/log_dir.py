"""A run's log dir: what a run writes there, the policy for one that already holds a run (--resume, --overwrite),
the lock a run holds on it, and the undoing of a folder that a failed run created.

A run holds an exclusive lock on its log dir (`<log-dir>/.train.lock`, algorithms.common.run_lock, removed
as it lets go) from before it looks at the folder until it ends: a second train, --resume or --overwrite on it is
one line naming the pid that holds it. `--overwrite`, and `--resume` when it reruns a run, delete only what a run
writes (RUN_FILES, RUN_FOLDERS and TensorBoard event files) and keep every other file, such as a user's notes. A
log dir that is a symbolic link is the folder it points to (its files are replaced there, the link stays). A full
disk is one line, and a log dir that this command created and that holds nothing to resume from is removed again.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml

from algorithms.common import cli, run_lock
from algorithms.common.credit_slot import rule_change
from algorithms.common.errors import VcbmGymError
from algorithms.common.spec import RunOptions, RunSpec, canonical_json


def config_diff(old: dict[str, Any], new: dict[str, Any], limit: int = 3) -> str:
    """'max_episodes 60 -> 70, ...': the first differing settings of two identities."""
    flat_old = {**{k: v for k, v in old.items() if k != "hyperparams"}, **(old.get("hyperparams") or {})}
    flat_new = {**{k: v for k, v in new.items() if k != "hyperparams"}, **(new.get("hyperparams") or {})}
    keys = [k for k in sorted(set(flat_old) | set(flat_new)) if flat_old.get(k, "<unset>") != flat_new.get(k, "<unset>")]
    parts = [f"{k} {flat_old.get(k, '<unset>')!r} -> {flat_new.get(k, '<unset>')!r}" for k in keys[:limit]]
    return ", ".join(parts) + (f" and {len(keys) - limit} more" if len(keys) > limit else "") or "no setting (hash only)"


def read_record(log_dir: Path) -> dict[str, Any] | None:
    """The config.yml of the run in log_dir, or None if there is none (or it cannot be read)."""
    try:
        record = yaml.safe_load((log_dir / "config.yml").read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None
    return record if isinstance(record, dict) and "config_hash" in record else None


def summary_checksum(summary: dict[str, Any]) -> str:
    return hashlib.sha256(canonical_json({k: v for k, v in summary.items() if k != "checksum"}).encode()).hexdigest()


def read_intact_summary(path: Path) -> tuple[dict[str, Any] | None, str]:
    """(summary, "") if the summary.json at `path` reads and its checksum holds, else (None, why not)."""
    try:
        summary = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return None, "its summary.json is unreadable"
    if not isinstance(summary, dict) or summary.get("checksum") != summary_checksum(summary):
        return None, "its summary.json was changed after the run wrote it"
    return summary, ""


def finished_summary(log_dir: Path, run: RunSpec) -> tuple[dict[str, Any] | None, str]:
    """(summary, "") if log_dir holds a finished run of exactly this config, else (None, why not)."""
    log_dir = Path(log_dir)
    path = log_dir / "summary.json"
    if not path.is_file():
        return None, "unfinished" if (log_dir / "config.yml").is_file() else "new"
    summary, why_not = read_intact_summary(path)
    if summary is None:
        return None, why_not
    if summary.get("config_hash") != run.config_hash:
        record = read_record(log_dir)
        if record is not None and record["config_hash"] == summary.get("config_hash"):
            recorded = {k: record.get(k) for k in ("algo", "env", "seed", "hyperparams")}
            return None, f"its config differs ({config_diff(recorded, run.identity())})"
        return None, "its config differs"
    changed = rule_change(read_record(log_dir), run.config)  # the same name, another rule: not this run's result
    if changed is not None:
        return None, f"its {changed}"
    return summary, ""


LOCK_FILE = ".train.lock"
# What the arms write into a log dir, and so all that --overwrite (or --resume, when it reruns) deletes: config.yml
# and summary.json (here), history.json, loop_config.yml, checkpoints/ and model/ or adapter/ (the LLM arm),
# evaluations.npz (SB3's EvalCallback), env_log/ (an env's own log), TensorBoard event files (at the top, and in
# SB3's <algo>_<credit>_<n>/ folders), and the temporary files of atomic writes and write probes
RUN_FILES = frozenset({"config.yml", "summary.json", "history.json", "loop_config.yml", "evaluations.npz"})
RUN_FOLDERS = frozenset({"checkpoints", "model", "adapter", "env_log"})
EVENT_FILE = "events.out.tfevents."
_TEMPORARY = re.compile(r"\.(?:" + "|".join(map(re.escape, sorted(RUN_FILES))) + r")\.[0-9a-f]{16}\.tmp|\.write-test-.+")
_UNWRITABLE = (errno.EROFS, errno.EACCES, errno.EPERM)


def run_entries(folder: Path, top: bool = True) -> tuple[list[Path], list[Path]]:
    """(what a run wrote in `folder`, everything else), the lock file in neither. Below the top only TensorBoard
    event files are a run's: a folder of nothing else is the run's as a whole, any other is kept (its event files
    are the run's). A symbolic link is never the run's (no arm writes one), nor followed."""
    own: list[Path] = []
    other: list[Path] = []
    for entry in sorted(folder.iterdir()):
        name = entry.name
        if entry.is_symlink():
            other.append(entry)
        elif entry.is_dir():
            if top and name in RUN_FOLDERS:
                own.append(entry)
                continue
            inner_own, inner_other = run_entries(entry, top=False)
            if inner_own and not inner_other:
                own.append(entry)
            else:
                own += inner_own
                other.append(entry)
        elif name.startswith(EVENT_FILE) or (top and (name in RUN_FILES or _TEMPORARY.fullmatch(name))):
            own.append(entry)
        elif not (top and name == LOCK_FILE):
            other.append(entry)
    return own, other


def _holds_anything(log_dir: Path) -> bool:
    return any(entry.name != LOCK_FILE for entry in log_dir.iterdir())


def remove_run_files(log_dir: Path, option: str) -> list[Path]:
    """Delete what a run wrote in log_dir (see RUN_FILES) and nothing else; returns what was kept. A symbolic link
    where a run writes a file or folder is refused before anything is deleted: a run writes none, and deleting
    through it or the link itself would surprise whoever made it."""
    own, other = run_entries(log_dir)
    for entry in other:
        if entry.is_symlink() and entry.parent == log_dir and entry.name in RUN_FILES | RUN_FOLDERS:
            raise VcbmGymError(
                f"{option}: {str(entry)!r} is a symbolic link where a run writes its {entry.name}; refusing to delete "
                "through it or the link; expected the run's own file or folder there (move the link away first)"
            )
    for entry in own:
        if entry.is_dir():
            shutil.rmtree(entry)
        else:
            entry.unlink(missing_ok=True)
    return other


def _kept(log_dir: Path, kept: list[Path]) -> str:
    names = [str(path.relative_to(log_dir)) for path in kept]
    more = f" and {len(names) - 3} more" if len(names) > 3 else ""
    return f"kept what no run writes: {', '.join(names[:3])}{more}" if names else ""


def prepare_log_dir(log_dir: Path, run: RunSpec, options: RunOptions, resumes_itself: bool) -> dict[str, Any] | None:
    """Apply the existing-log-dir policy; returns the summary when --resume finds the run already finished.
    Replacing a run deletes only what a run writes (remove_run_files); the caller holds the log dir's lock."""
    if log_dir.exists() and not log_dir.is_dir():
        raise VcbmGymError(f"--log-dir {str(log_dir)!r} is a file: expected a directory")
    resume = options.resume
    if resume and options.overwrite:
        raise VcbmGymError("--resume and --overwrite: expected at most one of them")
    if log_dir.is_dir() and _holds_anything(log_dir):
        record = read_record(log_dir)
        # a config.yml that cannot be read (truncated, edited, binary) still marks the directory as a run's
        corrupt = record is None and (log_dir / "config.yml").is_file()
        if options.overwrite:
            if record is None and not corrupt:
                raise VcbmGymError(
                    f"--overwrite: {str(log_dir)!r} holds no config.yml of a run; refusing to delete "
                    "what may not be a log dir; expected a run's log dir"
                )
            kept = remove_run_files(log_dir, "--overwrite")
            if kept:
                print(f"--overwrite: {str(log_dir)!r}: replacing the run; {_kept(log_dir, kept)}", file=sys.stderr)
        elif corrupt:
            raise VcbmGymError(
                f"{'--resume: ' if resume else ''}--log-dir {str(log_dir)!r} holds a run whose config.yml is unreadable; "
                "expected --overwrite to replace that run"
            )
        elif resume:
            if record is None:
                raise VcbmGymError(f"--resume: {str(log_dir)!r} holds no config.yml of a run; expected a run's log dir")
            if record["config_hash"] != run.config_hash:
                recorded = {k: record.get(k) for k in ("algo", "env", "seed", "hyperparams")}
                raise VcbmGymError(
                    f"--resume: {str(log_dir)!r} holds a run of another config ({config_diff(recorded, run.identity())}); "
                    "expected the same config, or --overwrite"
                )
            if (changed := rule_change(record, run.config)) is not None:
                raise VcbmGymError(f"--resume: {str(log_dir)!r} holds a run whose {changed}; expected --overwrite")
            if not resumes_itself:
                summary, why = finished_summary(log_dir, run)
                if summary is not None:
                    return summary
                if why == "unfinished":  # tabular and SB3 runs keep no checkpoints: an unfinished one starts again
                    why = "the run did not finish, and this algo keeps no checkpoints"
                kept = _kept(log_dir, remove_run_files(log_dir, "--resume"))
                print(f"--resume: {str(log_dir)!r}: {why}; rerunning the run{'; ' + kept if kept else ''}", file=sys.stderr)
        else:
            raise VcbmGymError(
                f"--log-dir {str(log_dir)!r} already holds a run: expected a new or empty directory, "
                "or --resume (same config) or --overwrite"
            )
    cli.output_dir(log_dir, "--log-dir")
    return None


def _first_missing(path: Path) -> Path | None:
    """The topmost folder of `path` (itself or an ancestor) that does not exist yet: what creating it creates."""
    missing = None
    for folder in (path.absolute(), *path.absolute().parents):
        if folder.exists() or folder.is_symlink():
            break
        missing = folder
    return missing


@contextlib.contextmanager
def claimed_log_dir(log_dir: Path, has_checkpoint: Callable[[Path], bool]) -> Iterator[None]:
    """Create log_dir if need be and hold its lock (LOCK_FILE) while inside: another run, --resume or --overwrite on
    it is refused in one line, and the kernel releases the lock when this process dies. A folder that this created
    is removed again if the run fails and leaves nothing in it, or fails for lack of space before anything it
    could resume from (summary.json, a complete checkpoint: `has_checkpoint(log_dir)`) was written."""
    if log_dir.is_symlink() and not log_dir.exists():
        raise VcbmGymError(
            f"--log-dir {str(log_dir)!r} is a symbolic link to {os.readlink(log_dir)!r}, which does not exist: "
            "expected a link to an existing directory, or a path that is not a link"
        )
    if log_dir.exists() and not log_dir.is_dir():
        raise VcbmGymError(f"--log-dir {str(log_dir)!r} is a file: expected a directory")
    made = _first_missing(log_dir)
    with contextlib.ExitStack() as lock:
        try:
            with out_of_space_is_one_line(log_dir):
                if made is not None:
                    cli.output_dir(log_dir, "--log-dir")
                try:
                    lock.enter_context(run_lock.held(log_dir / LOCK_FILE, "train", _in_use(log_dir), remove=True))
                except OSError as exc:
                    if exc.errno not in _UNWRITABLE:
                        raise
                    # nothing can be written in log_dir: a finished run is reported, anything else refused (output_dir)
            yield
        except BaseException as exc:
            if made is not None:
                _remove_unused(log_dir, made, exc, has_checkpoint)
            raise


def _in_use(log_dir: Path) -> Callable[[str, str], Exception]:
    return lambda pid, holder: VcbmGymError(
        f"--log-dir {str(log_dir)!r} is in use by a running {holder or 'train'} (pid {pid}); expected one run per "
        "log dir: wait for it to end, or choose another --log-dir"
    )


def _remove_unused(log_dir: Path, made: Path, exc: BaseException, has_checkpoint: Callable[[Path], bool]) -> None:
    """Undo the creation of log_dir (and the folders above it up to `made`) by a run that failed (see claimed_log_dir)."""
    try:
        out_of_space = isinstance(exc, cli.NoSpace) or cli.space_error(exc) is not None
        resumable = (log_dir / "summary.json").is_file() or has_checkpoint(log_dir)
        if out_of_space and not resumable and log_dir.is_dir():
            remove_run_files(log_dir, "--log-dir")
            for folder in sorted(log_dir.rglob("*"), key=lambda path: -len(path.parts)):  # a logger's folders, empty
                if folder.is_dir() and not folder.is_symlink() and not any(folder.iterdir()):
                    folder.rmdir()
        if log_dir.is_dir():
            if _holds_anything(log_dir):
                return
            (log_dir / LOCK_FILE).unlink(missing_ok=True)
        for folder in (log_dir.absolute(), *log_dir.absolute().parents):
            if folder.is_dir():
                folder.rmdir()
            if folder == made:
                return
    except (OSError, VcbmGymError):
        pass  # the run's own error is the one to report


@contextlib.contextmanager
def out_of_space_is_one_line(log_dir: Path) -> Iterator[None]:
    """A full disk anywhere in a run (config.yml, events, checkpoints, summary.json) -> one NoSpace line."""
    try:
        yield
    except cli.NoSpace:
        raise
    except Exception as exc:
        found = cli.space_error(exc)
        if found is None and filesystem_full(log_dir):
            # torch's file writer reports a full disk as a RuntimeError without the errno ("iostream error")
            found = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        if found is None:
            raise
        raise cli.no_space(log_dir, found) from None


def filesystem_full(log_dir: Path) -> bool:
    try:
        stats = os.statvfs(log_dir)
    except OSError:
        return False
    return stats.f_bavail * stats.f_frsize < 2**20
