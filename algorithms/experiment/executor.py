"""One executor for the commands that run many independent jobs: compare's and suite's seed runs, tune's worker loops.

`run_jobs(task, jobs, workers=W, finished=..., backend=..., address=...)` calls `task(job)` for every job:
in this process one after the other (`workers=0`, process backend), each in its own spawned process with at
most W at once (`backend="process"`), or as Ray tasks with at most W in flight, on a local Ray instance
started for the call (W CPUs) or on the cluster at `address` (`backend="ray"`, algorithms.experiment.distributed).
`finished(job, result, error)` is called here, in the order the jobs end, with the task's return value or
its failure as one line (`Type: message`); a failed job does not stop the others. `task` and the jobs must
be picklable (a module-level function or a functools.partial of one, dataclasses), as must the results.

Stopping and orphans, written once for every command:
- inside `sigterm_stops()`, SIGTERM raises Terminated in the main thread, as Ctrl-C raises KeyboardInterrupt
  (both BaseExceptions, which no `except Exception` in library code swallows: tqdm's does); either stops the
  jobs in flight (processes: SIGTERM, then SIGKILL after STOP_TIMEOUT_S; Ray tasks: cancelled, forced)
  before it propagates to the command, which reports it in one line (`stopped`: exit code 130 or 143).
- inside `stops_held()`, a SIGINT or SIGTERM waits for the end of the block: for a short write that a stop
  must not cut (tune's journal writes).
- a worker process ignores SIGINT (Ctrl-C reaches the whole process group; the command alone decides how to
  stop) and turns SIGTERM into Terminated, so that the task's `finally` and `except BaseException` blocks run.
- a worker process never outlives the process that started it, even one killed by SIGKILL (no handler runs
  there): on Linux the kernel kills the worker when its parent dies (prctl PR_SET_PDEATHSIG), and a watchdog
  thread checks the parent's pid as well (other systems, and a parent that died before the worker set the
  signal). Start the jobs from the thread that lives as long as the command (the main thread): the kernel
  counts the death of the thread that started a process as its parent's death.
- Resuming is the caller's, who passes only the jobs still to do (compare: the seeds without a finished
  run; tune: worker loops that count the study's trials).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from multiprocessing import get_context
from multiprocessing.connection import Connection, wait
from typing import Any, TypeVar

from algorithms.common.errors import Stopped, VcbmGymError

BACKENDS = ("process", "ray")
STOP_TIMEOUT_S = 5.0  # a stopped worker's time to run its cleanup before SIGKILL
PARENT_POLL_S = 0.2
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>

Job = TypeVar("Job")
Result = TypeVar("Result")
Finished = Callable[[Any, Any, "str | None"], None]


class Terminated(BaseException):
    """SIGTERM, raised as KeyboardInterrupt is for SIGINT: a BaseException, so that library code's
    `except Exception` (tqdm's, around starting its monitor thread) cannot swallow the stop."""

    def __init__(self) -> None:
        super().__init__("SIGTERM")


STOPS = (KeyboardInterrupt, Terminated, Stopped)  # what stops a command, as opposed to what fails a job


def stopped(exc: BaseException, kept: str) -> Stopped:
    """The command's one line for one of STOPS: what stopped it, what it keeps, and its exit code (130, 143)."""
    if isinstance(exc, KeyboardInterrupt):
        signame, code = "SIGINT", 128 + signal.SIGINT
    elif isinstance(exc, Terminated):
        signame, code = "SIGTERM", 128 + signal.SIGTERM
    else:
        assert isinstance(exc, Stopped)
        signame, code = str(exc), exc.exit_code
    return Stopped(f"{signame}: {kept}; rerun the same command to continue", code)


def _raise_terminated(signum: int, frame: Any) -> None:
    raise Terminated()


@contextlib.contextmanager
def sigterm_stops() -> Iterator[None]:
    """While inside, SIGTERM raises Terminated in the main thread, and a Terminated that leaves the block becomes
    Stopped("SIGTERM", 143) for cli.main; the previous handler after. Elsewhere than the main thread (where
    Python cannot set a handler) nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    except Terminated:
        raise Stopped("SIGTERM", 128 + signal.SIGTERM) from None
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def stops_held() -> Iterator[None]:
    """A SIGINT or SIGTERM that arrives inside the block takes effect as the block ends, for a short write that a
    stop must not cut: Optuna's journal lock cleans up in an `except BaseException` that itself fails when the
    stop lands between its rename and unlink (the trial's failure then reads FileNotFoundError), or leaves the
    lock held. A handler, not a signal mask: any thread of the process may take a process-directed signal, while
    Python runs the handler in the main thread. Elsewhere than the main thread no handler runs, so nothing waits."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []
    previous = {}
    for signum in (signal.SIGINT, signal.SIGTERM):
        handler = signal.getsignal(signum)
        if handler is not None:  # None: set outside Python, and not restorable from it
            previous[signum] = signal.signal(signum, lambda received, frame: held.append(received))
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if held:
            _deliver(held[0], previous[held[0]])


def _deliver(signum: int, handler: Any) -> None:
    """What the signal would have done had it not been held."""
    if callable(handler):
        handler(signum, None)
    elif handler == signal.SIG_DFL:
        os.kill(os.getpid(), signum)


def failure_line(exc: BaseException) -> str:
    """`Type: message` of an exception, its last line only (Ray wraps a task's traceback into its message)."""
    cause = getattr(exc, "cause", None) or exc  # a Ray task error carries the task's own exception
    text = str(cause).strip()
    return f"{type(cause).__name__}: {text.splitlines()[-1] if text else ''}"


def single_threaded() -> None:
    """The jobs are the parallelism; BLAS/OpenMP threads would only contend. Set through the environment so
    that torch is imported only by the jobs that use it."""
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(name, "1")
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(1)


def die_with_parent(parent_pid: int) -> None:
    """Make this process end when `parent_pid`, its parent, ends, however it ends (SIGKILL included)."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        except (OSError, AttributeError):  # no prctl in this libc: the watchdog below still works
            pass
    if os.getppid() != parent_pid:  # the parent died before the signal was set: nobody will send it
        os._exit(1)

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(PARENT_POLL_S)
        os._exit(1)

    threading.Thread(target=watch, daemon=True, name="exit-with-parent").start()


def _worker_terminated(signum: int, frame: Any) -> None:
    """SIGTERM in a worker: the command that stopped it reports the stop in one line, so the worker's stderr
    goes quiet first. A signal that lands where Python cannot propagate an exception (an import hook, a
    finaliser) would otherwise print "Exception ignored in ..." after that line."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stderr.fileno())
    os.close(devnull)
    raise Terminated()


def _process_main(task: Callable[[Any], Any], job: Any, conn: Connection, parent_pid: int) -> None:
    """A worker process: one job, its result (or its failure as one line) sent back to the parent."""
    die_with_parent(parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _worker_terminated)
    # tqdm's default lock is a multiprocessing semaphore: a worker stopped by SIGTERM would leave it to the
    # resource tracker, which then prints a warning after the command's one line
    from tqdm.auto import tqdm

    tqdm.set_lock(threading.RLock())
    single_threaded()
    try:
        message = ("ok", task(job))
    except BaseException as exc:  # reported by the parent, which keeps the other jobs going
        message = ("error", failure_line(exc))
    try:
        conn.send(message)
    except Exception as exc:  # an unpicklable result
        conn.send(("error", f"the job's result could not be sent back: {failure_line(exc)}"))
    conn.close()
    sys.exit(0 if message[0] == "ok" else 1)


def check_backend(backend: str, address: str | None, workers: int, what: str = "--backend ray") -> None:
    """A command's --backend, --address and --workers, checked before it writes anything (one line each)."""
    if backend not in BACKENDS:
        raise VcbmGymError(f"--backend {backend!r}: expected one of {', '.join(BACKENDS)}")
    if backend == "ray":
        if workers < 1:
            raise VcbmGymError(f"--workers {workers} with --backend ray: expected an integer >= 1 (tasks in flight)")
        from algorithms.experiment.distributed import check_address, require_ray

        require_ray("--backend ray")
        check_address(address, what)
    elif address is not None:
        raise VcbmGymError(f"--address {address!r} with --backend {backend}: expected --backend ray")


def run_jobs(
    task: Callable[[Job], Result],
    jobs: Sequence[Job],
    *,
    workers: int,
    finished: Callable[[Job, Result | None, str | None], None],
    backend: str = "process",
    address: str | None = None,
    what: str = "--backend ray",
) -> None:
    """Run `task(job)` for every job (see the module docstring); `finished(job, result, error)` as each ends.
    `what` names the option that chose Ray, for its errors."""
    if backend not in BACKENDS:
        raise VcbmGymError(f"backend {backend!r}: expected one of {', '.join(BACKENDS)}")
    if not jobs:
        return
    if backend == "ray":
        _run_on_ray(task, jobs, workers, finished, address, what)
    elif workers == 0:
        _run_here(task, jobs, finished)
    else:
        _run_processes(task, jobs, workers, finished)


def _run_here(task: Callable[[Any], Any], jobs: Sequence[Any], finished: Finished) -> None:
    """Every job in this process, for tests and debugging; a stop (one of STOPS) propagates at once."""
    single_threaded()
    for job in jobs:
        try:
            result = task(job)
        except Stopped:
            raise
        except Exception as exc:
            finished(job, None, failure_line(exc))
        else:
            finished(job, result, None)


def _run_processes(task: Callable[[Any], Any], jobs: Sequence[Any], workers: int, finished: Finished) -> None:
    """One spawned process per job, at most `workers` at once."""
    context = get_context("spawn")
    running: dict[Any, tuple[Any, Connection]] = {}
    messages: dict[Any, tuple[str, Any]] = {}
    queue = deque(enumerate(jobs))
    try:
        while queue or running:
            while queue and len(running) < workers:
                index, job = queue.popleft()
                receive, send = context.Pipe(duplex=False)
                process = context.Process(
                    target=_process_main, args=(task, job, send, os.getpid()), daemon=True, name=f"job{index}"
                )
                process.start()
                send.close()
                running[process] = (job, receive)
            # the pipes too: a worker blocks in send() on a result larger than the pipe's buffer until read
            listening = [receive for process, (_, receive) in running.items() if process not in messages]
            ready = wait([p.sentinel for p in running] + listening, timeout=1.0)
            for process, (job, receive) in list(running.items()):
                if receive in ready and process not in messages:
                    messages[process] = _read(receive)
                if process.sentinel not in ready:
                    continue
                process.join()
                if process not in messages:
                    messages[process] = _read(receive) if receive.poll() else ("error", None)
                status, payload = messages.pop(process)
                receive.close()
                del running[process]
                if status == "ok" and process.exitcode == 0:
                    finished(job, payload, None)
                else:
                    finished(job, None, payload or f"exit code {process.exitcode}")
    finally:
        _stop_processes(list(running))


def _read(receive: Connection) -> tuple[str, Any]:
    try:
        return receive.recv()
    except EOFError:  # the worker died without a word (SIGKILL, os._exit): its exit code says how
        return ("error", None)


def _stop_processes(processes: list[Any]) -> None:
    for process in processes:
        process.terminate()
    deadline = time.monotonic() + STOP_TIMEOUT_S
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))
        if process.is_alive():
            process.kill()
            process.join()


