"""AppWorld server processes (one per concurrent rollout) and the HTTP client that talks to them.

AppWorld pins pydantic 1 and freezes the clock in its process, so it lives in its own virtual
environment and process (`envs/appworld/server.py`), reached over 127.0.0.1 only. The project
starts and stops these processes (`AppWorldServerPool`), and restarts one that crashed. Every
failure to reach a server becomes an `AppWorldServerError` within a bounded time: a refused
connection at once, a hung server after `request_timeout` seconds.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

SERVER_SCRIPT = Path(__file__).with_name("server.py")
CACHE_DIR = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "vcbm_gym"


class AppWorldServerError(RuntimeError):
    """An AppWorld server could not be reached, died, or refused a request."""


def default_venv() -> Path:
    """The AppWorld virtual environment: $VCBM_APPWORLD_VENV, else ~/.cache/vcbm_gym/appworld-venv."""
    return Path(os.environ.get("VCBM_APPWORLD_VENV", CACHE_DIR / "appworld-venv")).expanduser()


def default_root() -> Path:
    """The folder holding AppWorld's data/: $VCBM_APPWORLD_ROOT, else ~/.cache/vcbm_gym/appworld."""
    return Path(os.environ.get("VCBM_APPWORLD_ROOT", CACHE_DIR / "appworld")).expanduser()


def venv_python(venv: str | os.PathLike) -> Path:
    return Path(venv) / "bin" / "python"


class AppWorldClient:
    """JSON-over-HTTP calls to one server; every response is `{"output": ...}`."""

    def __init__(self, url: str, request_timeout: float = 30.0) -> None:
        if not url.startswith(("http://127.0.0.1:", "http://localhost:")):
            raise ValueError(
                f"AppWorld server url must be on the loopback interface (http://127.0.0.1:PORT), got {url!r}"
            )
        self.url = url.rstrip("/")
        self.request_timeout = request_timeout

    def call(self, endpoint: str, timeout: float | None = None, **payload: Any) -> Any:
        timeout = self.request_timeout if timeout is None else timeout
        if payload:
            request = urllib.request.Request(
                f"{self.url}/{endpoint}",
                data=json.dumps(payload).encode(),
                headers={"Content-Type": "application/json"},
            )
        else:
            request = urllib.request.Request(f"{self.url}/{endpoint}")
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return json.loads(response.read())["output"]
        except urllib.error.HTTPError as error:
            body = error.read().decode(errors="replace")
            try:
                detail = json.loads(body).get("detail", body)
            except json.JSONDecodeError:
                detail = body
            raise AppWorldServerError(
                f"AppWorld server {self.url} refused /{endpoint} (HTTP {error.code}): {detail}"
            ) from error
        except (urllib.error.URLError, ConnectionError, TimeoutError, json.JSONDecodeError) as error:
            reason = getattr(error, "reason", error)
            raise AppWorldServerError(
                f"AppWorld server {self.url} did not answer /{endpoint} within {timeout:.0f} s ({reason!r}). "
                "Is it running? Servers are started by envs.appworld.pool.AppWorldServerPool."
            ) from error


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class AppWorldServer:
    """One server process; `start`, `stop`, `restart`, `alive`."""

    def __init__(
        self,
        venv: str | os.PathLike | None = None,
        root: str | os.PathLike | None = None,
        name: str = "server0",
        startup_timeout: float = 180.0,
        request_timeout: float = 30.0,
    ) -> None:
        self.venv = Path(venv) if venv else default_venv()
        self.root = Path(root) if root else default_root()
        self.name = name
        self.startup_timeout = startup_timeout
        self.request_timeout = request_timeout
        self.process: subprocess.Popen | None = None
        self.port: int | None = None
        self.restarts = 0
        self.log_path = Path(tempfile.gettempdir()) / f"vcbm_gym_appworld_{os.getpid()}_{name}.log"
        self.experiment_name = f"vcbm_gym_{os.getpid()}_{name}"  # AppWorld's per-process output folder

    @property
    def url(self) -> str:
        if self.port is None:
            raise AppWorldServerError(f"AppWorld server {self.name} is not started.")
        return f"http://127.0.0.1:{self.port}"

    def client(self) -> AppWorldClient:
        return AppWorldClient(self.url, self.request_timeout)

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def launch(self) -> None:
        """Start the process without waiting for it to answer (see `wait_ready`)."""
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
        self.port = _free_port()
        log = open(self.log_path, "w")
        self.process = subprocess.Popen(
            [
                str(python),
                str(SERVER_SCRIPT),
                "--port",
                str(self.port),
                "--root",
                str(self.root),
                "--experiment-name",
                self.experiment_name,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=str(self.root),
            env={**os.environ, "PYTHONPATH": ""},
        )
        log.close()

    def wait_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        probe = AppWorldClient(self.url, request_timeout=5.0)
        while time.monotonic() < deadline:
            if not self.alive():
                raise AppWorldServerError(
                    f"AppWorld server {self.name} exited at start-up:\n{self.log_tail()}"
                )
            try:
                probe.call("health")
                return
            except AppWorldServerError:
                time.sleep(0.25)
        self.stop()
        raise AppWorldServerError(
            f"AppWorld server {self.name} did not answer within {self.startup_timeout:.0f} s:\n{self.log_tail()}"
        )

    def start(self) -> AppWorldServer:
        self.launch()
        self.wait_ready()
        return self

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)
        self.process = None

    def remove_outputs(self) -> None:
        """Delete what AppWorld wrote for this server (per-task logs and DB snapshots)."""
        shutil.rmtree(self.root / "experiments" / "outputs" / self.experiment_name, ignore_errors=True)
        self.log_path.unlink(missing_ok=True)

    def restart(self) -> None:
        self.stop()
        self.restarts += 1
        self.start()

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


