"""The branch-based credit rules (vcbm_gym/credit/vineppo.py, rice.py): hand-computed cases of their
pure parts, the continuations the LLM arm plays for them (restored from env snapshots, the same prefix), their
compute counted in every iteration's metrics and the run's summary, and the one-line refusals."""

from __future__ import annotations

import json
import math

import gymnasium as gym
import numpy as np
import pytest

import vcbm_gym  # noqa: F401 (registers the envs)
from vcbm_gym.credit.base import EpisodeBatch
from vcbm_gym.credit.registry import make_rule
from vcbm_gym.credit.rice import RICERule, anchor_statistics, choose_anchors, gate_open, rice_turn_credit
from vcbm_gym.credit.vineppo import VinePPORule, monte_carlo_values, vineppo_advantages


# --- VinePPO ------------------------------------------------------------------------------------------------------
def test_vineppo_advantage_is_the_one_step_td_error_of_the_monte_carlo_values():
    # V(s_0) = 0.5, V(s_1) = 0.8, reward only at the last turn: A_0 = 0 + 0.8 - 0.5, A_1 = 1 + 0 - 0.8 (terminal V = 0)
    a = vineppo_advantages(np.array([0.5, 0.8]), np.array([0.0, 1.0]))
    assert a == pytest.approx([0.3, 0.2])
    assert a.sum() == pytest.approx(1.0 - 0.5)  # telescopes to G - V(s_0)
    # rewards along the way: A_t = r_t + V_{t+1} - V_t
    assert vineppo_advantages(np.array([2.0, 1.5, -1.0]), np.array([0.5, 1.0, -2.0])) == pytest.approx([0.0, -1.5, -1.0])


def test_monte_carlo_values_are_branch_means_and_a_turn_without_branches_is_one_line():
    branches = {0: (np.array([1.0, 0.0, 0.5]), np.zeros(3, bool)), 1: (np.array([2.0, 4.0]), np.zeros(2, bool))}
    assert monte_carlo_values(branches, 2) == pytest.approx([0.5, 3.0])
    with pytest.raises(ValueError, match="turn 2 has no continuations"):
        monte_carlo_values(branches, 3)
    with pytest.raises(ValueError, match="expected two equal"):
        vineppo_advantages(np.zeros(2), np.zeros(3))


def _token_batch(extras: dict) -> EpisodeBatch:
    """Two episodes of tokens: episode 0 turns 0,0,(env),1,1; episode 1 turns 0,(env),1,2 then padding."""
    mask = np.array([[1, 1, 0, 1, 1], [1, 0, 1, 1, 0]], bool)
    turns = np.array([[0, 0, 0, 1, 1], [0, 0, 1, 2, -1]])
    rewards = np.zeros((2, 5))
    rewards[0, 4], rewards[1, 3] = 1.0, -1.0
    return EpisodeBatch(rewards=rewards, mask=mask, group_ids=np.array([7, 7]), step_turn=turns, extras=extras)


def test_vineppo_rule_puts_each_turns_advantage_on_its_generated_tokens():
    none = np.zeros(0, bool)
    extras = {
        "turn_rewards": [np.array([0.0, 1.0]), np.array([0.0, 0.0, -1.0])],
        "branches": [
            {0: (np.array([0.0, 1.0]), none), 1: (np.array([1.0, 1.0, 0.0, 0.0]), none)},  # V = 0.5, 0.5
            {0: (np.array([0.0]), none), 1: (np.array([-1.0]), none), 2: (np.array([0.0, -1.0]), none)},  # 0, -1, -0.5
        ],
    }
    a = make_rule("vineppo").advantages(_token_batch(extras))
    # episode 0: A_0 = 0 + 0.5 - 0.5 = 0, A_1 = 1 - 0.5 = 0.5; episode 1: A_0 = -1 - 0, A_1 = -0.5 + 1, A_2 = -1 + 0.5
    assert a == pytest.approx(np.array([[0, 0, 0, 0.5, 0.5], [-1.0, 0, 0.5, -0.5, 0]]))
    assert VinePPORule().branch_points(3) == [(0, 9), (1, 9), (2, 9)]  # K = 9 at every boundary (the paper's)
    with pytest.raises(ValueError, match="continuations=0: expected an integer >= 1"):
        VinePPORule(continuations=0)


# --- RICE-PO ------------------------------------------------------------------------------------------------------
def test_anchors_are_the_most_uncertain_executable_turns():
    entropies = np.array([0.9, 0.3, 1.2, 0.7])
    executable = np.array([True, True, False, True])  # turn 2, the most uncertain, was not an executed action
    assert choose_anchors(entropies, executable, 2).tolist() == [0, 3]
    assert choose_anchors(entropies, executable, 1).tolist() == [0]
    assert choose_anchors(entropies, executable, 9).tolist() == [0, 1, 3]
    assert choose_anchors(np.array([0.5, 0.5, 0.5]), np.ones(3, bool), 1).tolist() == [0]  # a tie: the earlier turn
    assert choose_anchors(entropies, np.zeros(4, bool), 2).tolist() == []


