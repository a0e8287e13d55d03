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


# --- the LLM arm ----------------------------------------------------------------------------------------------------
# No end-to-end learning test of the two-role LLM team here. One stood here (seed 100, 60 iterations of 32 rollouts,
# a rise of the team's success beyond 3 sigma of its sampling noise): it passed on the machine its seed was picked on
# and failed on another of the same kind at the same commit, where the seed's success stayed at 0.50. Seeds 200-202
# did not rise beyond that noise either, nor did seeds 200-201 at learning rates 2e-3 and 5e-3. That matches
# benchmarks/ccpo_learning.py, where ccpo's team ends at success >= 0.7 on 2 of 10 seeds: the tiny team's learning is
# measured there, across seeds, not asserted on one. The sign of CCPO's credit through the LLM arm is tested in
# parts: the rule above (a flipped sign unlearns), test_two_role.py (the trainer's per-token advantages are the
# rule's centred role rewards) and test_llm_objectives.py (a step raises the log-probability of a positive-advantage
# sequence).
