import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env as gym_check_env
from stable_baselines3.common.env_checker import check_env as sb3_check_env

import vcbm_gym  # noqa: F401  (registers the envs)
from envs.watch_repair import (
    KEEP,
    REPAIR,
    InvalidActionError,
    WatchRepairEnv,
    WatchRepairParams,
    WatchRepairVectorEnv,
)


def test_make_and_env_checkers_pass():
    env = gym.make("WatchRepair-v0")
    gym_check_env(env.unwrapped)
    sb3_check_env(env.unwrapped)
    assert env.observation_space == gym.spaces.MultiDiscrete([2, 51, 51, 4, 51])


def test_make_without_the_order_wrapper_still_refuses_step_before_reset():
    """WatchRepair-v0 is registered without OrderEnforcing (a cost on a tabular run's hot path): the env refuses it itself."""
    env = gym.make("WatchRepair-v0", disable_env_checker=True)
    assert env.unwrapped is env
    with pytest.raises(RuntimeError, match="before reset"):
        env.step(KEEP)


def test_observations_do_not_alias_each_other_or_the_trajectory():
    """step() hands out rows of one copy per episode: writing into one changes nothing else."""
    env = WatchRepairEnv(horizon=4, render_mode="ansi")
    first, _ = env.reset(seed=1)
    first[:] = -1
    observations = [env.step(REPAIR)[0]]
    observations[0][:] = -1
    observations += [env.step(KEEP)[0] for _ in range(3)]
    assert [obs[4] for obs in observations[1:]] == [2, 3, 4] and observations[-1][0] == 1
    assert env.render().endswith("timestep=4") and "repaired_flag=1" in env.render()
    again = WatchRepairEnv(horizon=4)
    again.reset(seed=1)
    assert [again.step(a)[0].tolist() for a in (REPAIR, KEEP, KEEP, KEEP)][1:] == [o.tolist() for o in observations[1:]]


def test_make_with_module_prefix_needs_no_prior_import():
    code = "import gymnasium as gym; env = gym.make('vcbm_gym:WatchRepair-v0'); print(env.unwrapped.params.horizon)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "50"


def test_paper_constants_give_the_spec_expected_returns():
    params = WatchRepairParams()
    np.testing.assert_allclose(params.expected_repair_return(), [-1.5, 3.5, 3.5, -1.5])
    assert params.optimal_first_action().tolist() == [KEEP, REPAIR, REPAIR, KEEP]


@pytest.mark.parametrize("bad", [2, -1, 7])
def test_invalid_action_is_a_clear_error(bad):
    env = gym.make("WatchRepair-v0")
    env.reset(seed=0)
    with pytest.raises(InvalidActionError, match=rf"invalid action {bad}.*expected 0 \(repair\) or 1"):
        env.step(bad)


def test_vector_env_rejects_invalid_actions():
    venv = WatchRepairVectorEnv(3)
    venv.reset(seed=0)
    with pytest.raises(InvalidActionError, match="invalid action 5"):
        venv.step(np.array([0, 5, 1]))


def test_episode_is_horizon_steps_and_info_marks_the_first_decision():
    env = WatchRepairEnv(horizon=7)
    obs, info = env.reset(seed=3, options={"brand": 1})
    assert obs.tolist() == [0, 0, 0, 1, 0] and info["optimal_first_action"] == REPAIR
    assert "first_decision_optimal" not in info
    obs, reward, terminated, truncated, info = env.step(REPAIR)
    assert obs[0] == 1 and reward < 0 and info["first_decision_optimal"] is True
    for t in range(2, 8):
        obs, reward, terminated, truncated, info = env.step(KEEP)
        assert terminated == (t == 7) and not truncated
        assert ("is_success" in info) == terminated  # SB3's key, on the last step only
    assert obs[4] == 7 and info["first_decision_optimal"] is True and info["is_success"] is True
    with pytest.raises(RuntimeError, match="after the episode ended"):
        env.step(KEEP)


