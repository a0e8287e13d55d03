"""benchmarks/llm_learning.py: its arithmetic, its refusals, its ablation arguments and its resume rule."""

import importlib
import json
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("trl")

# imported by its module name (benchmarks/ on sys.path), so that the executor's spawned workers, which
# get this sys.path, can unpickle the benchmark's job function and jobs
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
benchmark = importlib.import_module("llm_learning")


def test_iterations_to_target_is_the_first_window_at_the_target_and_censored_otherwise():
    rates = np.array([0.5, 0.8, 0.9, 1.0, 0.9, 0.95, 0.2])
    assert benchmark.iterations_to_target(rates, window=3) == (4, True)  # (0.9 + 1.0 + 0.9) / 3 first reaches 0.9 there
    assert benchmark.iterations_to_target(rates, window=1) == (3, True)
    assert benchmark.iterations_to_target(np.full(6, 0.89), window=2) == (6, False)


def test_makespan_packs_the_longest_runs_first():
    assert benchmark.makespan([10, 10, 10, 10], 2) == 20
    assert benchmark.makespan([30, 10, 10, 10], 2) == 30
    assert benchmark.makespan([5], 4) == 5


def test_the_default_fits_the_documented_budget():
    rows = benchmark.plan(benchmark.DEFAULT_SETTINGS, None, None, None)
    assert benchmark.makespan([r[4] for r in rows], 2) <= 90 * 60
    counts = {(r[0], r[1]) for r in rows}
    assert {("twr-low", m) for m in benchmark.TWR_METHODS} <= counts
    assert {("workshop-low", m) for m in benchmark.ABLATIONS} <= counts
    assert sum(1 for r in rows if r[0] == "twr-paper" and r[1] == "loop") == 10


def test_the_ablations_change_only_their_part_of_the_zoo_blend():
    from algorithms.common.config import parse_overrides, zoo_hyperparams

    zoo = zoo_hyperparams("vcbm-loop", "TextWatchWorkshop-v0")["credit_kwargs"]["vcbm_blend"]

    def blend(method):
        argv = benchmark.method_argv(method, "TextWatchWorkshop-v0", 8)
        assert argv[:2] == ["--algo", "vcbm-loop"]
        return parse_overrides(argv[3:])["credit_kwargs"]["vcbm_blend"]

    assert blend("vcbm-loop/beta0") == {**zoo, "beta": 0.0}
    assert blend("vcbm-loop/no-retrieval") == {**zoo, "top_k": 8, "few_bookmarks": "floor"}
    assert zoo["beta"] > 0 and zoo["top_k"] < 8 and zoo["few_bookmarks"] == "floor"
    assert benchmark.method_argv("loop", "TextWatchWorkshop-v0", 8) == ["--algo", "loop"]


def test_the_no_retrieval_and_beta0_blends_are_loo_on_the_workshop():
    """Every turn of a workshop episode is a bookmark: without retrieval, or with beta 0, Eq. 14 is the LOO advantage."""
    from vcbm_gym.credit.vcbm_blend import blend, retrieval_weights

    rng = np.random.default_rng(0)
    step_turn = np.repeat(np.arange(8), 3)
    mask = np.ones(24, bool)
    keys = rng.normal(size=(8, 16))
    no_retrieval = retrieval_weights(step_turn, mask, list(range(8)), keys, keys[3], top_k=8, few_bookmarks="floor")
    assert np.array_equal(no_retrieval, np.ones(24))
    retrieved = retrieval_weights(step_turn, mask, list(range(8)), keys, keys[3], top_k=6, few_bookmarks="floor")
    assert not np.allclose(retrieved, 1.0)
    assert np.array_equal(blend(0.7, retrieved, 0.0), np.full(24, 0.7))


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--settings", "nope"], "--settings 'nope'"),
        (["--methods", "ppo"], "--methods 'ppo'"),
        (["--seeds", "0"], "--seeds 0"),
        (["--iterations", "3", "--window", "5"], "--iterations 3"),
        (["--settings", "twr-low", "--methods", "vcbm-loop/beta0"], "none of them runs in setting 'twr-low'"),
        (["--hyperparams", "learning_rate=abc"], "learning_rate"),
    ],
)
def test_bad_input_is_one_error_line_and_writes_nothing(tmp_path, capsys, argv, message):
    out = tmp_path / "out"
    assert benchmark.main([*argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and message in err[0]
    assert not out.exists()


@pytest.mark.slow
def test_a_finished_run_is_reused_only_under_the_same_settings(tmp_path):
    out = tmp_path / "out"
    small = ["--settings", "twr-low", "--methods", "loop", "--seeds", "1", "--iterations", "1", "--window", "1"]

    def tiny(*more):
        return ["--hyperparams", "generation_batch_size=4", "num_generations=2", *more, "--out", str(out)]

    first = benchmark.run([*small, *tiny()])
    log = out / "twr-low" / "loop" / "seed0"
    stamp = (log / "summary.json").stat().st_mtime_ns
    assert json.loads((out / "run.json").read_text())["runs_reused"] == 0
    second = benchmark.run([*small, *tiny()])
    assert json.loads((out / "run.json").read_text())["runs_reused"] == 1
    assert (log / "summary.json").stat().st_mtime_ns == stamp
    assert second["settings"] == first["settings"]  # the reused run gives the same results
    benchmark.run([*small, *tiny("learning_rate=1.0e-5")])  # another setting: the run is made again
    assert json.loads((out / "run.json").read_text())["runs_reused"] == 0
    assert (log / "summary.json").stat().st_mtime_ns != stamp
    request = json.loads((log / "request.json").read_text())
    request["warm_start"] = "another-model"
    (log / "request.json").write_text(json.dumps(request))
    benchmark.run([*small, *tiny("learning_rate=1.0e-5")])  # a run of another warm-started model is never reused
    assert json.loads((out / "run.json").read_text())["runs_reused"] == 0
    for name in ("results.json", "results.md", "curves.png", "run.json"):
        assert (out / name).is_file()
    record = json.loads((out / "run.json").read_text())
    assert record["warm_start"] == json.loads((log / "request.json").read_text())["warm_start"] != "another-model"
    assert record["command"].startswith("python benchmarks/llm_learning.py") and "git_commit" in record
