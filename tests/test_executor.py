"""The executor of compare, suite and tune (algorithms.experiment.executor): results and failures per job, and the stop
and orphan behaviour that every command inherits: Ctrl-C and SIGTERM stop the workers (which run their
cleanup), and no worker outlives a command killed even by SIGKILL. compare's and tune's own tests check
that they use it (tests/test_run_integrity.py, tests/test_tune.py, tests/test_distributed.py)."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from algorithms.common.errors import Stopped, VcbmGymError
from algorithms.experiment import executor
from tests.helpers import alive, descendants, needs_proc, wait_gone

REPO = Path(__file__).resolve().parents[1]


def sleep_and_record(folder: str, job: int) -> None:
    """A job that runs until stopped, and records how it was stopped (its cleanup ran). Its `except Exception`
    stands for library code (tqdm) that would swallow a stop raised as an Exception."""
    Path(folder, f"started{job}").write_text(str(os.getpid()))
    try:
        try:
            time.sleep(600)
        except Exception:
            time.sleep(600)
    except BaseException as exc:
        Path(folder, f"stopped{job}").write_text(type(exc).__name__)
        raise


def _collect(backend_workers: int, jobs: list[float]) -> tuple[dict, dict]:
    results, failures = {}, {}

    def finished(job, result, error):
        if error is None:
            results[job] = result
        else:
            failures[job] = error

    executor.run_jobs(math.sqrt, jobs, workers=backend_workers, finished=finished)
    return results, failures


@pytest.mark.parametrize("workers", [0, 2], ids=["in-this-process", "processes"])
def test_every_job_reports_its_result_or_its_failure_and_a_failure_stops_nothing(workers):
    results, failures = _collect(workers, [4.0, -1.0, 9.0])
    assert results == {4.0: 2.0, 9.0: 3.0}
    assert failures == {-1.0: "ValueError: math domain error"}


def test_a_result_larger_than_a_pipe_buffer_comes_back():
    """The worker blocks in send() until the parent reads: the parent must read before the worker ends."""
    received = []
    executor.run_jobs(bytes, [3_000_000], workers=1, finished=lambda job, result, error: received.append((result, error)))
    assert received == [(bytes(3_000_000), None)]


def test_a_stop_in_this_process_propagates_at_once():
    def stop_after_first(job, result, error):
        raise Stopped("SIGTERM", 143)

    with pytest.raises(Stopped):
        executor.run_jobs(math.sqrt, [1.0, 4.0], workers=0, finished=stop_after_first)


def test_an_unknown_backend_is_one_clear_error():
    with pytest.raises(VcbmGymError, match="backend 'dask': expected one of process, ray"):
        executor.run_jobs(math.sqrt, [1.0], workers=1, finished=print, backend="dask")


DRIVER = """
import functools, sys
from algorithms.common import cli
from algorithms.experiment import executor
from test_executor import sleep_and_record

def run(argv):
    with executor.sigterm_stops():
        executor.run_jobs(functools.partial(sleep_and_record, sys.argv[1]), [0, 1], workers=2, finished=print)

sys.exit(cli.main(run, []))
"""


@needs_proc
@pytest.mark.parametrize(
    "how, code, cleanup",
    [
        ("SIGTERM", 128 + signal.SIGTERM, "Terminated"),
        # Ctrl-C in a terminal reaches every process of the group: the workers ignore it, the command stops them
        ("SIGINT to the group", 130, "Terminated"),
        ("SIGKILL", -signal.SIGKILL, None),
    ],
)
def test_no_worker_outlives_the_command_and_a_stop_runs_their_cleanup(tmp_path, how, code, cleanup):
    driver = subprocess.Popen(
        [sys.executable, "-c", DRIVER, str(tmp_path)],
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")])},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        # a suite started in the background by a non-interactive shell inherits SIGINT ignored (Python keeps
        # an inherited SIG_IGN): give the driver the disposition a terminal gives
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        deadline = time.monotonic() + 120
        while len(list(tmp_path.glob("started*"))) < 2 and driver.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        workers = {int(path.read_text()) for path in tmp_path.glob("started*")}
        assert len(workers) == 2 and workers <= descendants(driver.pid), driver.poll()
        everything = descendants(driver.pid)
        if how == "SIGINT to the group":
            os.killpg(driver.pid, signal.SIGINT)
        else:
            os.kill(driver.pid, getattr(signal, how))
        _, err = driver.communicate(timeout=60)
    finally:
        if driver.poll() is None:
            driver.kill()
    assert driver.returncode == code, err
    assert not wait_gone(everything)
    if cleanup is None:
        assert not list(tmp_path.glob("stopped*"))  # SIGKILL: the workers were killed, no cleanup ran
    else:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("stopped: "), err
        assert {path.read_text() for path in tmp_path.glob("stopped*")} == {cleanup}
        assert len(list(tmp_path.glob("stopped*"))) == 2


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_the_kernel_kills_a_worker_whose_parent_dies(tmp_path):
    """The watchdog thread aside: prctl alone ends the worker when its parent is SIGKILLed."""
    script = """
import os, signal, sys, time
from algorithms.experiment import executor
executor.PARENT_POLL_S = 3600.0  # the watchdog thread sleeps: only the kernel's signal can end this process
if os.fork() == 0:
    executor.die_with_parent(os.getppid())
    print(os.getpid(), flush=True)
    time.sleep(600)
    os._exit(0)
time.sleep(600)
"""
    parent = subprocess.Popen(
        [sys.executable, "-c", script], env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=subprocess.PIPE, text=True
    )
    try:
        child = int(parent.stdout.readline())
        assert alive(child)
        parent.kill()
        parent.wait(timeout=30)
    finally:
        if parent.poll() is None:
            parent.kill()
    assert not wait_gone({child})


@pytest.mark.parametrize("signum, stop", [(signal.SIGTERM, Stopped), (signal.SIGINT, KeyboardInterrupt)])
def test_a_stop_inside_stops_held_takes_effect_as_the_block_ends_and_the_handlers_come_back(signum, stop):
    """Sent from another thread too: any thread may take a process-directed signal, and a mask would hold it in
    one thread only."""
    # SIGINT as Python starts it, whatever an earlier test of the session left (a worker's SIG_IGN would hold it
    # for good, and pytest.raises would then see no stop)
    outer = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        reached_the_end, before = False, {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
        with pytest.raises(stop):
            with executor.sigterm_stops():  # SIGTERM raises (as in a command), SIGINT is Python's KeyboardInterrupt
                with executor.stops_held():
                    sender = threading.Thread(target=os.kill, args=(os.getpid(), signum))
                    sender.start()
                    sender.join()
                    time.sleep(0.05)  # several bytecode checks, at any of which an unheld handler would run
                    reached_the_end = True
        assert reached_the_end
        assert {s: signal.getsignal(s) for s in before} == before
    finally:
        if outer is not None:  # None: set outside Python, and not restorable from it
            signal.signal(signal.SIGINT, outer)


def test_a_block_without_a_stop_leaves_the_handlers_as_they_were():
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    with executor.stops_held():
        pass
    assert {s: signal.getsignal(s) for s in before} == before
