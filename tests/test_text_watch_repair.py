"""TextWatchRepair-v0: Gymnasium compliance, lenient parsing, and where VCBM puts the credit."""

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import vcbm_gym  # noqa: F401  (registers the env ids)
from envs.text_watch_repair import TextWatchRepairEnv, parse_action
from vcbm_gym.credit.base import EpisodeBatch
from vcbm_gym.credit.loo import LeaveOneOutRule
from vcbm_gym.credit.vcbm_blend import VCBMBlendRule


def test_check_env_and_registration():
    env = gym.make("TextWatchRepair-v0")
    check_env(env.unwrapped, skip_render_check=True)
    obs, info = env.reset(seed=0)
    assert env.observation_space.contains(obs)
    assert "repair()" in obs and info["state_mutating"] is False


@pytest.mark.parametrize(
    "text, tool",
    [
        ("repair()", "repair"),
        ("Thought: costs look fine.\nAction: REPAIR()", "repair"),
        ("I will not inspect; skip", "skip"),  # the last tool named wins
        ("wait", "wait"),
        ("repairs are pricey", "invalid"),  # whole words only
        ("", "invalid"),
        ("\x00\u2603 ???", "invalid"),
    ],
)
def test_parse_action_is_lenient(text, tool):
    assert parse_action(text) == tool


def test_only_the_first_decision_mutates_state_and_malformed_text_is_an_observation():
    env = TextWatchRepairEnv(max_turns=6)
    env.reset(seed=3, options={"brand": 1})
    steps = [env.step(a) for a in ("inspect()", "\u2603 nonsense \x00", "repair()", "skip()", "wait()", "wait()")]
    infos = [s[4] for s in steps]
    assert [i["state_mutating"] for i in infos] == [False, False, True, False, False, False]
    assert [i["is_decision_turn"] for i in infos] == [False, False, True, False, False, False]
    assert [i["effect"] for i in infos] == ["inspect", "invalid", "repair", "skip", "wait", "wait"]
    assert steps[1][0].startswith("invalid action")
    assert env.observation_space.contains(steps[1][0])
    assert "bumps" in steps[4][0]  # later turns report transport events
    assert [s[2] for s in steps] == [False] * 5 + [True]
    assert all(s[1] == 0.0 for s in steps[:-1])
    assert infos[-1]["first_decision_optimal"] is True  # brand 1: repair is optimal
    with pytest.raises(RuntimeError):
        env.step("wait()")


def test_return_matches_watch_repair_law():
    """Skipping pays exactly 0; repairing brand 1 pays 0.1 x (28 - 4 - 2.5 - 0.5 - 17.5) = 0.35 in expectation."""
    env = TextWatchRepairEnv()
    skip_returns, repair_returns = [], []
    for seed in range(400):
        for decision, out in (("skip()", skip_returns), ("repair()", repair_returns)):
            env.reset(seed=seed, options={"brand": 1})
            total = sum(env.step(a)[1] for a in [decision] + ["wait()"] * 5)
            out.append(total)
    assert skip_returns == [0.0] * 400
    # sd of one return ~ 0.1 * sqrt(2^2 + 1.5^2 + 7^2 * 50 * 0.05 * 0.95 + ...) ~ 1.1; 4 SE ~ 0.22
    assert np.mean(repair_returns) == pytest.approx(0.35, abs=0.22)


def _scripted_batch(tokens_per_turn=4, env_tokens=3, k=4):
    """K rollouts of one task (brand 1): the decision at turn 0, five read-only wait() turns after.

    Each turn is `tokens_per_turn` generated tokens followed by `env_tokens` masked env tokens.
    """
    env = TextWatchRepairEnv(max_turns=6)
    decisions = ["repair()", "skip()", "repair()", "skip()"][:k]
    rows = []
    for i, decision in enumerate(decisions):
        obs, _ = env.reset(seed=100 + i, options={"brand": 1})
        turn_texts, flags, total = [], [], 0.0
        for action in [decision] + ["wait()"] * 5:
            obs, reward, terminated, _, info = env.step(action)
            turn_texts.append(info["execution_output"])
            flags.append(info["state_mutating"])
            total += reward
        rows.append((turn_texts, np.array(flags), obs, total))
    step_turn = np.repeat(np.arange(6), tokens_per_turn + env_tokens)
    mask = np.tile([True] * tokens_per_turn + [False] * env_tokens, 6)
    rewards = np.zeros((k, len(mask)))
    rewards[:, np.flatnonzero(mask)[-1]] = [r[3] for r in rows]
    return EpisodeBatch(
        rewards=rewards,
        mask=np.tile(mask, (k, 1)),
        group_ids=np.zeros(k, dtype=int),
        step_turn=np.tile(step_turn, (k, 1)),
        turn_flags={"state_mutating": [r[1] for r in rows]},
        turn_texts=[r[0] for r in rows],
        final_texts=[r[2] for r in rows],
    )


