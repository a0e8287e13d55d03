"""algorithms.experiment.llm_study's settings on any env: the watch envs' noise scale and turns, every other env's
env_kwargs whole, and a spec's own target rate."""

import pytest

from algorithms.common.errors import VcbmGymError
from algorithms.experiment import llm_study

BUDGET = {"iterations": 40, "turns": 15, "rollouts": 32, "group": 8, "epochs": 2, "learning_rate": 3.0e-4}


def _run(**settings):
    return {"settings": settings, "methods": {"loop": {"algo": "loop"}}}


def test_a_watch_settings_overrides_are_its_turn_key_and_noise_scale():
    twr = llm_study.settings_of(_run(a={"env": "TextWatchRepair-v0", "noise_scale": 0.25, **BUDGET}))["a"]
    workshop = llm_study.settings_of(_run(b={"env": "TextWatchWorkshop-v0", "noise_scale": 0.5, **BUDGET}))["b"]
    assert twr.hyperparams()[:2] == ["env_kwargs={max_turns: 15, noise_scale: 0.25}", "max_turns=15"]
    assert workshop.hyperparams()[0] == "env_kwargs={n_stations: 15, noise_scale: 0.5}"
    assert twr.hyperparams()[2:] == [
        "generation_batch_size=32", "num_generations=8", "num_iterations=2", "learning_rate=0.0003",
    ]  # fmt: skip


def test_any_other_envs_setting_passes_its_env_kwargs_whole_to_the_run():
    from algorithms.train import resolve_argv

    kwargs = {"max_steps": 15, "min_pushes": 1, "max_pushes": 2}
    setting = llm_study.settings_of(_run(s={"env": "Sokoban-v0", "env_kwargs": kwargs, **BUDGET}))["s"]
    assert setting.noise_scale is None
    argv = llm_study.run_argv(setting, llm_study.Method("loop"), 900, 3, __import__("pathlib").Path("unused"))
    assert resolve_argv(argv).config.run.env_kwargs == kwargs


@pytest.mark.parametrize(
    "setting, named",
    [
        ({"env": "Sokoban-v0", "noise_scale": 0.25, **BUDGET}, "env_kwargs"),
        ({"env": "TextWatchRepair-v0", "env_kwargs": {"max_turns": 6}, **BUDGET}, "noise_scale"),
        ({"env": "Sokoban-v0", "env_kwargs": [1, 2], **BUDGET}, "expected a mapping"),
    ],
)
def test_a_setting_without_its_envs_own_key_is_one_line_naming_it(setting, named):
    with pytest.raises(VcbmGymError, match=named):
        llm_study.settings_of(_run(s=setting))


@pytest.mark.parametrize("target", [0, 1.5, "high", True])
def test_a_target_outside_zero_to_one_is_one_line(target):
    with pytest.raises(VcbmGymError, match=r"run.target=.*expected a rate in \(0, 1\]"):
        llm_study.target_of({"target": target})


def test_a_lower_target_times_the_first_window_at_it_under_its_own_keys_and_columns():
    runs = [[{"task_goal_completion": r, "iteration_time_s": 1.0} for r in rates] for rates in ([0.2, 0.6, 0.4], [0.1, 0.3, 0.5])]
    summary = llm_study.summarise_method(runs, window=2, target=0.4)
    assert summary["iterations_to_40"] == [2, 3] and summary["reached_40"] == [True, True]
    assert "iterations_to_90" not in summary
    assert llm_study.target_of({}) == 0.9 and llm_study.target_keys(0.9) == ("iterations_to_90", "reached_90")
    header, _, row = llm_study.method_rows({"sokoban": {"methods": {"loop": summary}}}, window=2, target=0.4)
    assert "| seeds at 40% | iterations to 40% (per seed, * censored) |" in header
    assert "| 2/2 | 2, 3 |" in row
