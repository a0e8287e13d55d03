"""TextWatchWorkshop-v0: many bookmarks, one decisive; and the noise scale of the text envs."""

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import vcbm_gym  # noqa: F401
from envs.text_watch_repair import TextWatchRepairEnv
from envs.text_watch_workshop import COSMETIC_TOOLS, MOVEMENT, TextWatchWorkshopEnv
from envs.watch_repair import WatchRepairParams

EXPECTED = WatchRepairParams().expected_repair_return()  # -1.5, 3.5, 3.5, -1.5


def _play(env, seed, movement_call, cosmetic_call="standard()", brand=None):
    obs, _ = env.reset(seed=seed, options=None if brand is None else {"brand": brand})
    infos, total = [], 0.0
    for station in env.unwrapped._stations:
        obs, reward, terminated, _, info = env.step(movement_call if station == MOVEMENT else cosmetic_call)
        infos.append(info)
        total += reward
    assert terminated
    return total, infos, obs


def test_passes_gymnasium_env_checker():
    check_env(TextWatchWorkshopEnv(), skip_render_check=True)


def test_every_valid_turn_is_a_bookmark_and_only_the_movement_decides():
    env = gym.make("TextWatchWorkshop-v0")
    total, infos, final = _play(env, 4, "Action: repair()")
    assert len(infos) == 8 and all(i["state_mutating"] for i in infos)  # 8 bookmarks > top-k 6
    assert sum(i["is_decision_turn"] for i in infos) == 1
    # the bookmark key is the call's own output: the final result is in the observation only
    assert "Final result" in final and not any("Final result" in i["execution_output"] for i in infos)
    brand = infos[0]["brand"]
    movement = next(i for i in infos if i["is_decision_turn"])
    assert "movement is repaired" in movement["execution_output"] and "movement was repaired" in final
    # the cosmetic calls change the watch (their outputs differ) but never the return
    for call in COSMETIC_TOOLS:
        again, _, _ = _play(env, 4, "Action: repair()", cosmetic_call=f"{call}()")
        assert again == total
    assert infos[-1]["task_goal_completion"] == float(EXPECTED[brand] > 0)


def test_cosmetic_outputs_depend_on_the_call():
    env = gym.make("TextWatchWorkshop-v0")
    _, standard, _ = _play(env, 9, "skip()", "standard()")
    _, premium, _ = _play(env, 9, "skip()", "premium()")
    cosmetic = [k for k, i in enumerate(standard) if not i["is_decision_turn"]]
    assert all(standard[k]["execution_output"] != premium[k]["execution_output"] for k in cosmetic)


def test_skip_pays_zero_and_a_missed_decision_fails_the_task_and_is_charged():
    env = gym.make("TextWatchWorkshop-v0")
    total, infos, _ = _play(env, 2, "skip()")
    assert total == 0.0 and infos[-1]["task_goal_completion"] == float(EXPECTED[infos[0]["brand"]] <= 0)
    total, infos, final = _play(env, 2, "I am not sure")  # names neither tool at the movement
    movement = next(i for i in infos if i["is_decision_turn"])
    assert movement["effect"] == "invalid" and not movement["state_mutating"]
    assert total == pytest.approx(-0.2) and infos[-1]["task_goal_completion"] == 0.0 and "never handled" in final


def test_a_tool_of_another_station_is_invalid():
    env = gym.make("TextWatchWorkshop-v0")
    env.reset(seed=0)
    stations = env.unwrapped._stations
    first = stations[0]
    _, _, _, _, info = env.step("premium()" if first == MOVEMENT else "repair()")
    assert info["effect"] == "invalid" and not info["state_mutating"]


@pytest.mark.parametrize("brand", range(4))
def test_noise_scale_keeps_the_mean_and_scales_the_deviation(brand):
    for make in (lambda s: TextWatchWorkshopEnv(noise_scale=s), lambda s: TextWatchRepairEnv(noise_scale=s)):
        returns = {}
        for scale in (0.0, 0.5, 1.0):
            env = make(scale)
            if isinstance(env, TextWatchWorkshopEnv):
                returns[scale], _, _ = _play(env, 7, "repair()", brand=brand)
            else:
                env.reset(seed=7, options={"brand": brand})
                for _ in range(env.max_turns):
                    _, r, *_ = env.step("repair()")
                returns[scale] = r
        expected = 0.1 * EXPECTED[brand]
        assert returns[0.0] == pytest.approx(expected)  # noiseless: the expectation itself
        assert returns[0.5] - expected == pytest.approx(0.5 * (returns[1.0] - expected))  # same draws, half the deviation


def test_noise_scale_one_is_the_paper_distribution():
    env = TextWatchWorkshopEnv()
    rs = np.array([_play(env, s, "repair()", brand=1)[0] for s in range(400)])
    # mean 0.35 within 4 standard errors of the sample
    assert abs(rs.mean() - 0.35) < 4 * rs.std(ddof=1) / np.sqrt(len(rs))


@pytest.mark.parametrize(
    "bad",
    [
        dict(n_stations=1),
        dict(n_stations=11),
        dict(noise_scale=-0.1),
        dict(noise_scale=float("nan")),
        dict(reward_scale=0.0),
        dict(undecided_return=-1.5),  # equal to repairing brand 0: never deciding would tie with a decision
        dict(undecided_return=float("-inf")),
    ],
)
def test_bad_constructor_values_are_refused_with_the_value_named(bad):
    ((key, value),) = bad.items()
    with pytest.raises(ValueError, match=key):
        TextWatchWorkshopEnv(**bad)
    if key != "n_stations":
        with pytest.raises(ValueError, match=key):
            TextWatchRepairEnv(**bad)


def test_text_watch_repair_counts_an_undecided_episode_as_a_failure_and_charges_for_it():
    """Undecided pays undecided_return x reward_scale (-0.2), below skip's 0: the reward tells the two apart."""
    env = TextWatchRepairEnv(max_turns=3)
    env.reset(seed=0)
    for _ in range(3):
        obs, reward, terminated, _, info = env.step("wait()")
    assert terminated and reward == pytest.approx(-0.2)
    assert info["task_goal_completion"] == 0.0 and info["first_decision_optimal"] is False
    assert "no decision was made" in obs
    env = TextWatchRepairEnv(max_turns=3, undecided_return=-5.0)
    env.reset(seed=0)
    assert sum(env.step("inspect()")[1] for _ in range(3)) == pytest.approx(-0.5)
    env.reset(seed=0)
    assert sum(env.step(a)[1] for a in ("inspect()", "skip()", "wait()")) == 0.0  # deciding late is not charged


def test_a_long_s_parses_to_the_documented_tool_name():
    from envs.text_watch_repair import parse_action
    from envs.text_watch_workshop import parse_station_action

    assert parse_action("\u017fkip()") == "skip"  # 'ſkip': IGNORECASE matches it, lower() would keep the 'ſ'
    assert parse_station_action("\u017fkip()", ("repair", "skip")) == "skip"
