"""What every command-line tool shares: one `error:` line and exit code 2 for bad input, output
paths checked before any work, atomic file writes, seed checks.

Written files get the mode a plain open() gives a new file (0o666 less the umask), and JSON is strict
(RFC 8259: no NaN or Infinity, which json.dumps writes by default and strict readers refuse): a
non-finite number is written as null, and the nearest object above it gains NON_FINITE_KEY, which maps
the number's JSON Pointer (relative to that object) to what it was ("Infinity", "-Infinity" or "NaN").

A write that finds its filesystem full (ENOSPC) or its quota used up (EDQUOT) is one `NoSpace` line naming
what was being written, like any other bad condition of an output path.

`main(run, argv)` is the only place that turns exceptions into exit codes, so the CLIs
(train, compare, plot, tune, credit_fidelity, evaluate) cannot drift apart.
"""

from __future__ import annotations

import argparse
import errno
import json
import math
import numbers
import os
import secrets
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn, Sequence

from algorithms.common.errors import Stopped, VcbmGymError
from vcbm_gym.contract import ContractError

MAX_SEED = 2**32 - 1  # numpy's SeedSequence accepts more, but SB3 and torch seeds are 32/64-bit
NON_FINITE_KEY = "non_finite"
NO_SPACE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})


class NoSpace(VcbmGymError):
    """A write found no space left on its filesystem (or no quota left)."""


def space_error(exc: BaseException | None) -> OSError | None:
    """The out-of-space OSError behind `exc`: itself, or one it was raised from or while handling."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, OSError) and exc.errno in NO_SPACE_ERRNOS:
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


def no_space(what: str | Path, exc: OSError) -> NoSpace:
    """The one line for a write to `what` (a file or a folder) that found its filesystem full."""
    reason = "disk quota exceeded" if exc.errno == errno.EDQUOT else "no space left on device"
    return NoSpace(f"cannot write {str(what)!r}: {reason}; expected free space on its filesystem (then run the command again)")


class ArgumentParser(argparse.ArgumentParser):
    """argparse's usage dump on a bad command line becomes one VcbmGymError line."""

    def error(self, message: str):  # type: ignore[override]
        raise VcbmGymError(f"{message} (see {self.prog} --help)")


def main(run: Callable[[list[str]], Any], argv: Sequence[str] | None = None) -> int:
    """Run a CLI's `run(argv)`; bad input -> one `error:` line and 2; a stop -> one line and 128 + signal."""
    try:
        run(list(sys.argv[1:] if argv is None else argv))
    except Stopped as stop:
        print(f"stopped: {stop}", file=sys.stderr)
        return stop.exit_code
    except KeyboardInterrupt:
        print("stopped: interrupted (Ctrl-C)", file=sys.stderr)
        return 130
    except (VcbmGymError, ContractError) as exc:  # ContractError: an env breaks the env contract
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


def launch_world_size() -> int:
    """Processes in this launch: WORLD_SIZE as torchrun and accelerate launch set it (1 when run directly)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def is_launch_main_process() -> bool:
    """Process 0 of this launch (RANK as torchrun sets it; a direct run is process 0): it writes the run's files."""
    return int(os.environ.get("RANK", "0")) == 0


def check_seed(seed: int, option: str = "--seed") -> int:
    if not 0 <= seed <= MAX_SEED:
        raise VcbmGymError(f"{option} {seed}: expected an integer in [0, {MAX_SEED}]")
    return seed


def check_int(value: int, option: str, lo: int, hi: int | None = None) -> int:
    if value < lo or (hi is not None and value > hi):
        expected = f">= {lo:,}" if hi is None else f"in [{lo:,}, {hi:,}]"
        raise VcbmGymError(f"{option} {value}: expected an integer {expected}")
    return value


def check_multiples(values: Sequence[int], option: str, k: int, unit: str) -> None:
    """Every value a positive multiple of `k` (a whole number of `unit`s), or one error naming the bad ones."""
    bad = [n for n in values if n < k or n % k]
    if bad:
        raise VcbmGymError(f"{option} {' '.join(map(str, bad))}: expected multiples of {k} ({unit})")