def test_single_env_and_one_wide_vector_env_share_the_dynamics():
    env, venv = WatchRepairEnv(), WatchRepairVectorEnv(1)
    obs, _ = env.reset(seed=11)
    vobs, _ = venv.reset(seed=11)
    actions = np.random.default_rng(0).integers(0, 2, size=50)
    for a in actions:
        assert obs.tolist() == vobs[0].tolist()
        obs, r, term, _, _ = env.step(int(a))
        vobs, vr, vterm, _, _ = venv.step(np.array([a]))
        assert r == vr[0] and term == vterm[0]
    assert term


def _returns(brand: int, first_action: int, n: int, seed: int) -> np.ndarray:
    venv = WatchRepairVectorEnv(n)
    venv.reset(seed=seed, options={"brand": brand})
    total = np.zeros(n)
    actions = np.full(n, first_action)
    for t in range(50):
        _, reward, terminated, _, info = venv.step(actions if t == 0 else np.full(n, KEEP))
        total += reward
    assert terminated.all() and (info["first_action"] == first_action).all()
    return total


@pytest.mark.parametrize("brand", [0, 1, 2, 3])
def test_mean_return_matches_the_analytic_value_within_4_standard_errors(brand):
    n = 20_000
    repaired = _returns(brand, REPAIR, n, seed=100 + brand)
    expected = WatchRepairParams().expected_repair_return()[brand]
    standard_error = repaired.std(ddof=1) / np.sqrt(n)
    assert abs(repaired.mean() - expected) < 4 * standard_error, (repaired.mean(), expected, standard_error)
    # The return's spread is dominated by counter2's 7 * Binomial(50, 0.05) penalty (sd ~10.8).
    assert 10.0 < repaired.std() < 12.5

    kept = _returns(brand, KEEP, n, seed=200 + brand)
    assert np.all(kept == 0.0)


def test_brand_probabilities_are_a_constructor_argument():
    venv = WatchRepairVectorEnv(4000, brand_probs=(0.0, 0.0, 1.0, 0.0))
    obs, info = venv.reset(seed=0)
    assert set(obs[:, 3].tolist()) == {2}
    with pytest.raises(ValueError, match="brand_probs"):
        WatchRepairEnv(brand_probs=(0.5, 0.6, 0.0, 0.0))


def test_vector_env_with_one_seed_per_sub_env_replays_the_single_envs_with_those_seeds():
    seeds = [3, 9, 11]
    venv = WatchRepairVectorEnv(len(seeds))
    vobs, _ = venv.reset(seed=seeds)
    envs = [WatchRepairEnv() for _ in seeds]
    obs = [env.reset(seed=k)[0] for env, k in zip(envs, seeds)]
    actions = np.random.default_rng(1).integers(0, 2, size=(3 * 51, len(seeds)))
    for step, row in enumerate(actions):
        vobs, vreward, vterm, _, vinfo = venv.step(row)
        for i, env in enumerate(envs):
            if step % 51 == 50:  # the vector env's autoreset step
                obs[i], _ = env.reset()
                assert vreward[i] == 0.0 and not vterm[i] and not vinfo["_first_decision_optimal"][i]
            else:
                obs[i], reward, term, _, info = env.step(int(row[i]))
                assert reward == vreward[i] and term == vterm[i]
                # the single env's evaluation keys, in Gymnasium's vector layout (value + "_" mask)
                assert (
                    vinfo["_first_decision_optimal"][i] and vinfo["first_decision_optimal"][i] == info["first_decision_optimal"]
                )
                assert vinfo["_is_success"][i] == ("is_success" in info)
                assert vinfo["is_success"][i] == info.get("is_success", False)
            assert obs[i].tolist() == vobs[i].tolist()
    with pytest.raises(ValueError, match="2 seeds: expected one int or num_envs=3 ints"):
        venv.reset(seed=[1, 2])
