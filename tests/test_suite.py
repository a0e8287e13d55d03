"""algorithms.suite: bsuite sweeps run through train and the executor, scored by bsuite's own analysis."""

import json
from pathlib import Path

import pytest

pytest.importorskip("bsuite", reason="bsuite is not installed: pip install -e '.[bsuite]'")

from algorithms import bsuite_score  # noqa: E402
from algorithms.experiment import suite  # noqa: E402

# umbrella chains of 3 and 10 steps at the short protocol's 1,000 episodes: under the zoo's bsuite entry (100 warm-up
# transitions, 8 forced visits) VCBM decides within ~100-200 episodes, so its regret per episode is about 0.2 there,
# below bsuite's 0.5; under the paper's 2,000 transitions and 60 visits it never decides on the 3-step chain
SWEEP = ["--experiment", "umbrella_length", "--algos", "vcbm", "--settings", "2", "9", "--episodes", "1000", "--no-progress"]


def _sweep(run_cli, out: Path, *extra: str):
    return run_cli("algorithms.suite", *SWEEP, "--out", str(out), "--workers", "2", *extra, timeout=600)


@pytest.mark.slow
def test_vcbm_solves_short_umbrella_chains_by_bsuites_score_and_the_papers_test_does_not(run_cli, tmp_path):
    """The value test finds the decision that sets have_umbrella; the paper's frequency test calls it noise and
    VCBM then plays at chance (regret per episode about 1, score 0). Scores are bsuite's, of the runs' logs."""
    value = _sweep(run_cli, tmp_path / "value")
    assert value.returncode == 0, value.stderr
    paper = _sweep(run_cli, tmp_path / "paper", "--hyperparams", "causal_test=frequency")
    assert paper.returncode == 0, paper.stderr
    scores = {}
    for name in ("value", "paper"):
        results = json.loads((tmp_path / name / "results.json").read_text())
        algo = results["experiments"]["umbrella_length"]["algos"]["vcbm"]
        logs = sorted((tmp_path / name / "runs").rglob("env_log"))
        assert len(logs) == 2 and algo["score"] == bsuite_score.experiment_score(logs, "umbrella_length")
        assert [row["chain_length"] for row in algo["settings"]] == [3, 10]
        assert "--settings and --episodes" in results["protocol"]
        scores[name] = (algo["score"], [row["mean"] for row in algo["settings"]])
    assert scores["value"][0] == 1.0 and max(scores["value"][1]) < 0.5
    assert scores["paper"][0] == 0.0 and min(scores["paper"][1]) > 0.8
    for name in ("value", "paper"):
        assert (tmp_path / name / "umbrella_length_vcbm.png").is_file()  # bsuite's own learning plot
        assert json.loads((tmp_path / name / "run.json").read_text())["protocol"] == "bsuite"
    again = _sweep(run_cli, tmp_path / "value")  # the same command: every run is reused, nothing is rerun
    assert again.returncode == 0 and "reusing 2 finished run(s) of the same config; 0 to run" in again.stderr
    record = json.loads((tmp_path / "value" / "run.json").read_text())
    assert (record["runs_reused"], record["runs_run"]) == (2, 0) and record["run_time_s_sum"] > 0


@pytest.mark.parametrize(
    "args",
    [
        ["--experiment", "nope", "--algos", "vcbm"],
        ["--experiment", "umbrella_length", "--algos", "loop"],
        ["--experiment", "discounting_chain", "--algos", "vcbm"],  # five actions: VCBM's test compares two
        ["--experiment", "umbrella_length", "--algos", "vcbm", "--settings", "99"],
        ["--experiment", "umbrella_length", "--algos", "vcbm", "--protocol", "long"],
        ["--experiment", "umbrella_length", "--algos", "vcbm", "vcbm"],
        ["--experiment", "umbrella_length", "--algos", "vcbm", "--seeds", "0"],
        ["--experiment", "umbrella_length", "--algos", "vcbm", "--backend", "nope"],
        ["--experiment", "umbrella_length", "--algos", "vcbm", "--address", "127.0.0.1:1"],
    ],
)
def test_bad_input_is_one_line_and_leaves_nothing(run_cli, tmp_path, args):
    out = tmp_path / "out"
    result = run_cli("algorithms.suite", *args, "--out", str(out), timeout=120)
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and result.stderr.startswith("error:"), result.stderr
    assert not out.exists()


def test_protocols_play_bsuites_settings_and_budgets():
    full = suite.protocol_settings("umbrella_length", "bsuite")
    assert [s.bsuite_id for s in full] == [f"umbrella_length/{i}" for i in range(23)]
    assert {s.episodes for s in full} == {10_000}
    assert {s.episodes for s in suite.protocol_settings("discounting_chain", "bsuite")} == {1_000}
    indices, episodes = suite.SHORT_PROTOCOL["umbrella_length"]
    short = suite.protocol_settings("umbrella_length", "short")
    assert [s.bsuite_id for s in short] == [f"umbrella_length/{i}" for i in indices] and {s.episodes for s in short} == {episodes}
    assert suite.protocol_settings("umbrella_length", "short", 7, [4])[0] == suite.Setting("umbrella_length/4", 7)
