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
closes every pool before the process exits.
"""

from __future__ import annotations

import atexit
import contextlib
import http.client
import json
import os
import re
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import threading
import time
import weakref
from pathlib import Path
from typing import Any

from envs.appworld.sandbox import (
    LAUNCHER,
    Limits,
    SandboxUnavailableError,
    allocate_uid,
    bwrap_command,
    check_sandbox,
    limiter,
    positive_seconds,
)

__all__ = [
    "AppWorldServer",
    "AppWorldServerError",
    "AppWorldServerPool",
    "Limits",
    "SandboxUnavailableError",
    "shared_pool",
]

SERVER_SCRIPT = Path(__file__).with_name("server.py")
CACHE_DIR = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "vcbm_gym"
SANDBOX_ROOT = "/appworld"  # AppWorld's root inside the sandbox
SANDBOX_WORLD = "/world"  # the server's writable directory inside the sandbox
SOCKET_NAME = "server.sock"
EXPERIMENT = "vcbm_gym"
MAX_RESPONSE_BYTES = 64 << 20  # raised per call for long observations (see AppWorldEnv.step)
MAX_STAGED_BYTES = 512 << 20
SAFE_NAME = re.compile(r"[\w.-]+")


class AppWorldServerError(RuntimeError):
    """An AppWorld server could not be reached, died, misbehaved or refused a request."""


def default_venv() -> Path:
    """The AppWorld virtual environment: $VCBM_APPWORLD_VENV, else ~/.cache/vcbm_gym/appworld-venv."""
    return Path(os.environ.get("VCBM_APPWORLD_VENV", CACHE_DIR / "appworld-venv")).expanduser()


def default_root() -> Path:
    """The folder holding AppWorld's data/: $VCBM_APPWORLD_ROOT, else ~/.cache/vcbm_gym/appworld."""
    return Path(os.environ.get("VCBM_APPWORLD_ROOT", CACHE_DIR / "appworld")).expanduser()


def venv_python(venv: str | os.PathLike) -> Path:
    return Path(venv) / "bin" / "python"


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self._path)


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


