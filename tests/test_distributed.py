"""Seeds as Ray tasks: `compare --backend ray` gives the results of `--backend process`; tune's workers on Ray.

The tests that need Ray skip only when the `distributed` extra is not installed (CI installs it)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path

import pytest

from algorithms.common.errors import VcbmGymError
from algorithms.common.log_dir import finished_summary
from algorithms.experiment import distributed, executor
from algorithms.experiment.compare import make_jobs
from algorithms.experiment.compare import run as compare
from algorithms.experiment.distributed import unpack_dir
from algorithms.experiment.jobs import run_seed
from tests.helpers import descendants, needs_proc, start_module, wait_gone

REPO = Path(__file__).resolve().parents[1]


def _argv(out, seeds, backend, workers=2):
    return [
        "--algos",
        "vcbm",
        "--seeds",
        str(seeds),
        "--workers",
        str(workers),
        "--backend",
        backend,
        "--out",
        str(out),
        "--no-progress",
    ]


@pytest.fixture(scope="module")
def local_ray():
    """One local Ray instance (2 CPUs) for the module; compare and tune use a Ray already initialised."""
    ray = pytest.importorskip("ray", reason="the distributed extra (Ray) is not installed")
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        logging_level="ERROR",
        runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join([str(REPO), *sys.path[1:]])}},
    )
    yield ray
    ray.shutdown()


def test_compare_on_ray_gives_the_process_results_and_resumes(tmp_path, local_ray):
    compare(_argv(tmp_path / "process", 3, "process"))
    ray_out = tmp_path / "ray"
    compare(_argv(ray_out, 2, "ray"))  # as if stopped after two seeds
    stamp = (ray_out / "vcbm" / "seed0" / "summary.json").stat().st_mtime_ns
    compare(_argv(ray_out, 3, "ray"))
    assert (ray_out / "vcbm" / "seed0" / "summary.json").stat().st_mtime_ns == stamp  # reused, not rerun
    assert (ray_out / "results.json").read_text() == (tmp_path / "process" / "results.json").read_text()
    record = json.loads((ray_out / "run.json").read_text())
    assert record["backend"] == "ray" and record["runs_reused"] == 2 and record["runs_run"] == 1


def test_tune_workers_on_ray_share_the_study(tmp_path, local_ray):
    from algorithms.experiment.tune import run as tune

    result = tune(
        [
            "--algo",
            "vcbm",
            "--env",
            "WatchRepair-v0",
            "--trials",
            "3",
            "--seeds-per-trial",
            "1",
            "--max-episodes",
            "300",
            "--backend",
            "ray",
            "--workers",
            "2",
            "--out",
            str(tmp_path),
        ]
    )
    assert result["trials"] == 3 and result["ran"] == 3 and result["states"]["COMPLETE"] == 3


def test_a_task_on_another_node_sends_its_log_dir_back(tmp_path, monkeypatch):
    """No shared filesystem: the task packs the run it wrote on its node, compare unpacks it into --out."""
    args = type(
        "Args",
        (),
        {
            "algos": ["mc"],
            "env": "WatchRepair-v0",
            "seed_start": 0,
            "seeds": 1,
            "max_episodes": 30,
            "hyperparams": [],
            "out": str(tmp_path),
        },
    )()
    (job,) = make_jobs(args)
    assert run_seed(job) is None  # outside Ray (and on compare's node): nothing to send back
    monkeypatch.setattr(distributed, "node_id", lambda: "this-node")
    monkeypatch.setattr(executor, "_DRIVER_NODE", ["another-node"])  # as executor._ray_task records compare's node
    packed = run_seed(job)
    assert packed is not None
    shutil.rmtree(job.log_dir)  # compare's filesystem does not see what the worker wrote
    unpack_dir(packed, job.log_dir)
    summary, why = finished_summary(job.log_dir, job.spec)
    assert why == "" and summary["episodes_run"] == 30


def test_without_ray_the_backend_is_one_clear_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray fails as if it were not installed
    hint = r'--backend ray needs the distributed extra \(ray is not installed\): pip install -e "\.\[distributed\]"'
    with pytest.raises(VcbmGymError, match=hint):
        compare(_argv(tmp_path, 1, "ray"))
    with pytest.raises(VcbmGymError, match="--address 'auto' with --backend process: expected --backend ray"):
        compare([*_argv(tmp_path, 1, "process"), "--address", "auto"])
    with pytest.raises(VcbmGymError, match="--backend 'dask': expected one of process, ray"):
        compare(_argv(tmp_path, 1, "dask"))


def _compare_process(out, *extra):
    argv = ["--algos", "mc", "--max-episodes", "100000", "--no-curves", "--out", str(out), "--no-progress", *extra]
    return start_module("algorithms.compare", *argv)


@needs_proc
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGKILL], ids=["SIGTERM", "SIGKILL"])
def test_a_stopped_or_killed_compare_on_ray_exits_as_on_processes_and_its_local_ray_with_it(tmp_path, signum):
    """ray.init replaced compare's SIGTERM handler with one that exits with 15; and a local Ray instance that
    compare started goes with it, even with a compare killed by SIGKILL (Ray's agents stayed for minutes)."""
    pytest.importorskip("ray", reason="the distributed extra (Ray) is not installed")
    out = tmp_path / "out"
    process = _compare_process(out, "--seeds", "20", "--workers", "1", "--backend", "ray")
    try:
        deadline = time.monotonic() + 240
        while not (out / "mc" / "seed0").is_dir() and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)  # the seed's run has started in a Ray worker
        ray_processes = descendants(process.pid)
        assert process.poll() is None and ray_processes, "compare ended before it could be stopped"
        os.kill(process.pid, signum)
        _, err = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    assert not wait_gone(ray_processes)
    if signum == signal.SIGKILL:
        assert process.returncode == -signal.SIGKILL
        return
    assert process.returncode == 128 + signal.SIGTERM, err
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("stopped: SIGTERM: ") and "run(s) finished" in lines[0], err


@pytest.mark.parametrize(
    "address", ["127.0.0.1:1", "ray://127.0.0.1:1", "192.0.2.1:6379"], ids=["refused", "client", "no-answer"]
)
def test_an_unreachable_ray_address_is_one_line_within_30_s(tmp_path, address):
    """ray.init retries an unreachable cluster for minutes; compare answers within 30 s, before writing --out."""
    pytest.importorskip("ray", reason="the distributed extra (Ray) is not installed")
    process = _compare_process(tmp_path / "out", "--seeds", "1", "--backend", "ray", "--address", address)
    try:
        _, err = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --backend ray: cannot reach Ray at --address"), err
    assert not (tmp_path / "out").exists()
