"""benchmarks/episodic_mujoco.py with two engines in one run: every method under sb3 and under sbx, side by side, and
each sbx method's probability of improvement over the same method on sb3 (what keeping sbx as a default rests on)."""

import argparse
import importlib.util
from pathlib import Path

import numpy as np
import pytest

from algorithms.experiment import stats

pytest.importorskip("sbx", reason="the sbx extra is not installed")


@pytest.fixture(scope="module")
def benchmark():
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "episodic_mujoco.py"
    module_spec = importlib.util.spec_from_file_location("episodic_mujoco_engines_under_test", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


def test_two_engines_label_every_method_under_each_and_one_engine_keeps_plain_names(benchmark):
    assert benchmark.labels(["sac", "sac+ircr"], ["sb3", "sbx"]) == {
        "sac": ("sac", "sb3"), "sac+ircr": ("sac+ircr", "sb3"), "sac@sbx": ("sac", "sbx"), "sac+ircr@sbx": ("sac+ircr", "sbx"),
    }  # fmt: skip
    assert benchmark.labels(["sac", "sac-dense"], ["sbx"]) == {"sac": ("sac", "sbx"), "sac-dense": ("sac-dense", "sbx")}
    assert benchmark.method_env("sac-dense@sbx", "EpisodicHopper-v5") == "Hopper-v5"


def _args(engines):
    return argparse.Namespace(envs=["EpisodicHopper-v5"], methods=["sac", "sac+ircr"], engine=engines, steps=2_000,
                              eval_every=1_000, learning_starts=1_000, seeds=2, seed_start=500)  # fmt: skip


def test_each_engines_runs_are_resolved_with_that_engine_and_sb3s_keep_their_config(benchmark, tmp_path):
    both = benchmark.method_jobs(_args(["sb3", "sbx"]), tmp_path)["EpisodicHopper-v5"]
    alone = benchmark.method_jobs(_args(["sb3"]), tmp_path)["EpisodicHopper-v5"]
    assert list(both) == ["sac", "sac+ircr", "sac@sbx", "sac+ircr@sbx"]
    assert both["sac+ircr@sbx"][0].spec.hyperparams["engine"] == "sbx"
    assert both["sac+ircr@sbx"][0].log_dir == tmp_path / "runs" / "EpisodicHopper-v5" / "sac+ircr@sbx" / "seed500"
    assert [job.spec.config_hash for job in both["sac+ircr"]] == [job.spec.config_hash for job in alone["sac+ircr"]]
    assert both["sac"][0].spec.config_hash != both["sac@sbx"][0].spec.config_hash


def test_each_sbx_method_is_compared_with_its_sb3_twin_and_its_own_engines_sac(benchmark, tmp_path):
    finals = {"sac": [100.0, 120.0, 90.0], "sac+ircr": [300.0, 280.0, 260.0],
              "sac@sbx": [150.0, 170.0, 160.0], "sac+ircr@sbx": [250.0, 240.0, 310.0]}  # fmt: skip
    jobs = {}
    for label, values in finals.items():
        jobs[label] = []
        for seed, final in enumerate(values):
            log_dir = tmp_path / label / f"seed{seed}"
            log_dir.mkdir(parents=True)
            np.savez(log_dir / "evaluations.npz", timesteps=np.array([1_000, 2_000]), results=np.array([[0.0], [final]]))
            jobs[label].append(argparse.Namespace(log_dir=log_dir))
    result, _, _ = benchmark.env_results("EpisodicHopper-v5", list(jobs), jobs)
    methods = result["methods"]
    twin = stats.improvement_estimate(np.array(finals["sac+ircr@sbx"]), np.array(finals["sac+ircr"]), False)
    own_sac = stats.improvement_estimate(np.array(finals["sac+ircr@sbx"]), np.array(finals["sac@sbx"]), False)
    assert methods["sac+ircr@sbx"]["p_improvement_over_sb3"]["estimate"] == twin["estimate"]
    assert methods["sac+ircr@sbx"]["p_improvement_over_sac"]["estimate"] == own_sac["estimate"]
    assert methods["sac@sbx"]["p_improvement_over_sb3"]["estimate"] == 1.0  # every sbx seed above every sb3 seed
    assert "p_improvement_over_sb3" not in methods["sac"] and "p_improvement_over_sac" not in methods["sac@sbx"]
    header = benchmark.table({"envs": {"EpisodicHopper-v5": result}}).splitlines()[0]
    assert header.endswith("| P(improvement) over the same method on sb3 [95% CI] |")


def test_sbx_is_the_benchmarks_default_engine_and_the_published_spec_pins_sb3(benchmark):
    from algorithms.experiment import specs

    assert benchmark.parse_args([]).engine == ["sbx"]
    assert benchmark.parse_args(["--engine", "sb3"]).engine == ["sb3"]
    published = specs.load_spec("episodic_mujoco").run["command"]  # its results were made on sb3
    assert published[published.index("--engine") + 1] == "sb3"


def test_the_default_engine_without_the_sbx_extra_is_one_line_naming_it(benchmark, monkeypatch):
    from algorithms.common import extras
    from algorithms.common.errors import VcbmGymError

    monkeypatch.setattr(extras, "missing_module", lambda extra: "sbx" if extra == "sbx" else None)
    with pytest.raises(VcbmGymError, match=r"--engine sbx \(the default; --engine sb3 runs on SB3\) needs the sbx extra"):
        benchmark.parse_args([])
    assert benchmark.parse_args(["--engine", "sb3"]).engine == ["sb3"]
