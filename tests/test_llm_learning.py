"""The LLM arm learns: a short LOOP run on an easy TextWatchRepair variant raises the optimal-decision rate.

Easy variant: only the two brands for which repairing pays (brand_probs 0, 1/2, 1/2, 0), no reward
noise, two turns. The warm-started tiny model repairs about half of the time; LOOP's gradient must
raise that to at least 0.8 within a few iterations. With the advantage's sign flipped the rate falls
(the policy learns to skip), and with advantages zeroed it stays near its start: both were checked
by hand with `LEARNING_ADVANTAGE_HOOK` below, and `test_the_check_fails_when_the_gradient_is_wrong`
keeps the flipped case in the suite.
"""

import numpy as np
import pytest

pytest.importorskip("trl")

from algorithms.llm.trainer import LoopTrainer  # noqa: E402
from algorithms.train import run  # noqa: E402

EASY = [
    "env_kwargs={max_turns: 2, noise_scale: 0.0, brand_probs: [0.0, 0.5, 0.5, 0.0]}",
    "max_turns=2",
    "learning_rate=1.0e-3",
]


def _rates(tmp_path, name, iterations):
    summary = run(
        [
            "--algo",
            "loop",
            "--env",
            "TextWatchRepair-v0",
            "--model",
            "tiny",
            "--seed",
            "0",
            "--no-progress",
            "--iterations",
            str(iterations),
            "--log-dir",
            str(tmp_path / name),
            "--hyperparams",
            *EASY,
        ]
    )
    import json

    history = json.loads((tmp_path / name / "history.json").read_text())
    assert summary["iterations_run"] == iterations
    return np.array([h["task_goal_completion"] for h in history])


@pytest.mark.slow
def test_loop_raises_the_optimal_decision_rate_on_an_easy_variant(tmp_path):
    rates = _rates(tmp_path, "loop", 12)
    assert rates[:2].mean() < 0.7  # it starts undecided between repair and skip
    assert rates[-3:].mean() >= 0.8


@pytest.mark.slow
def test_the_check_fails_when_the_gradient_is_wrong(tmp_path, monkeypatch):
    original = LoopTrainer.token_advantages
    monkeypatch.setattr(LoopTrainer, "token_advantages", lambda self, batch: -original(self, batch))
    rates = _rates(tmp_path, "flipped", 12)
    assert rates[-3:].mean() < 0.8


def test_the_benchmark_workers_survive_a_parent_that_used_torch_threads():
    """A forked worker hung forever after the parent trained the warm-start (cold cache) on 2 threads."""
    import importlib.util
    from concurrent.futures import TimeoutError
    from pathlib import Path

    import torch

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "llm_learning.py"
    spec = importlib.util.spec_from_file_location("llm_learning_benchmark", path)
    benchmark = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(benchmark)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        x = torch.randn(1500, 1500)
        (x @ x).sum()  # the parent's OpenMP pool is now live
        pool = benchmark.worker_pool(1)
        try:
            assert pool.submit(torch.mm, x, x).result(timeout=120).shape == (1500, 1500)
        except TimeoutError:
            for process in list(pool._processes.values()):
                process.kill()
            raise
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
    finally:
        torch.set_num_threads(threads)
