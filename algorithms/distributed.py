"""Seeds (and tuning workers) as Ray tasks: `compare --backend ray [--address ADDR]`, `tune --backend ray`.

Ray is an optional extra (`pip install -e ".[distributed]"`); without it these backends are one clear error.
With no address a local Ray instance is started for the command (`--workers` CPUs) and stopped after it;
with `--address` (e.g. `auto` on a node of a cluster started with `ray start`, or `ray://HEAD:10001`) the
tasks go to that cluster, whose nodes need this project installed as on the driver.

A compare task is one `algorithms.train` run, exactly as the process backend runs it (same argv, so the
same seed and config hash, the same summary.json and the same results.json). Where the task runs on
another node than compare, its log dir is written there under the same path, then packed and returned
to compare, which unpacks it into --out: --out needs no shared filesystem. A tune task runs a tuning
worker loop against the study's journal file (`algorithms.tune`), which must then be on a filesystem
that every node sees (as Optuna's JournalFileBackend requires of several machines).
"""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import sys
import tarfile
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from algorithms.common.errors import VcbmGymError

INSTALL_HINT = 'pip install -e ".[distributed]"'


def require_ray(what: str) -> Any:
    """The ray module, or one line saying how to install it."""
    try:
        import ray
    except ImportError:
        raise VcbmGymError(f"{what} needs Ray, which is not installed: expected the distributed extra ({INSTALL_HINT})") from None
    return ray


@contextlib.contextmanager
def ray_session(address: str | None, num_cpus: int, what: str) -> Iterator[Any]:
    """Connect to `address`, or start a local Ray instance with `num_cpus` CPUs; stop only what was started here.
    A Ray already initialised in this process (tests, notebooks) is used as it is."""
    ray = require_ray(what)
    if ray.is_initialized():
        yield ray
        return
    kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False, "logging_level": "ERROR"}
    if address is None:
        # a local instance's workers import this project from where this process does
        kwargs.update(num_cpus=num_cpus, runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}})
    try:
        ray.init(address=address, **kwargs)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise VcbmGymError(
            f"{what}: cannot connect to Ray at --address {address!r} ({exc}); expected a running "
            "cluster (ray start --head) or no --address for a local instance"
        ) from None
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
            tar.extractall(tmp, filter="data")
        if path.exists():
            shutil.rmtree(path)
        os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def compare_task(argv: list[str], log_dir: str, driver_node: str | None) -> bytes | None:
    """One compare run as a Ray task: train it; return its packed log dir when compare is on another node."""
    from algorithms.compare import _init_worker, _run_job

    _init_worker()
    _run_job(argv)
    here = _node_id()
    return None if driver_node is not None and here == driver_node else pack_dir(Path(log_dir))


def _node_id() -> str | None:
    try:
        import ray

        return ray.get_runtime_context().get_node_id() if ray.is_initialized() else None
    except Exception:  # outside Ray (a direct call in a test): no node
        return None


def run_jobs_on_ray(todo: list[Any], workers: int, address: str | None, finished: Callable[[Any, str | None], None]) -> None:
    """Run compare's jobs as Ray tasks, at most `workers` in flight; `finished(job, error or None)` for each.
    Ctrl-C or SIGTERM cancels the tasks in flight (forced) before the stop propagates."""
    if not todo:
        return
    with ray_session(address, workers, "--backend ray") as ray:
        task = ray.remote(num_cpus=1, max_retries=0)(compare_task)
        driver = _node_id()
        queue = list(todo)
        in_flight: dict[Any, Any] = {}
        try:
            while queue or in_flight:
                while queue and len(in_flight) < workers:
                    job = queue.pop(0)
                    log_dir = str(Path(job.log_dir).resolve())
                    argv = _absolute_log_dir(list(job.argv), log_dir)
                    in_flight[task.remote(argv, log_dir, driver)] = job
                ready, _ = ray.wait(list(in_flight), num_returns=1, timeout=1.0)
                for ref in ready:
                    job = in_flight.pop(ref)
                    try:
                        packed = ray.get(ref)
                    except Exception as exc:  # the run failed on its worker: report it, keep the others going
                        cause = getattr(exc, "cause", None) or exc
                        last_line = str(cause).strip().splitlines()[-1] if str(cause).strip() else ""
                        finished(job, f"{type(cause).__name__}: {last_line}")
                        continue
                    if packed is not None:
                        unpack_dir(packed, Path(job.log_dir))
                    finished(job, None)
        finally:
            for ref in in_flight:
                ray.cancel(ref, force=True)


def _absolute_log_dir(argv: list[str], log_dir: str) -> list[str]:
    """A Ray worker's working directory is not compare's: its --log-dir is made absolute."""
    index = argv.index("--log-dir")
    return [*argv[: index + 1], log_dir, *argv[index + 2 :]]