def test_anchor_statistics_by_hand():
    # own outcome 1; branches 0, 1, 1, 0 of which the two 1s repeated the anchor's action
    advantage, influence, residual = anchor_statistics(1.0, np.array([0.0, 1.0, 1.0, 0.0]), np.array([0, 1, 1, 0], bool))
    assert advantage == pytest.approx(1.0 - 0.5)
    assert influence == pytest.approx(math.sqrt(1.0 / 3.0))  # sample std: squared deviations 4 x 0.25 over 3
    assert residual == pytest.approx(0.0)  # 1, 1, 1: the outcome is settled once the action is
    assert gate_open(influence, residual, 0.05, 0.1)
    # the same action gave 1 and 0.2: residual variance (0.4^2 + 0.4^2) / 1 = 0.32, above 0.1: gate shut
    _, _, residual = anchor_statistics(1.0, np.array([0.2, 0.0, 0.0]), np.array([1, 0, 0], bool))
    assert residual == pytest.approx(0.32)
    assert not gate_open(1.0, residual, 0.05, 0.1)
    # no branch repeated the action: the residual is unmeasured, the gate shut
    assert anchor_statistics(0.0, np.array([1.0, 2.0]), np.zeros(2, bool))[2] == math.inf
    assert not gate_open(0.02, 0.0, 0.05, 0.1)  # weak influence
    with pytest.raises(ValueError, match="M >= 2"):
        anchor_statistics(0.0, np.array([1.0]), np.array([True]))


def test_credit_passes_back_only_through_an_open_gate():
    credit = rice_turn_credit(6, np.array([2, 4]), np.array([0.5, -0.2]), np.array([True, False]))
    assert credit.tolist() == [0.5, 0.5, 0.5, 0.0, -0.2, 0.0]  # turns 0-1 share anchor 2's; turn 3 before a shut gate: 0
    assert rice_turn_credit(3, np.array([1]), np.array([0.7]), np.array([False])).tolist() == [0.0, 0.7, 0.0]
    with pytest.raises(ValueError, match="increasing turns"):
        rice_turn_credit(3, np.array([2, 1]), np.array([0.1, 0.1]), np.array([True, True]))


def test_rice_rule_end_to_end_on_tokens():
    extras = {
        "turn_rewards": [np.array([0.0, 1.0]), np.array([0.0, 0.0, -1.0])],
        "branches": [
            {1: (np.array([1.0, 1.0, 0.0, 0.0]), np.array([1, 1, 0, 0], bool))},  # A = 1 - 0.5; residual 0, gate open
            {2: (np.array([-1.0, 0.0]), np.array([0, 0], bool))},  # A = -1 + 0.5; residual unmeasured: gate shut
        ],
    }
    rule = RICERule()
    batch = _token_batch(extras)
    assert rule.advantages(batch) == pytest.approx(np.array([[0.5, 0.5, 0, 0.5, 0.5], [0, 0, 0, -0.5, 0]]))
    rule.observe(batch)
    assert rule.summary()["anchors_scored"] == 2 and rule.summary()["anchor_gates_opened"] == 1
    assert rule.branch_points(4, np.array([0.1, 0.9, 0.5, 0.2]), np.array([1, 0, 1, 1], bool)) == [(2, 4)]


def test_branch_rules_keep_their_compute_through_a_checkpoint():
    rule = RICERule()
    rule.record_compute(extra_env_steps=10, extra_model_calls=12, extra_generated_tokens=70, continuation_episodes=4)
    rule.record_compute(extra_env_steps=1)
    again = RICERule()
    again.load_state_dict(rule.state_dict())
    assert again.summary()["total_extra_env_steps"] == 11 and again.summary()["total_continuation_episodes"] == 4
    with pytest.raises(ValueError, match="expected keys among"):
        rule.record_compute(env_steps=1)


def test_other_arms_refuse_a_branch_rule_in_one_line():
    from algorithms.common.credit_slot import CreditFit
    from vcbm_gym.credit.base import ADVANTAGES

    fit = CreditFit("sb3", "'ppo'", frozenset({"group_ids", "observations"}), frozenset(), frozenset({ADVANTAGES}))
    why = fit.misfit("vineppo")
    assert why is not None and "needs extras['branches']" in why and "\n" not in why


