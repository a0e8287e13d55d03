"""GiGPO step-level credit on scripted rollouts that revisit the same observation (by hand)."""

import numpy as np
import pytest

from tests.helpers import make_batch
from vcbm_gym.credit.base import EpisodeBatch
from vcbm_gym.credit.gigpo import discounted_returns
from vcbm_gym.credit.registry import make_rule


def _tabular_batch():
    # Task 0: rollout A visits s0, s1, s0 (rewards 0, 0, 1); rollout B visits s0, s2 (rewards 0, 0).
    # Task 1: one rollout visiting s0 (reward 5): another task, so never grouped with task 0's s0.
    observations = np.array([[[0], [1], [0]], [[0], [2], [9]], [[0], [9], [9]]])
    rewards = np.array([[0, 0, 1.0], [0, 0, 0], [5.0, 0, 0]])
    mask = np.array([[1, 1, 1], [1, 1, 0], [1, 0, 0]], dtype=bool)
    return EpisodeBatch(rewards, mask, group_ids=np.array([0, 0, 1]), observations=observations)


def test_discounted_returns():
    np.testing.assert_allclose(discounted_returns(np.array([0.0, 0.0, 1.0]), 0.5), [0.25, 0.5, 1.0])


def test_step_groups_and_advantages_by_hand_mean_only():
    rule = make_rule("gigpo", step_weight=1.0, gamma=0.5, normalise_std=False)
    batch = _tabular_batch()
    keys = rule.anchor_keys(batch)
    assert keys[0][0] == keys[0][2] == keys[1][0] == keys[2][0] and keys[0][1] != keys[1][1]
    adv = rule.advantages(batch)
    # episode level: G = (1, 0) -> +-0.5; task 1 alone -> 0.
    # step returns (gamma 0.5): A: 0.25, 0.5, 1; B: 0, 0. Step group s0 of task 0 = {0.25, 1, 0},
    # mean 5/12 -> -1/6, +7/12, -5/12. s1 and s2 are singletons -> 0.
    expected = np.array([[0.5 - 1 / 6, 0.5, 0.5 + 7 / 12], [-0.5 - 5 / 12, -0.5, 0.0], [0.0, 0.0, 0.0]])
    np.testing.assert_allclose(adv, expected)


def test_std_normalised_and_weighted():
    rule = make_rule("gigpo", step_weight=0.5, gamma=0.5, normalise_std=True, eps=0.0)
    adv = rule.advantages(_tabular_batch())
    episode = 0.5 / np.sqrt(0.5)  # (1 - 0.5) / std(1, 0; ddof=1)
    step_std = np.sqrt(((1 / 6) ** 2 + (7 / 12) ** 2 + (5 / 12) ** 2) / 2)
    np.testing.assert_allclose(adv[0], [episode - 0.5 * (1 / 6) / step_std, episode, episode + 0.5 * (7 / 12) / step_std])
    np.testing.assert_allclose(adv[1, :2], [-episode - 0.5 * (5 / 12) / step_std, -episode])


def test_token_level_llm_batch_with_anchor_keys():
    # Two rollouts of one task, tokens grouped in turns; reward on the last generated token.
    # Both rollouts see the prompt "start" at turn 0; rollout 0 sees "room" at turns 1 and 2.
    step_turn = np.array([[0, 0, 1, 1, 2], [0, 0, 0, 1, -1]])
    mask = step_turn >= 0
    rewards = np.zeros((2, 5))
    rewards[0, 4] = 1.0
    rewards[1, 3] = 3.0
    batch = EpisodeBatch(
        rewards,
        mask,
        group_ids=np.array([7, 7]),
        step_turn=step_turn,
        extras={"anchor_keys": [["start", "room", "room"], ["start", "hall"]]},
    )
    adv = make_rule("gigpo", step_weight=1.0, gamma=1.0, normalise_std=False).advantages(batch)
    # episode: G = (1, 3) -> -1, +1. Turn returns (gamma 1): r0 = (1, 1, 1), r1 = (3, 3).
    # "start": {1, 3} -> -1, +1; "room": {1, 1} -> 0, 0; "hall" alone -> 0.
    np.testing.assert_allclose(adv[0], [-2, -2, -1, -1, -1])
    np.testing.assert_allclose(adv[1], [2, 2, 2, 1, 0])


def test_missing_anchors_is_a_clear_error():
    batch = make_batch(np.zeros((1, 2)))
    with pytest.raises(ValueError, match="anchor"):
        make_rule("gigpo").advantages(batch)