class AppWorldServerPool:
    """`size` AppWorld servers, one per concurrent rollout; `acquire`/`release` hand them out.

    Servers start in parallel. With `grow=True`, `acquire` starts another server when all are
    busy. `ensure_alive(server)` restarts a crashed one. Use as a context manager or call
    `close()`; leftover processes are also stopped at interpreter exit. Closing deletes AppWorld's
    per-server output folders (ROOT/experiments/outputs/vcbm_gym_<pid>_<server>) and logs unless
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
    ) -> None:
        if size < 0 or (size == 0 and not grow):
            raise ValueError(f"pool size must be >= 1 (or >= 0 with grow=True), got {size}")
        self.venv, self.root, self.grow, self.keep_outputs = venv, root, grow, keep_outputs
        self.startup_timeout, self.request_timeout = startup_timeout, request_timeout
        self.servers: list[AppWorldServer] = [
            AppWorldServer(venv, root, f"server{i}", startup_timeout, request_timeout) for i in range(size)
        ]
        self._free = list(self.servers)
        self._lock = threading.Lock()
        atexit.register(self.close)
        try:
            for server in self.servers:
                server.launch()
            for server in self.servers:
                server.wait_ready()
        except BaseException:
            self.close()
            raise

    def acquire(self) -> AppWorldServer:
        with self._lock:
            if self._free:
                server = self._free.pop(0)
            elif self.grow:
                server = AppWorldServer(
                    self.venv,
                    self.root,
                    f"server{len(self.servers)}",
                    self.startup_timeout,
                    self.request_timeout,
                )
                self.servers.append(server)
            else:
                raise AppWorldServerError(
                    f"All {len(self.servers)} AppWorld servers are in use; make the pool as large as the number of concurrent envs."
                )
        try:
            self.ensure_alive(server)
        except BaseException:
            self.release(server)
            raise
        return server

    def release(self, server: AppWorldServer) -> None:
        with self._lock:
            if server in self.servers and server not in self._free:
                self._free.append(server)

    def ensure_alive(self, server: AppWorldServer) -> bool:
        """Restart `server` if its process has died; return True when it had to."""
        if server.alive():
            return False
        server.restart()
        return True

    def close(self) -> None:
        for server in self.servers:
            server.stop()
            if not self.keep_outputs:
                server.remove_outputs()

    def __enter__(self) -> AppWorldServerPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_SHARED: dict[tuple[str, str], AppWorldServerPool] = {}


def shared_pool(
    venv: str | os.PathLike | None = None, root: str | os.PathLike | None = None
) -> AppWorldServerPool:
    """A process-wide growing pool per (venv, root): envs made without a pool borrow from it, so
    envs that are created and closed repeatedly (one per rollout) reuse running servers."""
    key = (str(Path(venv) if venv else default_venv()), str(Path(root) if root else default_root()))
    if key not in _SHARED:
        _SHARED[key] = AppWorldServerPool(0, key[0], key[1], grow=True)
    return _SHARED[key]
