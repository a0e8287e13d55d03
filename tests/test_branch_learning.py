"""`--credit vineppo` and `--credit rice` learn from a noisy delayed return, and the check fails when their sign is flipped.

The setting and the check are tests/test_llm_learning.py's (TextWatchRepair with the two brands for which repairing
pays, two turns, reward noise 0.5, the warm-started tiny model, 12 iterations of 16 rollouts): the optimal-decision
rate of the last 3 iterations must exceed that of the first 2 by Z = 3 binomial standard errors; here pooled over
three seeds (0, 1, 2: 48 episodes per iteration, the standard error shrunk to match), because one seed's path is
noisy: at seed 0 alone RICE-PO dipped to 0.06 at iteration 3, when the transport turn's entropy overtook the
decision's and the decision lost its anchor on half of the episodes, then ended at 0.88, a rise of 0.28 against
the one-seed bar of 0.30 (measured while writing this test; seeds 1-3 rose to 0.94-1.0). Each rule runs at
its own defaults (VinePPO: K = 9 continuations at each of the 2 turn boundaries; RICE-PO: 4 branches at the one
anchor), so these runs also spend their continuations: VinePPO 16 x 2 x 9 = 288 continuation episodes per
iteration beside the 16 rollouts. The seeds are fixed, so each outcome is the same on every machine with the
same torch; the flipped runs (every advantage times -1) are kept in the suite and must fail the same check.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("trl")

from algorithms.llm.training.loop import LoopTrainer  # noqa: E402
from algorithms.train import run  # noqa: E402
from tests.test_llm_learning import END, ITERATIONS, NOISY, ROLLOUTS, START, Z  # noqa: E402

SEEDS = (0, 1, 2)


def _rates(tmp_path, credit: str) -> np.ndarray:
    """The optimal-decision rate per iteration, averaged over SEEDS."""
    curves = []
    for seed in SEEDS:
        log_dir = tmp_path / f"{credit}-{seed}"
        summary = run(
            ["--algo", "loop", "--env", "TextWatchRepair-v0", "--model", "tiny", "--seed", str(seed), "--no-progress",
             "--iterations", str(ITERATIONS), "--log-dir", str(log_dir), "--credit", credit, "--hyperparams", *NOISY]
        )  # fmt: skip
        history = json.loads((log_dir / "history.json").read_text())
        assert summary["iterations_run"] == ITERATIONS and summary["total_continuation_episodes"] > 0
        curves.append([h["task_goal_completion"] for h in history])
    return np.mean(curves, axis=0)


def rise_beyond_sampling_noise(rates: np.ndarray) -> tuple[bool, float, float]:
    """tests/test_llm_learning.py's check over len(SEEDS) x ROLLOUTS episodes per iteration."""
    n = len(SEEDS) * ROLLOUTS
    start, end = rates[:START].mean(), rates[-END:].mean()
    sigma = np.sqrt(start * (1 - start) / (START * n) + end * (1 - end) / (END * n))
    sigma = max(sigma, np.sqrt(0.25 / (START * n)))
    return bool(end - start > Z * sigma), float(end - start), float(sigma)


def test_the_pooled_tolerance_is_the_binomial_standard_error():
    learnt, rise, sigma = rise_beyond_sampling_noise(np.array([0.5, 0.5] + [0.5] * 7 + [0.9] * 3))
    assert sigma == pytest.approx(np.sqrt(0.25 / 96 + 0.09 / 144)) and rise == pytest.approx(0.4) and learnt
    assert not rise_beyond_sampling_noise(np.array([0.5] * 9 + [0.65] * 3))[0]  # 0.15 < 3 x 0.0665


@pytest.mark.slow
@pytest.mark.parametrize("credit", ["vineppo", "rice"])
def test_a_branch_rule_raises_the_optimal_decision_rate_under_reward_noise(tmp_path, credit):
    rates = _rates(tmp_path, credit)
    assert rates[:START].mean() < 0.75  # it starts undecided between repair and skip
    learnt, rise, sigma = rise_beyond_sampling_noise(rates)
    assert learnt, f"{credit}: rise {rise:.3f} <= 3 x {sigma:.3f}; rates {rates.round(2).tolist()}"


@pytest.mark.slow
@pytest.mark.parametrize("credit", ["vineppo", "rice"])
def test_the_check_fails_when_a_branch_rules_sign_is_flipped(tmp_path, monkeypatch, credit):
    original = LoopTrainer.token_advantages
    monkeypatch.setattr(LoopTrainer, "token_advantages", lambda self, batch: -1.0 * original(self, batch))
    rates = _rates(tmp_path, credit)
    learnt, rise, sigma = rise_beyond_sampling_noise(rates)
    assert not learnt, f"{credit} with flipped advantages still rose {rise:.3f} > 3 x {sigma:.3f}"
