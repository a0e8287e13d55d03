"""algorithms.experiment.llm_study's runs: what a run prints is kept in its own log dir."""

from __future__ import annotations

import json

from algorithms.experiment import llm_study
from tests.helpers import tiny_llm_argv


def test_what_a_run_prints_is_kept_in_its_log_dir_beside_its_request(tmp_path):
    """The study prints one progress line per run; the run's own lines (its summary, an agent's warning) would
    otherwise be lost."""
    log_dir = tmp_path / "loop" / "seed0"
    argv = tiny_llm_argv("loop", log_dir, hyperparams=["generation_batch_size=4", "num_generations=2"])
    job = llm_study.Job("s", "loop", 0, tuple(argv), str(log_dir), warm_start="none", cost_s=0.0)
    llm_study.train_one(job)
    printed = (log_dir / llm_study.OUTPUT_FILE).read_text()
    assert "log-prob memory estimate: " in printed  # the runner's start-up line, on stderr
    assert (log_dir / "summary.json").is_file()
    assert json.loads((log_dir / "request.json").read_text())["argv"] == argv
