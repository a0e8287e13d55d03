"""LinearKeyToDoor-v0 and CreditTree-v0 (envs/key_to_door.py, envs/credit_tree.py; docs/papers/cocoa.md): COCOA's
conveyor semantics step by step, its canonical layout, seeds, the env checkers, and that each env's exact MDP
(vcbm_gym.exact_gradient) is the law the env plays."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env as gym_check_env
from stable_baselines3.common.env_checker import check_env as sb3_check_env

import vcbm_gym  # noqa: F401 (registers the envs)
from envs.credit_tree import CreditTreeEnv
from envs.key_to_door import (
    APPLE_LEFT,
    APPLE_RIGHT,
    DOOR,
    EMPTY,
    KEY,
    OPEN_DOOR,
    PICK_KEY,
    PICK_LEFT,
    PICK_RIGHT,
    TREASURE,
    LinearKeyToDoorEnv,
)
from vcbm_gym.exact_gradient import credit_tree_mdp, evaluate_policy, key_to_door_mdp, sample_episodes, softmax_policy


def _play(env, actions, seed=0):
    """Observations, rewards and the last info of a scripted episode; actions(position, cell) -> action."""
    obs, _ = env.reset(seed=seed)
    observations, rewards, done, info = [obs], [], False, {}
    while not done:
        obs, reward, done, _, info = env.step(actions(int(obs[0]), int(obs[1])))
        observations.append(obs)
        rewards.append(reward)
    return observations, np.array(rewards), info


def _greedy(key: bool, door: bool, apples: bool):
    def act(position, cell):
        if cell == KEY and key:
            return PICK_KEY
        if cell == DOOR and door:
            return OPEN_DOOR
        if cell in (APPLE_LEFT, APPLE_RIGHT) and apples:
            return PICK_LEFT if cell == APPLE_LEFT else PICK_RIGHT
        return OPEN_DOOR if cell == KEY else PICK_KEY  # an action that takes nothing here

    return act


@pytest.mark.parametrize("env_id", ["LinearKeyToDoor-v0", "CreditTree-v0"])
def test_make_and_the_env_checkers_pass(env_id):
    gym_check_env(gym.make(env_id).unwrapped)
    sb3_check_env(gym.make(env_id).unwrapped)


@pytest.mark.parametrize("kwargs", [dict(random_layout=True, length=43), dict(length=103)])
def test_other_settings_pass_the_checker(kwargs):
    gym_check_env(gym.make("LinearKeyToDoor-v0", **kwargs).unwrapped)
    gym_check_env(gym.make("CreditTree-v0", depth=3, leaf_rewards=np.arange(8.0), slip=0.2).unwrapped)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(length=24), r"length=24: expected one of COCOA's conveyor lengths \(23, 43, 63, 83, 103\)"),
        (dict(length=True), "length=True"),
        (dict(distractor_prob=1.5), "distractor_prob=1.5"),
        (dict(layout_seed=-1), "layout_seed=-1"),
        (dict(random_layout="yes"), "random_layout='yes'"),
    ],
)
def test_bad_arguments_are_one_line(kwargs, message):
    with pytest.raises(ValueError, match=message) as excinfo:
        LinearKeyToDoorEnv(**kwargs)
    assert "\n" not in str(excinfo.value)


def test_the_canonical_layout_is_cocoas_draw_with_seed_2022():
    env = LinearKeyToDoorEnv(length=23)
    expected = np.random.default_rng(2022).choice([0, 1, 2], size=20, p=[0.2, 0.4, 0.4])
    assert env.fixed_layout.tolist() == [KEY, *expected.tolist(), DOOR, EMPTY]
    assert env.observation_space == gym.spaces.MultiDiscrete([24, 6, 2])
    assert LinearKeyToDoorEnv(length=23, layout_seed=7).fixed_layout.tolist() != env.fixed_layout.tolist()


def test_key_then_door_pays_the_treasure_on_the_last_step_only():
    env = LinearKeyToDoorEnv(length=43, distractor_prob=0.0)
    observations, rewards, info = _play(env, _greedy(key=True, door=True, apples=False))
    assert len(rewards) == 43 and rewards[:-1].tolist() == [0.0] * 42
    assert rewards[-1] == pytest.approx(0.2 * 23 / 43)
    assert observations[0].tolist() == [0, KEY, 0] and observations[1].tolist() == [1, EMPTY, 1]
    assert observations[42].tolist() == [42, TREASURE, 1] and observations[43].tolist() == [43, EMPTY, 1]
    assert info == {"first_decision_optimal": True, "is_success": True}


@pytest.mark.parametrize("key, door", [(False, True), (True, False)])
def test_no_treasure_without_the_key_or_without_opening(key, door):
    observations, rewards, info = _play(LinearKeyToDoorEnv(length=23), _greedy(key=key, door=door, apples=False))
    assert rewards.sum() == 0.0 and observations[22].tolist() == [22, EMPTY, int(key)]
    assert info == {"first_decision_optimal": key, "is_success": False}


def test_apples_pay_0_1_or_0_9_scaled_and_only_to_their_side():
    env = LinearKeyToDoorEnv(length=63)
    n_apples = int(np.isin(env.fixed_layout, [APPLE_LEFT, APPLE_RIGHT]).sum())
    paid = np.concatenate([_play(env, _greedy(False, False, apples=True), seed=seed)[1] for seed in range(40)])
    paid = paid[paid > 0]
    assert len(paid) == 40 * n_apples
    np.testing.assert_allclose(np.unique(paid), [0.1 * 23 / 63, 0.9 * 23 / 63])
    assert abs(np.mean(paid == paid.min()) - 0.5) < 4 * 0.5 / np.sqrt(len(paid))
    wrong_side = lambda position, cell: PICK_RIGHT if cell == APPLE_LEFT else PICK_LEFT  # noqa: E731
    assert _play(env, wrong_side)[1].sum() == 0.0


def test_a_seed_fixes_the_episode_and_seeds_differ():
    env = LinearKeyToDoorEnv(length=23, random_layout=True)
    act = _greedy(True, True, apples=True)
    first, again, other = (_play(env, act, seed=seed) for seed in (5, 5, 6))
    assert [o.tolist() for o in first[0]] == [o.tolist() for o in again[0]] and first[1].tolist() == again[1].tolist()
    assert [o.tolist() for o in first[0]] != [o.tolist() for o in other[0]]


def test_random_layouts_hold_apples_with_probability_0_8():
    env = LinearKeyToDoorEnv(length=103, random_layout=True)
    cells = np.array([[int(o[1]) for o in _play(env, lambda p, c: OPEN_DOOR, seed=seed)[0][1:-3]] for seed in range(30)])
    share = np.isin(cells, [APPLE_LEFT, APPLE_RIGHT]).mean()
    assert abs(share - 0.8) < 4 * np.sqrt(0.8 * 0.2 / cells.size)
    assert abs(np.mean(cells == APPLE_LEFT) - 0.4) < 4 * np.sqrt(0.4 * 0.6 / cells.size)


def test_the_tree_pays_its_leaf_once_at_the_end_and_slips():
    env = CreditTreeEnv()  # depth 2, leaves (0, 1, 0.5, 0)
    env.reset(seed=0)
    assert env.step(0)[:3] == (1, 0.0, False)
    node, reward, done, _, info = env.step(1)
    assert (node, reward, done, info) == (4, 1.0, True, {"first_decision_optimal": True, "is_success": True})
    env.reset(seed=0)
    env.step(1)
    assert env.step(0)[1:] == (0.5, True, False, {"first_decision_optimal": False, "is_success": False})
    slippery, reached = CreditTreeEnv(slip=0.5), []
    for seed in range(40):
        slippery.reset(seed=seed)
        reached.append(slippery.step(0)[0])
    assert set(reached) == {1, 2}  # action 0 aims at node 1; a slip lands on node 2
    with pytest.raises(ValueError, match="leaf_rewards"):
        CreditTreeEnv(depth=3)


def _env_returns(env, mdp, logits, n_episodes, seed):
    """Episode returns of the softmax policy played on the env itself, its observations mapped to MDP rows."""
    rng, policy, returns = np.random.default_rng(seed), softmax_policy(logits), []
    for episode in range(n_episodes):
        obs, _ = env.reset(seed=seed * 100_003 + episode)
        total, done = 0.0, False
        while not done:
            action = rng.choice(mdp.n_actions, p=policy[mdp.index(obs)])
            obs, reward, done, _, _ = env.step(action)
            total += reward
        mdp.index(obs)  # the terminal observation is a state too
        returns.append(total)
    return np.array(returns)


@pytest.mark.parametrize(
    "env",
    [
        LinearKeyToDoorEnv(length=23),
        LinearKeyToDoorEnv(length=23, random_layout=True),
        CreditTreeEnv(depth=3, leaf_rewards=np.arange(8.0), slip=0.3),
    ],
    ids=["fixed", "random", "tree"],
)
def test_the_mdp_is_the_law_the_env_plays(env):
    """J of the exact MDP = the env's mean return, and = the MDP sampler's, each within 4.5 standard errors."""
    mdp = key_to_door_mdp(env) if isinstance(env, LinearKeyToDoorEnv) else credit_tree_mdp(env)
    logits = np.random.default_rng(1).normal(size=(mdp.n_states, mdp.n_actions))
    values, _ = evaluate_policy(mdp, softmax_policy(logits))
    exact = float(mdp.initial @ values)
    played = _env_returns(env, mdp, logits, 3000, seed=2)
    sampled = sample_episodes(mdp, logits, 20_000, np.random.default_rng(3)).rewards.sum(1)
    for returns in (played, sampled):
        assert abs(returns.mean() - exact) < 4.5 * returns.std() / np.sqrt(len(returns))
    assert abs(played.std() - sampled.std()) < 0.1 * sampled.std()  # the reward's law, not only its mean
