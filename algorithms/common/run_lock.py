"""One command at a time in an output directory: an exclusive fcntl lock on a file inside it.

The kernel releases the lock when its holder dies, even by SIGKILL, so there is no stale lock to clear by hand.
The holder writes its pid and command into the file once it holds the lock; a command refused because the lock is
held reads them back to name the holder, and changes nothing (the file is opened for appending, never written).
compare and suite hold DIR/.compare.lock (algorithms.experiment.results.locked); a run of algorithms.train holds
<log-dir>/.train.lock for the whole run and removes it as it lets go, so that a finished run's folder (or one a
refused command looked at) holds no lock file.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Callable, Iterator
from pathlib import Path


@contextlib.contextmanager
def held(path: str | Path, command: str, refusal: Callable[[str, str], Exception], remove: bool = False) -> Iterator[None]:
    """Hold the lock file `path` (created if missing) for `command` while inside; `remove`: delete it on the way out.
    If another process holds it, raise `refusal(pid, command)` with what that holder wrote ("?" and "" where it
    wrote nothing yet)."""
    path = Path(path)
    while True:
        handle = open(path, "a+")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            written = handle.read(200).strip().splitlines()  # "<pid> <command>", unless the file was edited
            handle.close()
            pid, _, holder = (written[0] if written else "").partition(" ")
            raise refusal(pid or "?", holder) from None
        except BaseException:
            handle.close()
            raise
        # a holder that removes the file as it lets go may have done so between our open and our lock: a lock on
        # a removed file excludes nobody, so lock the file that is there now
        try:
            mine, there = os.fstat(handle.fileno()), os.stat(path)
            if (mine.st_dev, mine.st_ino) == (there.st_dev, there.st_ino):
                break
        except FileNotFoundError:
            pass
        handle.close()
    try:
        handle.truncate(0)
        handle.write(f"{os.getpid()} {command}\n")
        handle.flush()
        yield
    finally:
        try:
            if remove:
                path.unlink(missing_ok=True)
        finally:
            handle.close()
