"""`python -m algorithms.train --algo ALGO --env ENV_ID [...]`: train one run, log it, summarise it.

Hyperparameters come from `zoo_configs/<algo>.yml[env_id]`, then `--config FILE` (flat, keyed by
env id, or the config.yml of an earlier run), then `--hyperparams key=value ...`, then the arm's
flags (`--max-episodes`, `--credit`); the algo's arm (`algorithms.registry.get_arm`, an
`algorithms.common.spec.Arm`) resolves them once into a frozen `RunSpec` (the plain values and the
arm's typed config) before anything runs, and `Arm.validate` builds the run's objects dry (SB3's
model, the LLM config and model path) before the log dir is touched: a refused command leaves
nothing on disk. Every run writes into its log dir: `config.yml` (that config,
its hash, the package versions and the git commit), TensorBoard events and `summary.json` (with the
config hash and a checksum). Both files are written to a temporary name and renamed. An existing
log dir is refused unless `--resume` or `--overwrite` is given.

A run holds an exclusive lock on its log dir (`<log-dir>/.train.lock`, algorithms.common.run_lock, removed
as it lets go) from before it looks at the folder until it ends: a second train, --resume or --overwrite on it is
one line naming the pid that holds it. `--overwrite`, and `--resume` when it reruns a run, delete only what a run
writes (RUN_FILES, RUN_FOLDERS and TensorBoard event files) and keep every other file, such as a user's notes. A
log dir that is a symbolic link is the folder it points to (its files are replaced there, the link stays). A full
disk is one line, and a log dir that this command created and that holds nothing to resume from is removed again.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import hashlib
import importlib
import json
import os
import re
import shutil
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Mapping, Sequence

import gymnasium as gym
import yaml

import vcbm_gym
from algorithms.common import cli, provenance, run_lock
from algorithms.common.config import parse_overrides, user_config, zoo_hyperparams
from algorithms.common.credit_slot import credit_record, rule_change
from algorithms.common.errors import VcbmGymError
from algorithms.common.extras import env_extra, require_extra
from algorithms.common.spec import Arm, Report, RunOptions, RunSpec, canonical_json
from algorithms.llm.checkpoints import COMPLETE_MARKER
from algorithms.registry import ALGOS, canonical_algo, get_arm
from envs.bsuite import env_id_problem


def build_parser() -> argparse.ArgumentParser:
    parser = cli.ArgumentParser(prog="python -m algorithms.train", description=__doc__.splitlines()[0])
    parser.add_argument("--algo", required=True, help=f"one of: {', '.join(ALGOS)}")
    parser.add_argument(
        "--env",
        default="WatchRepair-v0",
        help=f"a registered env id or module:id (the module registers it), e.g. {', '.join(vcbm_gym.ENV_IDS)}",
    )
    parser.add_argument("--seed", type=int, default=0, help=f"in [0, {cli.MAX_SEED}]")
    parser.add_argument("--log-dir", default=None, help="default: runs/<algo>/<env>/seed<seed>")
    parser.add_argument(
        "--config", default=None, help="YAML file of hyperparameters (flat, keyed by env id, or a run's config.yml)"
    )
    parser.add_argument("--hyperparams", nargs="*", action="extend", default=[], metavar="KEY=VALUE")
    parser.add_argument("--max-episodes", type=int, default=None, help="episode cap (tabular and SB3 runs)")
    parser.add_argument("--overwrite", action="store_true", help="replace the run already in --log-dir")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    return parser


def _looks_like_a_path(text: str) -> bool:
    """A file path where a module or env id was expected: "./envs.py", "/tmp/x", "~/x", "a/b/c", "C:\\x"."""
    return (
        text.startswith((".", "/", "~", "\\"))
        or "\\" in text
        or text.count("/") > 1
        or text.endswith((".py", "/"))
        or "/." in text
    )


def check_env_id(env_id: str) -> None:
    """A registered id, or Gymnasium's "module:EnvId" (the module is imported first: it registers the env), whose
    optional extra (bsuite, mujoco) is installed.

    A module that fails to import, for whatever reason (a SyntaxError, a RuntimeError raised at import,
    a sys.exit), and an id that is a file path are one line each: the module's own code is not ours."""
    module, _, name = env_id.rpartition(":")
    expected_ids = ", ".join(vcbm_gym.ENV_IDS + vcbm_gym.DELAYED_ENV_IDS)
    # `bsuite:` names a setting that vcbm_gym registers itself: never a module to import (without the bsuite
    # extra that import would fail, and a bsuite.py in the working directory would run)
    if module and module != "bsuite":
        if _looks_like_a_path(module):
            raise VcbmGymError(
                f"--env {env_id!r}: {module!r} is not a module name; expected module:EnvId with an importable "
                "module (dotted name, e.g. mypackage.envs:MyEnv-v0), not a file path"
            )
        try:
            importlib.import_module(module)
        except (Exception, SystemExit) as exc:  # noqa: BLE001 (any failure of someone else's module is one line)
            first = str(exc).strip().splitlines()
            detail = f"{type(exc).__name__}: {first[0]}" if first else type(exc).__name__
            raise VcbmGymError(
                f"--env {env_id!r}: module {module!r} cannot be imported ({detail}); "
                "expected an importable module that registers the env"
            ) from None
    if module == "bsuite" and env_id_problem(env_id) is not None:  # bsuite:<not a setting>, even a registered id
        raise VcbmGymError(env_id_problem(env_id))
    if name not in gym.registry:
        if _looks_like_a_path(name):
            raise VcbmGymError(
                f"--env {env_id!r} looks like a file path; expected a registered Gymnasium id (or module:id) such as: "
                f"{expected_ids}"
            )
        problem = env_id_problem(env_id)  # a bsuite id off its experiment's sweep: name the valid settings
        if problem is not None:
            raise VcbmGymError(problem)
        raise VcbmGymError(
            f"unknown env id {env_id!r}; expected a registered Gymnasium id (or module:id) such as: {expected_ids}"
        )
    extra = env_extra(env_id)
    if extra is not None:
        require_extra(f"--env {env_id}", extra)


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


