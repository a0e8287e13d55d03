"""benchmarks/branch_credit.py: its per-compute numbers by hand, and its runs are llm_learning's with the branch rule."""

import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("trl")

# imported by its module name (benchmarks/ on sys.path), as the benchmark imports llm_learning
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import branch_credit as bc  # noqa: E402
import llm_learning  # noqa: E402


def _history(rates, continuations, seconds):
    return [
        {"task_goal_completion": r, "continuation_episodes": c, "iteration_time_s": s}
        for r, c, s in zip(rates, continuations, seconds)
    ]


def test_compute_to_target_and_rate_at_loops_compute_by_hand():
    # 10 rollouts per iteration plus 30 continuations: 40, 80, 120, 160 cumulative; wall 2, 4, 6, 8 s
    run = _history([0.5, 0.95, 0.95, 0.95], [30] * 4, [2.0] * 4)
    m = bc.method_numbers([run], rollouts=10, window=2, loop_compute=100.0)
    assert m["iterations_to_90"] == [3] and m["reached_90"] == [True]  # trailing mean of 2 first >= 0.9 at iteration 3
    assert m["compute_to_90"] == [120.0] and m["wall_s_to_90"] == [6.0]
    assert m["rate_at_loop_compute"] == [pytest.approx((0.5 + 0.95) / 2)]  # 80 <= 100 < 120: iteration 2's window
    assert m["episodes_and_continuations_per_iteration"] == 40.0 and m["seconds_per_iteration"] == 2.0
    censored = bc.method_numbers([_history([0.5] * 4, [0] * 4, [1.0] * 4)], 10, 2, 40.0)
    assert censored["reached_90"] == [False] and censored["compute_to_90"] == [40.0]  # at the budget
    assert bc.rate_within(np.array([0.1, 0.2]), np.array([50.0, 100.0]), 10.0, 2) == 0.1  # the first iteration's


def test_branch_methods_are_llm_learnings_runs_with_the_rule():
    setting = bc.SETTINGS["twr-low-reduced"]
    assert setting.seeds == 5 and setting.iterations == llm_learning.SETTINGS["twr-low"].iterations
    loop = bc.run_argv(setting, "loop", 0, 70, Path("x"), [])
    assert loop == llm_learning.run_argv(llm_learning.SETTINGS["twr-low"], "loop", 0, 70, Path("x"), [])
    assert bc.run_argv(setting, "vineppo", 0, 70, Path("x"), []) == [*loop, "--credit", "vineppo"]
    from algorithms.train import resolve_argv

    resolve_argv(bc.run_argv(setting, "rice", 0, 70, Path("x"), []))  # resolves (TextWatchRepair has snapshots)