class AppWorldServer:
    """One server process (role `world` or `evaluator`); `start`, `call`, `replace`, `stop`."""

    def __init__(
        self,
        venv: str | os.PathLike | None = None,
        root: str | os.PathLike | None = None,
        name: str = "server0",
        startup_timeout: float = 180.0,
        request_timeout: float = 30.0,
        *,
        workdir: str | os.PathLike,
        sandboxed: bool,
        limits: Limits | None = None,
        role: str = "world",
        public_tasks: Path | None = None,
    ) -> None:
        if role not in ("world", "evaluator"):
            raise ValueError(f"role must be 'world' or 'evaluator', got {role!r}")
        if sandboxed and role == "world" and public_tasks is None:
            raise ValueError("a sandboxed world server needs public_tasks (the data without ground truth)")
        self.venv = Path(venv) if venv else default_venv()
        self.root = Path(root) if root else default_root()
        self.name = name
        self.startup_timeout = positive_seconds("startup_timeout", startup_timeout)
        self.request_timeout = positive_seconds("request_timeout", request_timeout)
        self.workdir = Path(workdir)
        self.sandboxed = sandboxed
        self.limits = limits or Limits()
        self.role = role
        self.public_tasks = public_tasks
        self.process: subprocess.Popen | None = None
        self.generation = 0
        self.restarts = 0
        self.tainted: list[str] = []  # what agent code left running; replaced on release
        self._secret = ""
        self._ready = False
        self._overran: int | None = None
        self._lock = threading.RLock()

    # ----------------------------------------------------------------- paths
    @property
    def world_dir(self) -> Path:
        """Host folder the server may write: its socket, AppWorld's outputs, its /tmp."""
        return self.workdir / f"{self.name}.{self.generation}"

    @property
    def log_path(self) -> Path:
        return self.workdir / f"{self.name}.{self.generation}.log"

    @property
    def socket_path(self) -> Path:
        return self.world_dir / SOCKET_NAME

    # ----------------------------------------------------------------- process
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def _command(self, uid: int) -> list[str]:
        world = self.world_dir
        inner_root = SANDBOX_ROOT if self.sandboxed else str(world / "root")
        server_args = [
            "--role",
            self.role,
            "--socket",
            f"{SANDBOX_WORLD}/{SOCKET_NAME}" if self.sandboxed else str(self.socket_path),
            "--root",
            inner_root,
            "--experiment-name",
            EXPERIMENT,
        ]
        data = self.root / "data"
        if not self.sandboxed:
            (world / "root").mkdir()
            (world / "root" / "data").symlink_to(data.resolve())
            (world / "root" / "experiments").symlink_to("../experiments")
            return [str(venv_python(self.venv)), "-I", str(SERVER_SCRIPT), *server_args]
        if self.role == "world":
            ro = [(data / name, f"{SANDBOX_ROOT}/data/{name}") for name in ("base_dbs", "api_docs", "datasets")]
            ro.append((self.public_tasks, f"{SANDBOX_ROOT}/data/tasks"))
            ro = [(source, target) for source, target in ro if Path(source).is_dir()]
        else:
            ro = [(data, f"{SANDBOX_ROOT}/data")]
        ro.append((SERVER_SCRIPT, "/opt/vcbm_gym/server.py"))
        inner = [
            str(venv_python(self.venv)),
            "-I",
            "/opt/vcbm_gym/server.py",
            *server_args,
            "--nproc",
            str(self.limits.processes),
            "--sandboxed",
        ]
        return bwrap_command(
            inner,
            venv=self.venv,
            ro_binds=ro,
            rw_binds=[(world, SANDBOX_WORLD), (world / "tmp", "/tmp")],
            symlinks=[(f"{SANDBOX_WORLD}/experiments", f"{SANDBOX_ROOT}/experiments")],
            setenv={
                "HOME": f"{SANDBOX_WORLD}/home",
                "APPWORLD_CACHE": f"{SANDBOX_WORLD}/home/.appworld",
                "PATH": "/usr/bin:/bin",
                "LANG": "C.UTF-8",
                "TMPDIR": "/tmp",
            },
            chdir=SANDBOX_WORLD,
            uid=uid,
        )

    def launch(self) -> None:
        """Start a fresh process in a fresh world directory, without waiting for it to answer."""
        python = venv_python(self.venv)
        if not python.exists():
            raise AppWorldServerError(
                f"No AppWorld virtual environment at {self.venv}; create it with `python -m envs.appworld.setup` "
                "(or set VCBM_APPWORLD_VENV)."
            )
        if not (self.root / "data" / "tasks").is_dir():
            raise AppWorldServerError(
                f"No AppWorld data at {self.root}/data; run `python -m envs.appworld.setup` (synthetic tasks) "
                "or add --download-data (or set VCBM_APPWORLD_ROOT)."
            )
        world = self.world_dir
        world.mkdir(mode=0o700)
        for sub in ("experiments", "tmp", "home"):
            (world / sub).mkdir(mode=0o700)
        uid = allocate_uid()
        if self.sandboxed and os.geteuid() == 0:
            for path in (world, world / "experiments", world / "tmp", world / "home"):
                os.chown(path, uid, uid)
        self._secret = secrets.token_hex(32)
        self._ready = False
        self.tainted = []
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": str(world / "home")}
        with open(self.log_path, "w") as log:
            self.process = LAUNCHER.popen(
                self._command(uid),
                stdin=subprocess.PIPE,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=str(world),
                env=env,
                start_new_session=True,  # one process group to kill (bwrap, or the trusted server)
                preexec_fn=limiter(self.limits),
            )
        try:
            self.process.stdin.write(f"{self._secret}\n".encode())
            self.process.stdin.close()
        except OSError:
            pass  # it died at once; wait_ready reports its log

    def wait_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if not self.alive():
                raise AppWorldServerError(f"AppWorld {self.role} server {self.name} exited at start-up:\n{self.log_tail()}")
            if self.socket_path.exists():
                try:
                    self._request("GET", "health", None, 5.0, 1 << 16)
                    self._ready = True
                    return
                except (OSError, http.client.HTTPException, ValueError):
                    pass
            time.sleep(0.1)
        self.kill()
        raise AppWorldServerError(
            f"AppWorld {self.role} server {self.name} did not answer within {self.startup_timeout:.0f} s:\n{self.log_tail()}"
        )

    def start(self) -> AppWorldServer:
        self.launch()
        self.wait_ready()
        return self

    def ensure_ready(self) -> None:
        """Wait for a just-launched server; restart one that died since."""
        with self._lock:
            if not self.alive():
                self.replace("exited", wait=True)
            elif not self._ready:
                self.wait_ready()

    def kill(self) -> None:
        """SIGKILL the server's process group (bwrap; the sandbox dies with it) and reap it."""
        process, self.process = self.process, None
        self._ready = False
        if process is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=10)

    def stop(self) -> None:
        self.kill()

    def remove_outputs(self) -> None:
        """Delete this server's world directory and log (rmtree never follows the agent's links)."""
        shutil.rmtree(self.world_dir, ignore_errors=True)
        self.log_path.unlink(missing_ok=True)

    def replace(self, reason: str, wait: bool = False) -> None:
        """Kill this server (whatever state it is in) and start a fresh one in a fresh directory."""
        with self._lock:
            self.kill()
            self.remove_outputs()
            self.generation += 1
            self.restarts += 1
            self.last_replacement_reason = reason
            self.launch()
            if wait:
                self.wait_ready()

    def restart(self) -> None:
        self.replace("restart requested", wait=True)

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    # ----------------------------------------------------------------- requests
    def _request(self, method: str, endpoint: str, payload: dict | None, timeout: float, max_bytes: int) -> tuple[int, Any]:
        body = None if payload is None else json.dumps(payload).encode()
        headers = {"X-Vcbm-Secret": self._secret}
        if body is not None:
            headers["Content-Type"] = "application/json"
        connection = _UnixHTTPConnection(str(self.socket_path), timeout)
        try:
            connection.request(method, f"/{endpoint}", body=body, headers=headers)
            response = connection.getresponse()
            raw = response.read(max_bytes + 1)
        finally:
            connection.close()
        if len(raw) > max_bytes:
            raise ValueError(f"answered more than {max_bytes} bytes")
        answer = json.loads(raw)
        if not isinstance(answer, dict):
            raise ValueError(f"answered {type(answer).__name__}, not a JSON object")
        return response.status, answer

    def _watchdog(self, generation: int) -> None:
        with contextlib.suppress(Exception):
            if self.generation == generation and self.alive():
                self._overran = generation
                os.killpg(self.process.pid, signal.SIGKILL)

    def call(
        self,
        endpoint: str,
        timeout: float | None = None,
        max_bytes: int = MAX_RESPONSE_BYTES,
        bad_on_4xx: bool = False,
        **payload: Any,
    ) -> Any:
        """POST (GET without payload) `endpoint`; its `output`. A timeout, protocol error, 5xx (or,
        with `bad_on_4xx`, a 4xx) kills and replaces the server before raising."""
        timeout = self.request_timeout if timeout is None else positive_seconds("timeout", timeout)
        with self._lock:
            if not self.alive():
                code = self.process.returncode if self.process else None
                raise self._bad(f"had exited (code {code}) before /{endpoint}")
            if not self._ready:
                self.wait_ready()
        generation = self.generation
        watchdog = threading.Timer(timeout, self._watchdog, args=(generation,))
        watchdog.daemon = True
        watchdog.start()
        try:
            status, answer = self._request("POST" if payload else "GET", endpoint, payload, timeout + 5, max_bytes)
        except (OSError, http.client.HTTPException, ValueError) as error:
            if self._overran == generation:
                reason = f"did not answer /{endpoint} within {timeout:g} s (killed by the watchdog)"
            elif not self.alive():
                reason = f"died during /{endpoint} (exit code {self.process.returncode if self.process else None})"
            else:
                reason = f"broke the protocol on /{endpoint} ({type(error).__name__}: {error})"
            raise self._bad(reason) from None
        finally:
            watchdog.cancel()
        if status == 200 and "output" in answer:
            return answer["output"]
        detail = answer.get("detail", answer)
        if 400 <= status < 500 and status != 401 and not bad_on_4xx:
            raise AppWorldServerError(f"AppWorld {self.role} server {self.name} refused /{endpoint} (HTTP {status}): {detail}")
        raise self._bad(f"answered /{endpoint} with HTTP {status}: {detail}")

    def _bad(self, reason: str) -> AppWorldServerError:
        log = self.log_tail(5)
        try:
            self.replace(reason)
            outcome = f"it was killed and replaced by a fresh server (replacement #{self.restarts})"
        except AppWorldServerError as error:
            outcome = f"and its replacement failed to start: {error}"
        return AppWorldServerError(f"AppWorld {self.role} server {self.name} {reason}; {outcome}. Server log: {log!r}")


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