def finished_summary(log_dir: Path, run: RunSpec) -> tuple[dict[str, Any] | None, str]:
    """(summary, "") if log_dir holds a finished run of exactly this config, else (None, why not)."""
    log_dir = Path(log_dir)
    path = log_dir / "summary.json"
    if not path.is_file():
        return None, "unfinished" if (log_dir / "config.yml").is_file() else "new"
    try:
        summary = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError):
        return None, "its summary.json is unreadable"
    if not isinstance(summary, dict) or summary.get("checksum") != summary_checksum(summary):
        return None, "its summary.json was changed after the run wrote it"
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


def parse(argv: Sequence[str]) -> tuple[argparse.Namespace, Arm]:
    """The command line and the arm that trains its algo. The arm's flags (--credit among them) are added before
    anything is parsed with help on, so that `--algo ALGO --help` lists them; without --algo, help says where."""
    first = cli.ArgumentParser(add_help=False)
    first.add_argument("--algo", default=None)
    try:
        known, _ = first.parse_known_args(argv)
    except VcbmGymError:  # a malformed --algo: the full parser below says so in its one line
        known = argparse.Namespace(algo=None)
    parser = build_parser()
    parser.add_argument("--resume", action="store_true", help="continue the run in --log-dir (same config only)")
    arm = None
    if known.algo is not None and canonical_algo(known.algo) in ALGOS:
        arm = get_arm(known.algo)
        arm.add_arguments(parser)
    else:
        parser.epilog = "--credit RULE and the flags of an algo's arm: python -m algorithms.train --algo ALGO --help"
    args = parser.parse_args(argv)
    return args, arm if arm is not None else get_arm(args.algo)


def resolve_spec(
    algo: str, env: str, seed: int, overrides: Mapping[str, Any] | None = None, config_file: str | None = None
) -> RunSpec:
    """The run of `algo` on `env`: zoo YAML, then `config_file`, then `overrides` (already parsed values),
    resolved and checked by the arm. compare, tune and suite build their runs with this, in memory."""
    cli.check_seed(seed)
    check_env_id(env)
    algo = canonical_algo(algo)
    arm = get_arm(algo)
    mapping = zoo_hyperparams(algo, env)
    if config_file:
        mapping.update(user_config(config_file, env, gym.registry.keys(), algo=algo))
    mapping.update(overrides or {})
    return arm.resolve(algo, env, seed, mapping)


def resolve(args: argparse.Namespace, arm: Arm) -> RunSpec:
    """Fold --hyperparams (parsed here, the one time a command line's are) and the arm's flags into one run."""
    overrides = parse_overrides(args.hyperparams)
    if args.max_episodes is not None:
        overrides["max_episodes"] = args.max_episodes
    overrides.update(arm.flag_hyperparams(args))
    return resolve_spec(args.algo, args.env, args.seed, overrides, args.config)


def resolve_argv(argv: Sequence[str]) -> RunSpec:
    """The run a train command line describes, without running it (benchmarks that keep their runs as
    command lines key reuse on it; compare, tune and suite build RunSpecs in memory with resolve_spec)."""
    args, arm = parse(list(argv))
    return resolve(args, arm)


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


