"""Seeds as Ray tasks: `compare --backend ray` gives the results of `--backend process`; tune's workers on Ray.

The tests that need Ray skip only when the `distributed` extra is not installed (CI installs it)."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

from algorithms.common.errors import VcbmGymError
from algorithms.compare import make_jobs
from algorithms.compare import run as compare
from algorithms.distributed import compare_task, unpack_dir
from algorithms.train import finished_summary

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
    from algorithms.tune import run as tune

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


def test_a_task_on_another_node_sends_its_log_dir_back(tmp_path):
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
    packed = compare_task(list(job.argv), str(job.log_dir), driver_node="another-node")
    assert packed is not None
    shutil.rmtree(job.log_dir)  # compare's filesystem does not see what the worker wrote
    unpack_dir(packed, job.log_dir)
    summary, why = finished_summary(job.log_dir, job.run)
    assert why == "" and summary["episodes_run"] == 30


def test_without_ray_the_backend_is_one_clear_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray fails as if it were not installed
    hint = r'needs Ray, which is not installed: expected the distributed extra \(pip install -e "\.\[distributed\]"\)'
    with pytest.raises(VcbmGymError, match=hint):
        compare(_argv(tmp_path, 1, "ray"))
    with pytest.raises(VcbmGymError, match="--address 'auto' with --backend process: expected --backend ray"):
        compare([*_argv(tmp_path, 1, "process"), "--address", "auto"])
    with pytest.raises(VcbmGymError, match="--backend 'dask': expected one of process, ray"):
        compare(_argv(tmp_path, 1, "dask"))
