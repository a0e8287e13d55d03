"""IRCR (vcbm_gym/credit/ircr.py): the normalised episode return, by hand, and through SB3 PPO."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest

from vcbm_gym.credit.base import EpisodeBatch
from vcbm_gym.credit.ircr import IRCRRule, normalised_returns
from vcbm_gym.credit.registry import make_rule


def _batch(returns, lengths=None, baseline=None) -> EpisodeBatch:
    """Episodes whose return sits on their last real step; `lengths` default to 3 steps each of a 4-step row."""
    returns = np.asarray(returns, dtype=float)
    lengths = np.full(len(returns), 3) if lengths is None else np.asarray(lengths)
    mask = np.arange(4)[None, :] < lengths[:, None]
    rewards = np.zeros(mask.shape)
    rewards[np.arange(len(returns)), lengths - 1] = returns
    extras = {} if baseline is None else {"baseline": np.asarray(baseline, dtype=float)}
    return EpisodeBatch(rewards, mask, extras=extras)


def test_normalised_return_by_hand_on_every_real_step():
    rule = IRCRRule()
    batch = _batch([2.0, 4.0, 10.0], lengths=[3, 1, 4])
    rule.observe(batch)
    # G_min = 2, G_max = 10: (2-2)/8 = 0, (4-2)/8 = 0.25, (10-2)/8 = 1
    expected = [[0, 0, 0, 0], [0.25, 0, 0, 0], [1, 1, 1, 1]]
    np.testing.assert_array_equal(rule.advantages(batch), expected)
    # a later batch is normalised over everything in the buffer: (6 - 2) / 8
    later = _batch([6.0])
    rule.observe(later)
    np.testing.assert_array_equal(rule.advantages(later), [[0.5, 0.5, 0.5, 0.0]])


def test_higher_return_gets_more_credit_even_with_negative_returns():
    rule = IRCRRule()
    batch = _batch([-30.0, -10.0, -20.0])
    rule.observe(batch)
    np.testing.assert_array_equal(rule.advantages(batch)[:, 0], [0.0, 1.0, 0.5])


def test_degenerate_scale_gives_no_credit():
    rule = IRCRRule()
    batch = _batch([3.0, 3.0])
    rule.observe(batch)
    np.testing.assert_array_equal(rule.advantages(batch), np.zeros((2, 4)))
    np.testing.assert_array_equal(normalised_returns(np.array([1.0, 5.0]), 2.0, 2.0), [0.0, 0.0])
    # a rounding-sized spread is no spread: no overflow for a return outside it
    np.testing.assert_array_equal(normalised_returns(np.array([0.0, 40.0]), 0.0, 5e-324), [0.0, 0.0])
    np.testing.assert_array_equal(normalised_returns(np.array([3.0, 3.0 + 4e-15]), 3.0, 3.0 + 4e-15), [0.0, 0.0])
    assert rule.summary() == {"buffer_episodes": 2, "return_min": 3.0, "return_max": 3.0}


def test_before_any_observe_the_batch_sets_its_own_scale():
    np.testing.assert_array_equal(IRCRRule().advantages(_batch([1.0, 3.0]))[:, 0], [0.0, 1.0])


def test_fifo_drops_old_returns_and_the_best_episodes_keep_the_top():
    fifo_only = IRCRRule(buffer_episodes=2, top_episodes=0)
    with_best = IRCRRule(buffer_episodes=2, top_episodes=1)
    for rule in (fifo_only, with_best):
        rule.observe(_batch([0.0, 10.0]))
        rule.observe(_batch([4.0, 5.0]))
    assert fifo_only.scale() == (4.0, 5.0)
    assert with_best.scale() == (4.0, 10.0)  # 10 left the FIFO but stays among the best
    np.testing.assert_allclose(with_best.advantages(_batch([4.0, 5.0]))[:, 0], [0.0, 1 / 6])


def test_baselines_on_the_normalised_scale():
    rule = IRCRRule(baseline="given")
    batch = _batch([2.0, 10.0], baseline=[6.0, 6.0])
    rule.observe(batch)
    # (G - V) / (G_max - G_min): (2 - 6) / 8, (10 - 6) / 8
    np.testing.assert_array_equal(rule.advantages(batch)[:, 0], [-0.5, 0.5])
    assert rule.needs() == ("extras['baseline']",)
    with pytest.raises(ValueError, match='baseline="given" reads batch.extras\\["baseline"\\]'):
        rule.advantages(_batch([2.0, 10.0]))
    centred = IRCRRule(baseline="batch_mean")
    batch = _batch([0.0, 1.0, 5.0])
    centred.observe(batch)
    np.testing.assert_allclose(centred.advantages(batch)[:, 0], np.array([0.0, 0.2, 1.0]) - 0.4)


def test_bad_options_and_state_round_trip():
    with pytest.raises(ValueError, match="baseline='bogus'"):
        IRCRRule(baseline="bogus")
    with pytest.raises(ValueError, match="buffer_episodes=0"):
        IRCRRule(buffer_episodes=0)
    rule = make_rule("ircr", buffer_episodes=3, top_episodes=1)
    rule.observe(_batch([1.0, 7.0, 2.0, 3.0]))
    restored = IRCRRule(buffer_episodes=3, top_episodes=1)
    restored.load_state_dict(copy.deepcopy(rule.state_dict()))
    assert restored.scale() == rule.scale() == (2.0, 7.0)
    with pytest.raises(ValueError, match="ircr state keys"):
        restored.load_state_dict({"mean": 0.0})


def test_the_llm_arm_takes_ircr_as_an_advantage_only():
    # IRCR's guidance reward is a reward (LOOP's loss has no estimator to take it); with a baseline it is an advantage
    from algorithms.common.credit_slot import CreditSlot
    from algorithms.llm.config import LLM_CREDIT

    with pytest.raises(ValueError, match="credit rule 'ircr' emits rewards, and the LLM trainer"):
        CreditSlot("ircr", {}).build(LLM_CREDIT)
    assert CreditSlot("ircr", {"ircr": {"baseline": "batch_mean"}}).build(LLM_CREDIT).emission() == "advantages"
    with pytest.raises(ValueError, match="credit rule 'ircr' needs extras\\['baseline'\\]"):
        CreditSlot("ircr", {"ircr": {"baseline": "given"}}).build(LLM_CREDIT)


def test_ppo_takes_the_normalised_returns_as_its_rewards():
    """The rewards PPO's GAE reads are IRCR's guidance rewards of the rollout's episodes (a flipped sign would fail)."""
    from tests.test_sb3_credit import HORIZON, _one_rollout

    model, _, credit = _one_rollout(IRCRRule(), n_envs=2)
    env_returns = credit._env_rewards.T.reshape(-1, HORIZON).sum(axis=1)
    expected = (env_returns - env_returns.min()) / (env_returns.max() - env_returns.min())
    assert env_returns.max() > env_returns.min()
    written = model.rollout_buffer.rewards.T.reshape(-1, HORIZON)
    np.testing.assert_allclose(written, np.repeat(expected, HORIZON).reshape(-1, HORIZON), rtol=1e-5, atol=1e-6)


def test_train_cli_ppo_ircr_runs_end_to_end(tmp_path):
    from algorithms.train import run as train

    argv = ["--algo", "ppo", "--credit", "ircr", "--env", "WatchRepair-v0", "--max-episodes", "128"]
    summary = train(
        [*argv, "--hyperparams", "credit_kwargs={ircr: {baseline: given}}", "--log-dir", str(tmp_path), "--no-progress"]
    )
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert on_disk["credit"] == "ircr" and on_disk["episodes_run"] == 128 == summary["episodes_run"]
    # 32 envs x 100 steps: each rollout holds 64 whole episodes; the run stops inside the second
    # rollout (at its 128th episode), before that rollout reaches the rule
    assert on_disk["credit_summary"]["buffer_episodes"] == 64
    assert on_disk["credit_summary"]["return_min"] < on_disk["credit_summary"]["return_max"]
