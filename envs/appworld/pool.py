"""AppWorld server processes (one per concurrent rollout, plus one evaluator) and the calls to them.

AppWorld pins pydantic 1 and freezes the clock in its process, so it lives in its own virtual
environment and process (`envs/appworld/server.py`). Agent code runs inside that process, so
every world server runs in a bubblewrap sandbox (`envs.appworld.sandbox`): it sees the system's
/usr, the Python installation and the AppWorld venv read-only, the task data *without* ground
truth read-only, and one writable world directory of its own, which also holds the Unix socket
the pool talks to it through. It has no network, no environment variables, its own uid and
PID namespace, rlimits on CPU, memory, file size and processes, and dies with its parent.

Ground truth is only visible to the evaluator, a second sandboxed server that runs no agent
code: to score an episode the pool copies the world's saved database state (regular files only,
never through a symlink) into the evaluator's directory and asks it to evaluate.

Every call has a wall-clock watchdog (outside the sandbox) that SIGKILLs a server that overruns.
A timeout, a protocol error or a 5xx marks the server bad: it is killed, a fresh one is started
at once, and the call raises one `AppWorldServerError`. Requests carry a per-server secret, and
the socket lies in a directory only the server's own uid can enter. Servers die with the
process that owns the pool (PR_SET_PDEATHSIG, bwrap --die-with-parent), and a SIGTERM handler
closes every pool before the process exits. One server's process and its calls are
`envs.appworld.server_process`; this module stages the task data, pools the servers and scores episodes.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import shutil
import signal
import stat
import tempfile
import threading
import weakref
from pathlib import Path
from typing import Any

from envs.appworld.sandbox import Limits, SandboxUnavailableError, check_sandbox, positive_seconds
from envs.appworld.server_process import EXPERIMENT, AppWorldServer, AppWorldServerError, default_root, default_venv

__all__ = [
    "AppWorldServer",
    "AppWorldServerError",
    "AppWorldServerPool",
    "Limits",
    "SandboxUnavailableError",
    "shared_pool",
]

MAX_STAGED_BYTES = 512 << 20
SAFE_NAME = re.compile(r"[\w.-]+")


def mirror_public_tasks(data: Path, target: Path) -> None:
    """`data/tasks` without any task's ground_truth folder, as hard links (copies across devices),
    for the world servers: what they cannot see, agent code cannot read."""
    for task in sorted(os.scandir(data / "tasks"), key=lambda entry: entry.name):
        if not task.is_dir(follow_symlinks=False):
            continue
        for folder, subfolders, files in os.walk(task.path):
            subfolders[:] = [name for name in subfolders if not (folder == task.path and name == "ground_truth")]
            out = target / os.path.relpath(folder, data / "tasks")
            out.mkdir(parents=True, exist_ok=True)
            out.chmod(0o755)
            for name in files:
                source = os.path.join(folder, name)
                info = os.lstat(source)
                if not stat.S_ISREG(info.st_mode):
                    continue
                if info.st_mode & stat.S_IROTH:  # the server's own uid can read a link to it
                    try:
                        os.link(source, out / name)
                        continue
                    except OSError:
                        pass
                shutil.copyfile(source, out / name)
                os.chmod(out / name, 0o644)
    target.chmod(0o755)


def _open_dir_beneath(base: Path, parts: list[str]) -> int:
    """An fd of base/parts..., refusing any symlink on the way (the agent owns those folders)."""
    fd = os.open(base, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        for part in parts:
            next_fd = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = next_fd
    except BaseException:
        os.close(fd)
        raise
    return fd


def copy_saved_state(world_dir: Path, task_id: str, target: Path) -> None:
    """Copy the world's saved databases of `task_id` to `target`: regular files with plain names
    only, opened without following symlinks, at most MAX_STAGED_BYTES in all."""
    parts = ["experiments", "outputs", EXPERIMENT, "tasks", task_id, "dbs"]
    try:
        dir_fd = _open_dir_beneath(world_dir, parts)
    except OSError as error:
        raise AppWorldServerError(
            f"the world saved no database state for task {task_id!r} (or replaced it by a link): {error}"
        ) from None
    total = 0
    target.mkdir(parents=True, exist_ok=True)
    try:
        for name in os.listdir(dir_fd):
            if not SAFE_NAME.fullmatch(name):
                continue
            try:
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
            except OSError:
                continue  # a symlink (ELOOP) or something unreadable: not part of AppWorld's state
            with os.fdopen(fd, "rb") as source:
                info = os.fstat(source.fileno())
                if not stat.S_ISREG(info.st_mode):
                    continue
                total += info.st_size
                if total > MAX_STAGED_BYTES:
                    raise AppWorldServerError(f"the world's saved state of task {task_id!r} exceeds {MAX_STAGED_BYTES} bytes")
                out = os.open(target / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                with os.fdopen(out, "wb") as sink:
                    shutil.copyfileobj(source, sink)
    finally:
        os.close(dir_fd)


_LIVE_POOLS: weakref.WeakSet = weakref.WeakSet()
_PREVIOUS_SIGTERM: Any = None


def _close_live_pools() -> None:
    for pool in list(_LIVE_POOLS):
        with contextlib.suppress(Exception):
            pool.close()


def _on_sigterm(signum: int, frame: Any) -> None:
    _close_live_pools()
    previous = _PREVIOUS_SIGTERM
    if callable(previous):
        previous(signum, frame)
    else:  # the default action: die of SIGTERM, as the sender expects
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)


def _install_sigterm_handler() -> None:
    global _PREVIOUS_SIGTERM
    if threading.current_thread() is not threading.main_thread():
        return  # signal handlers can only be set from the main thread; PDEATHSIG still applies
    current = signal.getsignal(signal.SIGTERM)
    if current in (_on_sigterm, signal.SIG_IGN):
        return
    _PREVIOUS_SIGTERM = current
    signal.signal(signal.SIGTERM, _on_sigterm)


class AppWorldServerPool:
    """`size` world servers, one per concurrent rollout, and one evaluator; `acquire`/`release`
    hand the world servers out.

    Servers start in parallel. With `grow=True`, `acquire` starts another server when all are
    busy. A server that died, or that agent code left threads or processes running in, is
    replaced before it is handed out again. `trusted_code=True` runs the servers without the
    sandbox (only where bubblewrap is unavailable and every line of agent code is trusted); without
    it a machine that cannot sandbox raises `SandboxUnavailableError`. Use as a context manager or
    call `close()`; servers are also stopped at interpreter exit and on SIGTERM, and die with this
    process on SIGKILL. Closing deletes the pool's folder (worlds, sockets, logs) unless
    `keep_outputs=True`.
    """

    def __init__(
        self,
        size: int = 1,
        venv: str | os.PathLike | None = None,
        root: str | os.PathLike | None = None,
        startup_timeout: float = 180.0,
        request_timeout: float = 30.0,
        grow: bool = False,
        keep_outputs: bool = False,
        trusted_code: bool = False,
        limits: Limits | None = None,
    ) -> None:
        if isinstance(size, bool) or not isinstance(size, int) or size < 0 or (size == 0 and not grow):
            raise ValueError(f"pool size must be >= 1 (or >= 0 with grow=True), got {size!r}")
        self.startup_timeout = positive_seconds("startup_timeout", startup_timeout)
        self.request_timeout = positive_seconds("request_timeout", request_timeout)
        self.sandboxed = check_sandbox(trusted_code)
        self.venv = Path(venv) if venv else default_venv()
        self.root = Path(root) if root else default_root()
        self.grow, self.keep_outputs, self.limits = grow, keep_outputs, limits or Limits()
        self.servers: list[AppWorldServer] = []
        self._free: list[AppWorldServer] = []
        self._lock = threading.Lock()
        self._evaluate_lock = threading.Lock()
        self._task_info: dict[str, dict] = {}
        self._closed = False
        self.workdir = Path(tempfile.mkdtemp(prefix="vcbm_gym_appworld_"))
        if len(str(self.workdir)) > 60:  # AF_UNIX paths are limited to 107 bytes
            shutil.rmtree(self.workdir)
            self.workdir = Path(tempfile.mkdtemp(prefix="vcbm_gym_appworld_", dir="/tmp"))
        os.chmod(self.workdir, 0o711)  # servers reach their own folder, nobody can list the others
        atexit.register(self.close)
        _LIVE_POOLS.add(self)
        _install_sigterm_handler()
        try:
            self.public_tasks = None
            if self.sandboxed and (self.root / "data" / "tasks").is_dir():
                self.public_tasks = self.workdir / "public_tasks"
                mirror_public_tasks(self.root / "data", self.public_tasks)
            self.evaluator = self._new_server("evaluator", role="evaluator")
            self.servers = [self._new_server(f"server{i}") for i in range(size)]
            self._free = list(self.servers)
            for server in [self.evaluator, *self.servers]:
                server.launch()
            for server in [self.evaluator, *self.servers]:
                server.wait_ready()
        except BaseException:
            self.close()
            raise

    def _new_server(self, name: str, role: str = "world") -> AppWorldServer:
        return AppWorldServer(
            self.venv,
            self.root,
            name,
            self.startup_timeout,
            self.request_timeout,
            workdir=self.workdir,
            sandboxed=self.sandboxed,
            limits=self.limits,
            role=role,
            public_tasks=self.public_tasks,
        )

    def acquire(self) -> AppWorldServer:
        with self._lock:
            if self._closed:
                raise AppWorldServerError("this AppWorld server pool is closed")
            if self._free:
                server = self._free.pop(0)
            elif self.grow:
                server = self._new_server(f"server{len(self.servers)}")
                self.servers.append(server)
                server.launch()
            else:
                raise AppWorldServerError(
                    f"All {len(self.servers)} AppWorld servers are in use; "
                    "make the pool as large as the number of concurrent envs."
                )
        try:
            self.ensure_alive(server)
        except BaseException:
            self.release(server)
            raise
        return server

    def release(self, server: AppWorldServer) -> None:
        if server.tainted and server.alive():
            # threads or processes the agent left behind could act in the next episode
            server.replace(f"was left running {', '.join(server.tainted[:3])} by agent code")
        with self._lock:
            if server in self.servers and server not in self._free:
                self._free.append(server)

    def ensure_alive(self, server: AppWorldServer) -> bool:
        """Restart `server` if its process has died (or the agent left it tainted); True when it had to."""
        if server.alive() and not server.tainted:
            server.ensure_ready()
            return False
        reason = "exited" if not server.alive() else f"was left running {', '.join(server.tainted[:3])}"
        server.replace(reason, wait=True)
        return True

    # ----------------------------------------------------------------- evaluator
    def evaluate(self, server: AppWorldServer, task_id: str) -> dict:
        """AppWorld's evaluation of the state `server`'s world saved for `task_id`, in the evaluator."""
        if not SAFE_NAME.fullmatch(task_id):
            raise ValueError(f"task_id must be a plain AppWorld task id, got {task_id!r}")
        with self._evaluate_lock:
            staged = self.evaluator.world_dir / "experiments" / "outputs" / EXPERIMENT
            shutil.rmtree(staged, ignore_errors=True)
            try:
                copy_saved_state(server.world_dir, task_id, staged / "tasks" / task_id / "dbs")
                if self.sandboxed and os.geteuid() == 0:
                    owner = os.stat(self.evaluator.world_dir).st_uid
                    for path in [staged, *staged.rglob("*")]:
                        os.chown(path, owner, owner)
                return self.evaluator.call(
                    "evaluate",
                    timeout=max(self.request_timeout, 120.0),
                    task_id=task_id,
                    experiment_name=EXPERIMENT,
                )
            finally:
                shutil.rmtree(staged, ignore_errors=True)

    def task_ids(self, split: str, difficulty: int | None = None) -> dict:
        return self.evaluator.call("task_ids", split=split, difficulty=difficulty)

    def task_info(self, task_id: str) -> dict:
        """{difficulty, has_ground_truth} of a task (read by the evaluator)."""
        if task_id not in self._task_info:
            self._task_info[task_id] = self.evaluator.call("task_info", task_id=task_id)
        return self._task_info[task_id]

    def metrics(self, results: dict[str, dict]) -> dict:
        return self.evaluator.call("metrics", results=results)

    # ----------------------------------------------------------------- lifetime
    def close(self) -> None:
        self._closed = True
        for server in [*self.servers, *([self.evaluator] if hasattr(self, "evaluator") else [])]:
            server.stop()
        if not self.keep_outputs:
            shutil.rmtree(self.workdir, ignore_errors=True)
        _LIVE_POOLS.discard(self)

    def __enter__(self) -> AppWorldServerPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_SHARED: dict[tuple[str, str, bool], AppWorldServerPool] = {}


def shared_pool(
    venv: str | os.PathLike | None = None,
    root: str | os.PathLike | None = None,
    trusted_code: bool = False,
) -> AppWorldServerPool:
    """A process-wide growing pool per (venv, root, trusted_code): envs made without a pool borrow
    from it, so envs that are created and closed repeatedly (one per rollout) reuse running servers."""
    key = (
        str(Path(venv) if venv else default_venv()),
        str(Path(root) if root else default_root()),
        trusted_code,
    )
    if key not in _SHARED or _SHARED[key]._closed:
        _SHARED[key] = AppWorldServerPool(0, key[0], key[1], grow=True, trusted_code=trusted_code)
    return _SHARED[key]
