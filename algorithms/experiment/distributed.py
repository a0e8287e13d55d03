"""Ray for the executor's `ray` backend (algorithms.experiment.executor): `compare --backend ray [--address ADDR]`,
`tune --backend ray`. The executor schedules the tasks; here are the Ray session and the packing of log dirs.

Ray is an optional extra (`pip install -e ".[distributed]"`); without it these backends are one clear error.
With no address a local Ray instance is started for the command (`--workers` CPUs) and stopped after it;
with `--address` (e.g. `auto` on a node of a cluster started with `ray start`, `HOST:PORT` of its head, or
`ray://HEAD:10001`) the tasks go to that cluster, whose nodes need this project installed as on the driver.
An address whose port does not answer within ADDRESS_TIMEOUT_S is one line (ray.init would retry for
minutes). A local instance goes with the command even when the command is killed by SIGKILL: GCS, raylet and
the workers die with it by themselves, but Ray's dashboard and runtime-env agents would wait minutes for the
dead GCS, so a reaper process (Linux) kills whatever ray.init started once the command is gone. ray.init
installs its own SIGTERM handler: the command's is put back, so SIGTERM stops a command on Ray as it stops
one on local processes (exit code 143, one line).

A compare task is one `algorithms.train.execute` of the job's RunSpec, exactly as the process backend runs it
(the same spec, so the same seed and config hash, the same summary.json and the same results.json). Where the task runs on
another node than compare, its log dir is written there under the same path, then packed (`pack_dir`) and
returned to compare, which unpacks it (`unpack_dir`) into --out: --out needs no shared filesystem. A tune
task runs a tuning worker loop against the study's journal file (`algorithms.tune`), which must then be on a
filesystem that every node sees (as Optuna's JournalFileBackend requires of several machines).
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tarfile
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from algorithms.common.errors import VcbmGymError
from algorithms.common.extras import require_extra

ADDRESS_TIMEOUT_S = 5.0  # a cluster head answers in milliseconds; the command has 30 s to say it does not


def require_ray(what: str) -> Any:
    """The ray module, or one line saying how to install it."""
    require_extra(what, "distributed")
    import ray

    return ray


REAPER = """
import os, signal, sys
watched = [line.split() for line in sys.stdin]  # until EOF: the command has stopped Ray, or it died
for pid, start in watched:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            if stat.read().rsplit(")", 1)[1].split()[19] == start:  # the same process, not a reused pid
                os.kill(int(pid), signal.SIGKILL)
    except (OSError, IndexError):
        pass
"""


def _descendants() -> dict[int, str]:
    """This process's descendants and their start times (from /proc; empty where there is none)."""
    parents, starts = {}, {}
    for entry in Path("/proc").iterdir() if Path("/proc/self/stat").exists() else ():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            parents[int(entry.name)], starts[int(entry.name)] = int(fields[1]), fields[19]
    found, frontier = set(), {os.getpid()}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return {pid: starts[pid] for pid in found}


@contextlib.contextmanager
def _reaper() -> Iterator[Callable[[], None]]:
    """Yields `note()`: the processes started between entering the block and calling it are SIGKILLed by a
    reaper process once this process has left the block or died (however: SIGKILL included)."""
    if not Path("/proc/self/stat").exists():
        yield lambda: None
        return
    before = set(_descendants())
    reaper = subprocess.Popen([sys.executable, "-c", REAPER], stdin=subprocess.PIPE, text=True, start_new_session=True)
    assert reaper.stdin is not None

    def note() -> None:
        started = {pid: start for pid, start in _descendants().items() if pid not in before and pid != reaper.pid}
        with contextlib.suppress(OSError):
            reaper.stdin.write("".join(f"{pid} {start}\n" for pid, start in started.items()))
            reaper.stdin.flush()

    try:
        yield note
    finally:
        with contextlib.suppress(OSError):
            reaper.stdin.close()  # EOF: the reaper kills what is left, then exits
        reaper.wait()


def check_address(address: str | None, what: str) -> None:
    """One line, within ADDRESS_TIMEOUT_S, for an --address whose port does not answer (`auto` and no
    address are left to Ray, which answers at once)."""
    if address is None or address == "auto":
        return
    host, colon, port = address.removeprefix("ray://").rpartition(":")
    if not colon or not host or not port.isdigit():
        raise VcbmGymError(f"{what}: --address {address!r}: expected auto, HOST:PORT or ray://HOST:PORT")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=ADDRESS_TIMEOUT_S).close()
    except OSError as exc:
        reason = "no answer" if isinstance(exc, TimeoutError) else (exc.strerror or str(exc))
        raise VcbmGymError(
            f"{what}: cannot reach Ray at --address {address!r} ({reason} within {ADDRESS_TIMEOUT_S:g} s); "
            "expected a running cluster (ray start --head) or no --address for a local instance"
        ) from None


