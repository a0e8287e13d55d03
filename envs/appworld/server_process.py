"""One AppWorld server process (role `world` or `evaluator`) in its sandbox, and the calls to it.

The server runs `envs/appworld/server.py` in the AppWorld venv, sandboxed by `envs.appworld.sandbox` unless its
code is trusted; it is reached over a Unix socket in its own world directory with a per-server secret. Every call
has a wall-clock watchdog that SIGKILLs a server that overruns; a timeout, a protocol error or a 5xx marks it bad,
and `replace` starts a fresh one. The pool that hands servers to rollouts is `envs.appworld.pool`.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from envs.appworld.sandbox import LAUNCHER, Limits, allocate_uid, bwrap_command, limiter, positive_seconds

SERVER_SCRIPT = Path(__file__).with_name("server.py")
CACHE_DIR = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "vcbm_gym"
SANDBOX_ROOT = "/appworld"  # AppWorld's root inside the sandbox
SANDBOX_WORLD = "/world"  # the server's writable directory inside the sandbox
SOCKET_NAME = "server.sock"
EXPERIMENT = "vcbm_gym"
MAX_RESPONSE_BYTES = 64 << 20  # raised per call for long observations (see AppWorldEnv.step)


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
