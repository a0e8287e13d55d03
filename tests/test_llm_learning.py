"""The LLM arm learns from a noisy delayed return, and the check fails when the gradient is wrong.

Setting: TextWatchRepair with only the two brands for which repairing pays (brand_probs 0, 1/2, 1/2,
0), two turns (the decision, then one of transport), and reward noise at half the paper's
(`noise_scale` 0.5: the return's standard deviation around its mean, about 0.5, exceeds the 0.35
that repairing is worth, so a single episode's sign often lies). The warm-started tiny model repairs
about half of the time; LOOP has 12 iterations of 16 rollouts to raise that.

The tolerance is the sampling noise of the measured rates, not a guess: the first 2 iterations (32
episodes) and the last 3 (48 episodes) are binomial samples of the policy's rate, so under a policy
that does not change (advantages zeroed: no gradient) their difference has standard deviation
sqrt(p0 (1 - p0) / 32 + p1 (1 - p1) / 48) <= 0.114, and the test asks for a rise of Z = 3 of those
(one chance in about 700 that a policy that learnt nothing passes). The seeds are fixed, so each
outcome is the same on every machine with the same torch; the two broken gradients (sign flipped,
advantages zeroed) are kept in the suite and must fail the same check.
"""

import json

import numpy as np
import pytest

pytest.importorskip("trl")

from algorithms.llm.training.loop import LoopTrainer  # noqa: E402
from algorithms.train import run  # noqa: E402

NOISY = [
    "env_kwargs={max_turns: 2, noise_scale: 0.5, brand_probs: [0.0, 0.5, 0.5, 0.0]}",
    "max_turns=2",
    "generation_batch_size=16",
    "num_generations=4",
    "learning_rate=1.0e-3",
]
ITERATIONS = 12
START, END = 2, 3  # iterations averaged for the start and the end rate
ROLLOUTS = 16
Z = 3.0


def _rates(tmp_path, name):
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
            str(ITERATIONS),
            "--log-dir",
            str(tmp_path / name),
            "--hyperparams",
            *NOISY,
        ]
    )
    history = json.loads((tmp_path / name / "history.json").read_text())
    assert summary["iterations_run"] == ITERATIONS
    return np.array([h["task_goal_completion"] for h in history])


def rise_beyond_sampling_noise(rates: np.ndarray) -> tuple[bool, float, float]:
    """(rise > Z sigma, rise, sigma): the end rate minus the start rate against their binomial standard error."""
    start, end = rates[:START].mean(), rates[-END:].mean()
    sigma = np.sqrt(start * (1 - start) / (START * ROLLOUTS) + end * (1 - end) / (END * ROLLOUTS))
    sigma = max(sigma, np.sqrt(0.25 / (START * ROLLOUTS)))  # a rate measured at 0 or 1 still has its sampling noise
    return bool(end - start > Z * sigma), float(end - start), float(sigma)


@pytest.mark.slow
def test_loop_raises_the_optimal_decision_rate_under_reward_noise(tmp_path):
    rates = _rates(tmp_path, "loop")
    assert rates[:START].mean() < 0.75  # it starts undecided between repair and skip
    learnt, rise, sigma = rise_beyond_sampling_noise(rates)
    assert learnt, f"rise {rise:.3f} <= {Z} x {sigma:.3f}; rates {rates.round(2).tolist()}"


@pytest.mark.slow
@pytest.mark.parametrize("broken", ["flipped", "zeroed"])
def test_the_check_fails_when_the_advantage_is_wrong(tmp_path, monkeypatch, broken):
    original = LoopTrainer.token_advantages
    scale = -1.0 if broken == "flipped" else 0.0
    monkeypatch.setattr(LoopTrainer, "token_advantages", lambda self, batch: scale * original(self, batch))
    rates = _rates(tmp_path, broken)
    learnt, rise, sigma = rise_beyond_sampling_noise(rates)
    assert not learnt, f"{broken} advantages still rose {rise:.3f} > {Z} x {sigma:.3f}"


def test_the_noise_tolerance_is_the_binomial_standard_error():
    rates = np.array([0.5, 0.5] + [0.5] * 7 + [0.9, 0.9, 0.9])
    learnt, rise, sigma = rise_beyond_sampling_noise(rates)
    assert sigma == pytest.approx(np.sqrt(0.25 / 32 + 0.09 / 48))
    assert rise == pytest.approx(0.4) and learnt
    assert not rise_beyond_sampling_noise(np.array([0.5] * 9 + [0.8] * 3))[0]  # 0.3 < 3 x 0.108
    assert rise_beyond_sampling_noise(np.array([0.0, 0.0] + [1.0] * 10))[2] == pytest.approx(np.sqrt(0.25 / 32))