@contextlib.contextmanager
def ray_session(address: str | None, num_cpus: int, what: str) -> Iterator[Any]:
    """Connect to `address`, or start a local Ray instance with `num_cpus` CPUs; stop only what was started here.
    A Ray already initialised in this process (tests, notebooks) is used as it is."""
    ray = require_ray(what)
    if ray.is_initialized():
        yield ray
        return
    check_address(address, what)
    kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False, "logging_level": "ERROR"}
    if address is None:
        # a local instance's workers import this project from where this process does
        kwargs.update(num_cpus=num_cpus, runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}})
    main_thread = threading.current_thread() is threading.main_thread()
    handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)} if main_thread else {}
    with _reaper() if address is None else contextlib.nullcontext(lambda: None) as note_started:
        try:
            try:
                ray.init(address=address, **kwargs)
            finally:
                note_started()  # a local instance's processes, known to the reaper from now on
                for signum, handler in handlers.items():  # Ray's SIGTERM handler would exit with 15, bypassing
                    if handler is not None:  # the command's stop (143, one line)
                        signal.signal(signum, handler)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            ray.shutdown()
            raise VcbmGymError(
                f"{what}: cannot connect to Ray at --address {address!r} ({exc}); expected a running "
                "cluster (ray start --head) or no --address for a local instance"
            ) from None
        except BaseException:  # stopped while Ray was starting: what it started so far stops with it
            ray.shutdown()
            raise
        try:
            yield ray
        finally:
            ray.shutdown()


def pack_dir(path: Path) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        tar.add(path, arcname=".")
    return buffer.getvalue()


def unpack_dir(data: bytes, path: Path) -> None:
    """Replace `path` by the packed directory: unpacked beside it, then renamed into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=f".{path.name}.unpack-"))
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
            extract_data(tar, tmp)
        if path.exists():
            shutil.rmtree(path)
        os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def extract_data(tar: tarfile.TarFile, destination: Path) -> None:
    """Extract with tarfile's "data" filter where Python has it (3.12, and 3.11.4 / 3.10.12 on); before that,
    `extractall` takes no `filter` (Debian 12's 3.11.2), and the same refusals and mode changes are made here."""
    if hasattr(tarfile, "data_filter"):
        tar.extractall(destination, filter="data")
        return
    root = Path(os.path.realpath(destination))
    # a generator: each member is checked just before it is extracted, so that its path resolves through the
    # links extracted before it (a link to "." and then a link through it to ".." would pass a check made up front)
    tar.extractall(destination, members=(_as_data(member, root) for member in tar))


def _as_data(member: tarfile.TarInfo, root: Path) -> tarfile.TarInfo:
    """The "data" filter by hand: names taken relative to `root` (leading slashes dropped); names or links that
    lead outside it, absolute links, device files and FIFOs refused; set-id, sticky and group/other write bits
    cleared, files given owner read/write; owned by this process's user (tarfile chowns only as root)."""
    where = f"packed log dir member {member.name!r}"
    member.name = member.name.lstrip("/" + os.sep)  # older tarfile would write "/x" at /x
    if os.path.isabs(member.name) or not _inside(root, root / member.name):
        raise tarfile.TarError(f"{where}: expected a path inside the destination")
    if member.isdev():
        raise tarfile.TarError(f"{where} is a device file or FIFO: expected files, folders and links")
    if member.issym():
        if os.path.isabs(member.linkname) or not _inside(root, root / os.path.dirname(member.name) / member.linkname):
            raise tarfile.TarError(f"{where} links to {member.linkname!r}: expected a link inside the destination")
    elif member.islnk() and not _inside(root, root / member.linkname):
        raise tarfile.TarError(f"{where} links to {member.linkname!r}: expected a link inside the destination")
    mode = member.mode & ~(stat.S_ISUID | stat.S_ISGID | stat.S_ISVTX | stat.S_IWGRP | stat.S_IWOTH)
    if member.isfile() or member.islnk():
        mode = (mode if mode & stat.S_IXUSR else mode & ~0o111) | stat.S_IRUSR | stat.S_IWUSR
    elif member.isdir():
        mode |= stat.S_IRWXU  # the folder must stay writable for what is extracted into it
    member.mode = mode
    member.uid, member.gid, member.uname, member.gname = os.getuid(), os.getgid(), "", ""
    return member


def _inside(root: Path, path: Path) -> bool:
    resolved = os.path.realpath(path)
    return resolved == str(root) or resolved.startswith(str(root) + os.sep)


def node_id() -> str | None:
    """The Ray node this process runs on; None outside Ray."""
    try:
        import ray

        return ray.get_runtime_context().get_node_id() if ray.is_initialized() else None
    except Exception:  # outside Ray (a direct call in a test): no node
        return None