def _decision_mass(adv, batch):
    decision = (batch.step_turn == 0) & batch.mask
    return np.abs(adv * decision).sum(axis=1) / np.abs(adv).sum(axis=1)


def test_vcbm_concentrates_advantage_on_the_decision_turn_while_loo_spreads_it():
    batch = _scripted_batch()
    assert np.all(LeaveOneOutRule().advantages(batch).sum(axis=1) != 0)
    # LOO: 4 of the 24 generated tokens are the decision's -> 1/6 of the mass
    np.testing.assert_allclose(_decision_mass(LeaveOneOutRule().advantages(batch), batch), 1 / 6)
    # Paper settings (beta 1, tau 0.5, top-k 6, alpha 0.05), one bookmark per episode. Under the
    # paper's own rule (<= k bookmarks: retrieval skipped, every token at the floor) VCBM equals LOO:
    paper = VCBMBlendRule(beta=1.0, tau=0.5, top_k=6, alpha=0.05)
    np.testing.assert_allclose(paper.advantages(batch), LeaveOneOutRule().advantages(batch))
    # Ranking the lone bookmark instead ("retrieve"): weight 1 on 4 tokens, 0.05 on 20 -> 4 / (4 + 1) = 0.8
    retrieve = VCBMBlendRule(beta=1.0, tau=0.5, top_k=6, alpha=0.05, few_bookmarks="retrieve")
    np.testing.assert_allclose(_decision_mass(retrieve.advantages(batch), batch), 0.8)
    # same total advantage per episode as LOO: the blend moves credit, it does not create it
    np.testing.assert_allclose(retrieve.advantages(batch).sum(axis=1), LeaveOneOutRule().advantages(batch).sum(axis=1))


@pytest.mark.parametrize("env_id", ["TextWatchRepair-v0", "TextWatchWorkshop-v0"])
def test_outcome_seed_draws_the_outcome_apart_from_the_task(env_id):
    """One reset seed fixes the task (brand, prompt); `outcome_seed` gives the transport, the return's noise, its own draw."""

    def repair_episode(seed, options=None):
        env = gym.make(env_id, noise_scale=1.0)
        obs, _ = env.reset(seed=seed, options=options)
        total, done = 0.0, False
        while not done:  # the workshop takes the call of its current station: the last one named that belongs to it
            _, reward, done, _, info = env.step("standard() repair()")
            total += reward
        assert info["effect"] in ("repair", "standard")
        return obs, total

    task_obs, task_return = repair_episode(5)
    assert repair_episode(5) == (task_obs, task_return)  # without the option the reset seed fixes the whole episode
    draws = [repair_episode(5, {"outcome_seed": k}) for k in range(6)]
    assert {obs for obs, _ in draws} == {task_obs}  # the same task
    assert len({ret for _, ret in draws}) == 6  # each outcome its own
    assert repair_episode(5, {"outcome_seed": 3}) == draws[3]  # and fixed by its seed
    with pytest.raises(ValueError, match=r"outcome_seed=-1: expected an integer >= 0"):
        gym.make(env_id).reset(seed=5, options={"outcome_seed": -1})


def test_outcome_seeds_keep_the_return_law():
    """Outcomes drawn from their own seeds have the law of the task-seeded ones: the repair mean within 4 standard errors."""
    env = TextWatchRepairEnv(max_turns=2, noise_scale=1.0)
    returns = []
    for k in range(400):
        env.reset(seed=0, options={"brand": 1, "outcome_seed": k})
        env.step("repair()")
        returns.append(env.step("wait()")[1])
    expected = float(env._expected_repair[1]) * env.reward_scale
    standard_error = np.std(returns, ddof=1) / np.sqrt(len(returns))
    assert abs(np.mean(returns) - expected) < 4 * standard_error, (np.mean(returns), expected, standard_error)