def _run_entries(folder: Path, top: bool = True) -> tuple[list[Path], list[Path]]:
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
            inner_own, inner_other = _run_entries(entry, top=False)
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
    own, other = _run_entries(log_dir)
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
def claimed_log_dir(log_dir: Path) -> Iterator[None]:
    """Create log_dir if need be and hold its lock (LOCK_FILE) while inside: another run, --resume or --overwrite on
    it is refused in one line, and the kernel releases the lock when this process dies. A folder that this created
    is removed again if the run fails and leaves nothing in it, or fails for lack of space before anything it
    could resume from (summary.json, a complete checkpoint) was written."""
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
            with _out_of_space_is_one_line(log_dir):
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
                _remove_unused(log_dir, made, exc)
            raise


def _in_use(log_dir: Path) -> Callable[[str, str], Exception]:
    return lambda pid, holder: VcbmGymError(
        f"--log-dir {str(log_dir)!r} is in use by a running {holder or 'train'} (pid {pid}); expected one run per "
        "log dir: wait for it to end, or choose another --log-dir"
    )


def _remove_unused(log_dir: Path, made: Path, exc: BaseException) -> None:
    """Undo the creation of log_dir (and the folders above it up to `made`) by a run that failed (see claimed_log_dir)."""
    try:
        out_of_space = isinstance(exc, cli.NoSpace) or cli.space_error(exc) is not None
        resumable = (log_dir / "summary.json").is_file() or any((log_dir / "checkpoints").glob(f"checkpoint-*/{COMPLETE_MARKER}"))
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
def _out_of_space_is_one_line(log_dir: Path) -> Iterator[None]:
    """A full disk anywhere in a run (config.yml, events, checkpoints, summary.json) -> one NoSpace line."""
    try:
        yield
    except cli.NoSpace:
        raise
    except Exception as exc:
        found = cli.space_error(exc)
        if found is None and _filesystem_full(log_dir):
            # torch's file writer reports a full disk as a RuntimeError without the errno ("iostream error")
            found = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        if found is None:
            raise
        raise cli.no_space(log_dir, found) from None


def _filesystem_full(log_dir: Path) -> bool:
    try:
        stats = os.statvfs(log_dir)
    except OSError:
        return False
    return stats.f_bavail * stats.f_frsize < 2**20


@contextlib.contextmanager
def _quiet_writer_threads() -> Iterator[None]:
    """TensorBoard's writer thread keeps a failed write for the run's own thread to raise at its next write, flush
    or close, and raises it in its own thread too, where Python prints its traceback: for lack of space that second
    report is dropped (the run's error is the one line)."""
    previous = threading.excepthook

    def hook(args: threading.ExceptHookArgs) -> None:
        if cli.space_error(args.exc_value) is None:
            previous(args)

    threading.excepthook = hook
    try:
        yield
    finally:
        threading.excepthook = previous


def _on_main_process_first(action: Callable[[], Any]) -> Any:
    """Run `action` on process 0 only and hand its result, or its error, to every process.

    Several processes of one run share its log dir: if each applied the log-dir policy itself, the
    first to write config.yml would make the others refuse the directory as "already holds a run".
    """
    import torch
    from accelerate import PartialState
    from accelerate.utils import broadcast_object_list

    state = PartialState(cpu=not torch.cuda.is_available())
    outcome: list[Any] = [None]
    if state.is_main_process:
        try:
            outcome = [("ok", action())]
        except VcbmGymError as error:
            outcome = [("error", str(error))]
        except Exception as error:
            # the peers wait in the broadcast: they stop with one line, process 0 shows the traceback
            broadcast_object_list([("error", f"process 0 failed to prepare the log dir ({type(error).__name__})")], 0)
            raise
    broadcast_object_list(outcome, from_process=0)
    kind, value = outcome[0]
    if kind == "error":
        raise VcbmGymError(value)
    return value