_DRIVER_NODE: list[str | None] = [None]  # in a Ray worker: the node of the command whose task runs here


def on_remote_node() -> bool:
    """In a task that `run_jobs` runs on Ray: whether it runs on another node than the command (whose
    filesystem it then does not see). False outside Ray."""
    from algorithms.experiment.distributed import node_id

    here = node_id()
    return here is not None and _DRIVER_NODE[0] is not None and here != _DRIVER_NODE[0]


def _ray_task(task: Callable[[Any], Any], job: Any, driver_node: str | None) -> Any:
    _DRIVER_NODE[0] = driver_node
    single_threaded()
    return task(job)


@contextlib.contextmanager
def _stops_unwrapped() -> Iterator[None]:
    """Ray's Cython wait and get run the signal handlers, and wrap the Terminated that ours raises into a
    SystemError ('returned a result with an exception set'): the stop is raised as itself."""
    try:
        yield
    except SystemError as exc:
        if isinstance(exc.__cause__, STOPS):
            raise exc.__cause__ from None
        raise


def _run_on_ray(
    task: Callable[[Any], Any], jobs: Sequence[Any], workers: int, finished: Finished, address: str | None, what: str
) -> None:
    """The jobs as Ray tasks, at most `workers` in flight; a stop cancels the tasks in flight (forced)."""
    from algorithms.experiment.distributed import node_id, ray_session

    with ray_session(address, workers, what) as ray:
        remote = ray.remote(num_cpus=1, max_retries=0)(_ray_task)
        driver = node_id()
        queue = deque(jobs)
        in_flight: dict[Any, Any] = {}
        try:
            while queue or in_flight:
                while queue and len(in_flight) < workers:
                    job = queue.popleft()
                    in_flight[remote.remote(task, job, driver)] = job
                with _stops_unwrapped():
                    ready, _ = ray.wait(list(in_flight), num_returns=1, timeout=1.0)
                for ref in ready:
                    job = in_flight.pop(ref)
                    try:
                        with _stops_unwrapped():
                            result = ray.get(ref)
                    except Exception as exc:  # the task failed on its worker: report it, keep the others going
                        finished(job, None, failure_line(exc))
                        continue
                    finished(job, result, None)
        finally:
            for ref in in_flight:
                ray.cancel(ref, force=True)
