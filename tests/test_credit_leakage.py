"""benchmarks/credit_leakage.py scores each batch in the arms' call order: the batch's advantages from the rule's
state after every earlier batch, then the rule learns from it (CreditRule's documented order)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from tests.helpers import strict_json

REPO = Path(__file__).resolve().parents[1]


def load_benchmark():
    spec = importlib.util.spec_from_file_location("credit_leakage", REPO / "benchmarks" / "credit_leakage.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class RemembersBatches:
    """Puts all of a batch's credit after the decision when it has already observed that batch, else all on it:
    a leakage of 1 means each batch was scored after the rule had learned from it."""

    def __init__(self) -> None:
        self.seen: list[int] = []

    def advantages(self, batch: dict) -> np.ndarray:
        credit = np.zeros((1, 3))
        credit[0, 2 if batch["id"] in self.seen else 0] = 1.0
        return credit

    def observe(self, batch: dict) -> None:
        self.seen.append(batch["id"])


def test_each_batch_is_scored_before_the_rule_learns_from_it(monkeypatch):
    module = load_benchmark()
    monkeypatch.setattr(module, "make_rule", lambda name, env=None, **kwargs: RemembersBatches())
    batches = [{"id": index} for index in range(4)]
    assert module.leakage_of_seed("remembers", None, batches, decision_step=0) == 0.0


def _run_leakage(tmp_path, *extra: str) -> subprocess.CompletedProcess:
    argv = [
        sys.executable, str(REPO / "benchmarks" / "credit_leakage.py"), "--rules", "broadcast", "--seeds", "2",
        "--episodes", "4", "--batch-episodes", "2", "--out", str(tmp_path / "new" / "leakage.json"), *extra,
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)


def test_credit_leakage_refuses_a_decision_step_outside_the_episode(tmp_path):
    done = _run_leakage(tmp_path, "--decision-step", "999")
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --decision-step 999: expected a step inside every episode")
    assert "0 to 49" in lines[0] and not (tmp_path / "new").exists()
    done = _run_leakage(tmp_path, "--decision-step", "49")
    assert done.returncode == 0, done.stderr
    strict_json((tmp_path / "new" / "leakage.json").read_text())


def test_credit_leakage_table_reads_a_null_mean_back():
    row = {"shares": [None, None], "mean": None, "ci_low": None, "ci_high": None, "seconds_per_seed": 0.1}
    assert "n/a (every advantage 0" in load_benchmark().markdown_table("E", {"broadcast": row}, 2)