def execute(spec: RunSpec, log_dir: str | Path, options: RunOptions | None = None) -> dict[str, Any]:
    """Train `spec` into `log_dir` and return the summary (also written to summary.json).

    Under a multi-process launch (torchrun, accelerate launch: WORLD_SIZE > 1) every process runs this;
    process 0 alone applies the log-dir policy and writes config.yml and summary.json. Only arms that
    declare `multi_process` (the LLM arm) accept such a launch.
    """
    arm, log_dir, options = get_arm(spec.algo), Path(log_dir), options or RunOptions()
    world_size = cli.launch_world_size()
    if world_size > 1 and not arm.multi_process:
        raise VcbmGymError(
            f"--algo {spec.algo!r} runs in one process, but this launch has WORLD_SIZE={world_size}; "
            "expected a plain `python -m algorithms.train` (only the LLM algorithms train on several processes)"
        )
    record = {**spec.identity(), "config_hash": spec.config_hash, **provenance.environment_record(), **options.record}
    record.update(credit_record(spec.config))  # the rule's name and the distribution it came from, for a rerun
    # the run's objects (SB3 model, LLM config and model path), built dry before the log dir exists:
    # input they refuse leaves nothing on disk, and the corrected command is not refused as a rerun
    arm.validate(spec)
    if options.resume:
        arm.check_resume(spec, str(log_dir))

    with contextlib.ExitStack() as held:

        def prepare() -> dict[str, Any] | None:
            held.enter_context(claimed_log_dir(log_dir))  # for the whole run, on process 0 of a launch
            with _out_of_space_is_one_line(log_dir):
                finished = prepare_log_dir(log_dir, spec, options, arm.resumes_itself)
                if finished is None:
                    cli.atomic_write_text(log_dir / "config.yml", yaml.safe_dump(record, sort_keys=False))
            return finished

        finished = prepare() if world_size == 1 else _on_main_process_first(prepare)
        if finished is not None:
            print(f"{log_dir}: this run already finished (same config); nothing to do", file=sys.stderr)
            return finished

        with _quiet_writer_threads(), _out_of_space_is_one_line(log_dir):
            start = time.perf_counter()
            result = arm.run(spec, str(log_dir), options)
            summary = {"algo": spec.algo, "env": spec.env, "seed": spec.seed, **result}
            summary["wall_time_s"] = time.perf_counter() - start
            summary["log_dir"] = str(log_dir)
            summary["config_hash"] = record["config_hash"]
            summary = json.loads(cli.json_text(summary))  # as a reader will see it (strict JSON); key order kept (roles)
            summary["checksum"] = summary_checksum(summary)
            if cli.is_launch_main_process():
                cli.atomic_write_json(log_dir / "summary.json", summary)
        return summary


def run(argv: Sequence[str] | None = None, report: Report | None = None) -> dict[str, Any]:
    """Parse a command line, train, and return the summary. `report`, if given, receives the run's progress."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args, arm = parse(argv)
    spec = resolve(args, arm)
    log_dir = Path(args.log_dir or Path("runs") / args.algo / args.env / f"seed{args.seed}")
    options = RunOptions(
        progress=not args.no_progress,
        resume=args.resume,
        overwrite=args.overwrite,
        report=report,
        record={"command_line": dict(vars(args)), "argv": argv},
    )
    return execute(spec, log_dir, options)


def _leave_launch_together() -> None:
    """Under a multi-process launch: wait for every process, then close the process group. A process that
    exits while its peers still use the group can abort in gloo's teardown (SIGABRT, "terminate called
    without an active exception"), and torchrun then reports a finished run as failed."""
    torch = sys.modules.get("torch")  # a tabular run never imports it
    if cli.launch_world_size() > 1 and torch is not None and torch.distributed.is_initialized():
        torch.distributed.barrier()
        if "vllm" in sys.modules:  # vLLM's groups first, else its exit handler finds them gone with the world group
            from vllm.distributed.parallel_state import destroy_distributed_environment, destroy_model_parallel

            destroy_model_parallel()
            destroy_distributed_environment()  # vLLM's world group, then the process group
        else:
            torch.distributed.destroy_process_group()


def _main(argv: list[str]) -> None:
    _report(run(argv))
    _leave_launch_together()  # not after an error: the peers may be inside another collective


def _report(summary: dict[str, Any]) -> None:
    if not cli.is_launch_main_process():
        return  # under torchrun every process returns the same run summary; one report is enough
    skip = {"algo", "env", "seed", "log_dir", "config_hash", "checksum"}
    brief = {
        k: v for k, v in summary.items() if k not in skip and (k == "roles" or isinstance(v, (bool, int, float, str, type(None))))
    }
    tensorboard = f"TensorBoard logs: {summary['log_dir']}  (view with: tensorboard --logdir {summary['log_dir']})"
    # one write, flushed: other processes of a launch share this stdout, and two writes could interleave
    sys.stdout.flush()
    sys.stdout.write(f"{json.dumps(brief)}\n{tensorboard}\n")
    sys.stdout.flush()


def main(argv: Sequence[str] | None = None) -> int:
    return cli.main(_main, argv)


if __name__ == "__main__":
    sys.exit(main())
