"""CCPO end to end on TextThinkSolve-v0: a tabular Thinker trained by REINFORCE on CCPO's Thinker rewards (joint and
solo episodes, the group solo baseline, GRPO advantages without std) learns to pass the record where its note
matters, learns nothing where it does not, and with the advantage's sign flipped learns the opposite."""

from __future__ import annotations

import numpy as np
import pytest

from envs.text_think_solve import HISTORIES, TextThinkSolveEnv, optimal_decision
from envs.text_watch_repair import BRAND_NAMES
from vcbm_gym.credit.ccpo import ccpo_rewards, group_advantages, group_solo_baseline

NOTES = ("informative", "blank")
THOUGHTS_PER_TASK = 4
TASKS_PER_ITERATION = 16
ITERATIONS = 40
LEARNING_RATE = 0.5


def solver(observation: str) -> str:
    """Decodes a note that carries the record; without one it always repairs (right on half of the records)."""
    for brand, name in enumerate(BRAND_NAMES):
        for history, text in enumerate(HISTORIES):
            if f"{name}, {text}" in observation:
                return f"{optimal_decision(brand, history)}()"
    return "repair()"


def note_text(note: int, info: dict) -> str:
    return f"{BRAND_NAMES[info['brand']]}, {HISTORIES[info['history']]}" if NOTES[note] == "informative" else ""


def outcome(env, seed, note=None, solo=False) -> tuple[float, dict]:
    obs, info = env.reset(seed=seed, options={"solo": solo})
    if not solo:
        obs = env.step(note_text(note, info))[0]
    return env.step(solver(obs))[1], info


def train(sign: float) -> np.ndarray:
    """The Thinker's P(informative note) per record after training on sign x CCPO's group advantages."""
    env, rng = TextThinkSolveEnv(), np.random.default_rng(0)
    logits = np.zeros((len(BRAND_NAMES), len(HISTORIES), len(NOTES)))
    for iteration in range(ITERATIONS):
        rows = []  # (record, note, R_joint, R_solo, task)
        for task in range(TASKS_PER_ITERATION):
            seed = iteration * TASKS_PER_ITERATION + task
            for _ in range(THOUGHTS_PER_TASK):
                record = tuple(env.reset(seed=seed)[1][k] for k in ("brand", "history"))
                probs = np.exp(logits[record]) / np.exp(logits[record]).sum()
                note = int(rng.choice(len(NOTES), p=probs))
                r_joint, _ = outcome(env, seed, note)
                r_solo, _ = outcome(env, seed, solo=True)
                rows.append((record, note, r_joint, r_solo, seed))
        records, notes, r_joint, r_solo, groups = zip(*rows)
        thinker, _ = ccpo_rewards(r_joint, group_solo_baseline(r_solo, groups))
        for record, note, advantage in zip(records, notes, sign * group_advantages(thinker, groups)):
            probs = np.exp(logits[record]) / np.exp(logits[record]).sum()
            logits[record] += LEARNING_RATE * advantage * (np.eye(len(NOTES))[note] - probs)
    return np.exp(logits[..., 0]) / np.exp(logits).sum(axis=-1)


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_the_thinker_learns_to_help_where_it_matters_and_a_flipped_sign_unlearns_it(sign):
    p_informative = train(sign)
    skip_records = np.array([[optimal_decision(b, h) == "skip" for h in range(len(HISTORIES))] for b in range(4)])
    # where repair is right the blank note already wins (the Solver repairs): every thought earns the same, no update
    assert np.allclose(p_informative[~skip_records], 0.5)
    if sign > 0:
        assert (p_informative[skip_records] > 0.9).all(), p_informative
    else:
        assert (p_informative[skip_records] < 0.1).all(), p_informative


# --- the LLM arm: two roles of the warm-started tiny model (--algo ccpo) ----------------------------------------
# TextThinkSolve with rule: brand (the brand alone decides; the Solver sees only the note), 32 rollouts per
# iteration (8 tasks x 4), the roles alternating every 10 iterations. The tolerance is the sampling noise of the
# measured success rates, as in tests/test_llm_learning.py: the first START iterations and the last END are binomial
# samples of the team's rate, so under a team that does not change their difference has standard deviation
# sqrt(p0 (1 - p0) / (START x 32) + p1 (1 - p1) / (END x 32)), and the check asks for a rise of Z = 3 of those.
# The seed (100) is the benchmark pilot's (benchmarks/ccpo_learning.py), outside the benchmark's seeds.
LLM_ITERATIONS, LLM_START, LLM_END, LLM_ROLLOUTS, LLM_Z = 60, 2, 5, 32, 3.0


def llm_success(tmp_path, name: str) -> np.ndarray:
    import json

    from algorithms.train import run

    argv = ["--algo", "ccpo", "--env", "TextThinkSolve-v0", "--credit", "ccpo", "--model", "tiny", "--seed", "100"]
    argv += ["--iterations", str(LLM_ITERATIONS), "--no-progress", "--log-dir", str(tmp_path / name), "--hyperparams"]
    run([*argv, "env_kwargs={rule: brand}", "generation_batch_size=32", "num_generations=4", "learning_rate=5.0e-4"])
    return np.array([h["task_goal_completion"] for h in json.loads((tmp_path / name / "history.json").read_text())])


def rise_beyond_sampling_noise(rates: np.ndarray) -> tuple[bool, float, float]:
    start, end = rates[:LLM_START].mean(), rates[-LLM_END:].mean()
    sigma = np.sqrt(start * (1 - start) / (LLM_START * LLM_ROLLOUTS) + end * (1 - end) / (LLM_END * LLM_ROLLOUTS))
    sigma = max(sigma, np.sqrt(0.25 / (LLM_START * LLM_ROLLOUTS)))  # a rate measured at 0 or 1 keeps its noise
    return bool(end - start > LLM_Z * sigma), float(end - start), float(sigma)


@pytest.mark.slow
@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_the_two_role_llm_team_learns_with_ccpo_and_a_flipped_sign_does_not(tmp_path, monkeypatch, sign):
    pytest.importorskip("trl")
    from algorithms.llm.two_role import TwoRoleTrainer

    original = TwoRoleTrainer.token_advantages
    monkeypatch.setattr(TwoRoleTrainer, "token_advantages", lambda self, batch: sign * original(self, batch))
    rates = llm_success(tmp_path, "run")
    learnt, rise, sigma = rise_beyond_sampling_noise(rates)
    assert rates[:LLM_START].mean() < 0.75  # the team starts near chance
    if sign > 0:
        assert learnt, f"rise {rise:.3f} <= {LLM_Z} x {sigma:.3f}; rates {rates.round(2).tolist()}"
    else:
        assert not learnt, f"flipped advantages still rose {rise:.3f} > {LLM_Z} x {sigma:.3f}"
