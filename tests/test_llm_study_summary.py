"""algorithms.experiment.llm_study's per-method summary: the target criterion per seed and EMPO's cell coverage."""

import numpy as np

from algorithms.experiment import llm_study


def _run(rates, coverage=None):
    rows = [{"task_goal_completion": r, "iteration_time_s": 1.0} for r in rates]
    for row, c in zip(rows, coverage or []):
        row["empo_cell_coverage"] = c
    return rows


def test_cell_coverage_is_each_seeds_mean_over_iterations_and_shown_only_where_ratio_sharing_ran():
    empo = llm_study.summarise_method([_run([0.5, 1.0], [0.2, 0.4]), _run([1.0, 1.0], [0.6, 0.8])], window=1)
    assert np.allclose(empo["empo_cell_coverage"], [0.3, 0.7])
    assert empo["iterations_to_90"] == [2, 1] and empo["reached_90"] == [True, True]
    plain = llm_study.summarise_method([_run([0.5, 1.0]), _run([1.0, 1.0])], window=1)
    assert "empo_cell_coverage" not in plain
    results = {"twr": {"methods": {"grpo": plain, "grpo+empo": empo}}}
    header, _, grpo_row, empo_row = llm_study.method_rows(results, window=1)
    assert header.endswith("EMPO cell coverage (mean, seed range) |")
    assert grpo_row.endswith("| - |")
    assert empo_row.endswith("| 0.500 (0.300-0.700) |")


def test_the_table_has_no_coverage_column_without_ratio_sharing():
    plain = llm_study.summarise_method([_run([1.0, 1.0])], window=1)
    header = llm_study.method_rows({"twr": {"methods": {"loop": plain}}}, window=1)[0]
    assert "coverage" not in header