def output_dir(path: str | Path, option: str) -> Path:
    """Create `path` (and parents) and prove it writable, before any work that would be lost."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise VcbmGymError(f"{option} {str(path)!r} is a file: expected a directory (new or existing)")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        _unwritable(path, option, exc)
    _probe_write(path, path, option)
    return path


def check_output_file(path: str | Path, option: str) -> Path:
    """A file path whose folder exists (the file itself is written later, atomically)."""
    path = Path(path)
    if path.is_dir() or not path.parent.is_dir():
        raise VcbmGymError(f"{option} {path}: expected a file path in an existing folder")
    return path


def check_output_dir(path: str | Path, option: str) -> Path:
    """Prove that `path` could be created and written, without creating it: a command that then refuses
    its input leaves no empty directory behind. `output_dir` creates it when there is something to write."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise VcbmGymError(f"{option} {str(path)!r} is a file: expected a directory (new or existing)")
    existing = path.absolute()
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise VcbmGymError(f"{option} {str(path)!r} lies under the file {str(existing)!r}: expected a directory path")
    _probe_write(existing, path, option)
    return path


def _unwritable(path: Path, option: str, exc: OSError) -> NoReturn:
    raise VcbmGymError(
        f"{option} {str(path)!r} cannot be written ({exc.strerror or exc}): expected a writable directory"
    ) from None


def _probe_write(directory: Path, path: Path, option: str) -> None:
    """A real write in `directory` (removed at once): os.access says yes to root even on a read-only mount."""
    try:
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".write-test-"):
            pass
    except OSError as exc:
        _unwritable(path, option, exc)


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write to a temporary name beside `path`, then rename: readers see the old file or the new, never half."""
    path = Path(path)
    try:
        fd, tmp = _new_file_beside(path)
    except OSError as exc:
        if exc.errno in NO_SPACE_ERRNOS:  # not even an inode left for the temporary file
            raise no_space(path, exc) from None
        raise
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError) and exc.errno in NO_SPACE_ERRNOS:
            raise no_space(path, exc) from None
        raise


def _new_file_beside(path: Path) -> tuple[int, Path]:
    """A new file with a fresh name beside `path`, created with mode 0o666 as open() creates one, so that the
    umask (and a default ACL) apply: tempfile.mkstemp's 0o600 would hide results from the rest of a group."""
    while True:
        tmp = path.parent / f".{path.name}.{secrets.token_hex(8)}.tmp"
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666), tmp
        except FileExistsError:  # another writer drew the same name: draw again
            continue


JSON_INDENT = 2  # the outputs' default layout: readable and diffable


def atomic_write_json(path: str | Path, data: Any, indent: int | None = JSON_INDENT) -> None:
    atomic_write_text(path, json_text(data, indent))


def json_text(data: Any, indent: int | None = JSON_INDENT) -> str:
    """`data` as strict JSON (see the module docstring for non-finite numbers); objects JSON has no type for
    are written as their str(). `indent=None`: one line, for outputs of many numbers."""
    return json.dumps(_strict(data)[0], indent=indent, default=str, allow_nan=False)


def _strict(value: Any) -> tuple[Any, dict[str, str]]:
    """(`value` with its non-finite numbers as null, {JSON Pointer relative to `value`: what it was} for those
    that no object inside `value` has recorded yet). A non-finite number in a top-level array has no object to
    record it: it is only null."""
    if isinstance(value, dict):
        clean, found = {}, {}
        for key, item in value.items():
            clean[key], inner = _strict(item)
            found.update({f"/{_escape(key)}{pointer}": what for pointer, what in inner.items()})
        if found:
            earlier = clean.get(NON_FINITE_KEY)  # a record read back and written again keeps its entries
            clean[NON_FINITE_KEY] = {**(earlier if isinstance(earlier, dict) else {}), **found}
        return clean, {}
    if isinstance(value, (list, tuple)):
        items, found = [], {}
        for index, item in enumerate(value):
            clean, inner = _strict(item)
            items.append(clean)
            found.update({f"/{index}{pointer}": what for pointer, what in inner.items()})
        return items, found
    if isinstance(value, numbers.Real) and not isinstance(value, numbers.Integral) and not math.isfinite(value):
        return None, {"": "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")}
    return value, {}


def _escape(key: Any) -> str:
    """A key as a JSON Pointer reference token (RFC 6901: ~ and / escaped)."""
    return str(key).replace("~", "~0").replace("/", "~1")


def read_json_object(path: str | Path, what: str) -> dict[str, Any]:
    """A JSON file that must hold an object; binary, truncated or non-object content is one clear error."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise VcbmGymError(f"{what} {str(path)!r} is not readable JSON ({type(exc).__name__}): expected a JSON object") from None
    if not isinstance(data, dict) or not data:
        raise VcbmGymError(f"{what} {str(path)!r} holds {json.dumps(data)[:40]}: expected a non-empty JSON object")
    return data