# --- the LLM arm's continuations ------------------------------------------------------------------------------------
def test_a_continuation_from_a_snapshot_replays_the_episode_under_the_same_answers_and_outcome():
    pytest.importorskip("trl")
    from algorithms.llm.generation.rollout import play_continuations, play_episodes
    from algorithms.llm.model.tiny import build_tiny

    _, tok = build_tiny(0)
    answers = [tok(text, add_special_tokens=False)["input_ids"] for text in ("repair()", "wait()")]
    start = tok.convert_tokens_to_ids("<|im_start|>")

    def scripted(contexts):  # repair at the first turn (system, user, assistant headers so far), then wait
        return [(answers[min((c.count(start) - 3) // 2, 1)], [-0.5] * 2) for c in contexts]

    kwargs = {"max_turns": 3, "noise_scale": 1.0}
    BOUNDS = (3, 20_000, False, None)  # max_turns, truncation_chars, lockstep, max_episode_tokens
    envs = [gym.make("TextWatchRepair-v0", **kwargs) for _ in range(4)]
    (episode,) = play_episodes(scripted, tok, envs[:1], [5], max_turns=3, outcome_seeds=[11], snapshots=True)
    assert len(episode.snapshots) == len(episode.turn_rewards) == 3 and episode.effects == ["repair", "wait", "wait"]
    same = play_continuations(scripted, tok, envs[1:], [(episode, 0, None), (episode, 1, None), (episode, 2, None)], *BOUNDS)
    for turn, c in enumerate(same):  # bit-identical: the same prefix, then the same turns and rewards
        assert c.completion_ids == episode.completion_ids and c.messages == episode.messages
        assert c.turn_rewards == episode.turn_rewards[turn:] and c.episode_return == pytest.approx(
            sum(episode.turn_rewards[turn:])
        )
    redrawn = play_continuations(scripted, tok, envs[1:], [(episode, 0, s) for s in (1, 2, 3)], *BOUNDS)
    returns = {round(c.episode_return, 9) for c in redrawn}
    assert len(returns) > 1  # fresh outcome seeds: independent draws of the noisy outcome
    with pytest.raises(ValueError, match="has no snapshot"):
        plain = play_episodes(scripted, tok, envs[:1], [5], max_turns=3)
        play_continuations(scripted, tok, envs[1:], [(plain[0], 1, None)], *BOUNDS)


SMALL = [
    "env_kwargs={max_turns: 2, noise_scale: 0.5, brand_probs: [0.0, 0.5, 0.5, 0.0]}",
    "max_turns=2",
    "generation_batch_size=8",
    "num_generations=4",
    "credit_kwargs={vineppo: {continuations: 3}, rice: {branches: 3}}",
]


@pytest.mark.parametrize("credit", ["vineppo", "rice"])
def test_the_llm_arm_runs_a_branch_rule_and_counts_its_compute(tmp_path, credit):
    pytest.importorskip("trl")
    from algorithms.train import run

    summary = run(
        ["--algo", "loop", "--env", "TextWatchRepair-v0", "--model", "tiny", "--seed", "0", "--no-progress",
         "--iterations", "2", "--log-dir", str(tmp_path), "--credit", credit, "--hyperparams", *SMALL]
    )  # fmt: skip
    history = json.loads((tmp_path / "history.json").read_text())
    assert summary["credit"] == credit and len(history) == 2
    for h in history:
        if credit == "vineppo":  # 8 episodes x 2 turns x K = 3; from turn 0 two steps each, from turn 1 one
            assert h["continuation_episodes"] == 8 * 2 * 3 and h["extra_env_steps"] == 8 * 3 * (2 + 1)
            assert h["extra_model_calls"] == h["extra_env_steps"]  # one generated answer per step
        else:  # M = 3 branches at each episode's one anchor (if it had an executable turn); one entropy pass per episode
            assert h["extra_model_calls"] == h["extra_env_steps"] + 8
            assert h["continuation_episodes"] % 3 == 0 and 0 < h["continuation_episodes"] <= 8 * 3
        assert h["extra_generated_tokens"] > 0 and h["branch_time_s"] > 0
    totals = {k: sum(h[k] for h in history) for k in ("extra_env_steps", "extra_model_calls", "continuation_episodes")}
    for key, total in totals.items():
        assert summary[f"total_{key}"] == total


def test_an_env_without_the_snapshot_protocol_is_refused_at_resolve_time():
    pytest.importorskip("trl")
    from algorithms.common.errors import ConfigError
    from algorithms.llm.resolve import check_branch_env, resolve

    with pytest.raises(ConfigError) as caught:
        check_branch_env("rice", "AppWorld-v0", {})
    line = str(caught.value)
    assert "\n" not in line and "credit='rice' on AppWorld-v0" in line and "offers no snapshot()/restore()" in line
    check_branch_env("loo", "AppWorld-v0", {})  # a rule that branches nothing needs no snapshot
    check_branch_env("vineppo", "TextWatchRepair-v0", {})
    with pytest.raises(ConfigError, match="credit='vineppo' on AppWorld-v0"):
        resolve("loop", "AppWorld-v0", 0, {"credit": "vineppo"})
