"""benchmarks/credit_leakage.py scores each batch in the arms' call order: the batch's advantages from the rule's
state after every earlier batch, then the rule learns from it (CreditRule's documented order)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np

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
