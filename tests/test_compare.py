"""`algorithms.compare` (Table II, Figure 1) and its statistics (docs/papers/vcbm.md, "Convergence and statistics")."""

from __future__ import annotations

import json
import math

import pytest
from scipy import stats

from algorithms.common.errors import VcbmGymError
from algorithms.compare import algo_argv, run
from algorithms.stats import describe, mann_whitney


def test_mann_whitney_equals_scipy_and_a_hand_computation():
    x, y = [1.0, 2.0, 3.0], [2.5, 4.0, 5.0]
    result = mann_whitney(x, y)
    # U counts the pairs (x_i, y_j) with x_i > y_j: only (3, 2.5).
    assert result["U"] == 1.0 and result["U_min"] == 1.0
    sigma = math.sqrt(3 * 3 * 7 / 12)
    assert result["z"] == pytest.approx((1 - 4.5) / sigma)
    assert result["rank_biserial_r"] == pytest.approx(1 - 2 / 9)
    reference = stats.mannwhitneyu(x, y, alternative="two-sided", method="asymptotic", use_continuity=False)
    assert result["U"] == reference.statistic and result["p"] == pytest.approx(reference.pvalue, rel=1e-12)
    assert result["p"] == pytest.approx(2 * stats.norm.sf(abs(result["z"])), rel=1e-12)


def test_mann_whitney_tie_correction_matches_scipy_p():
    x, y = [1, 2, 2, 2, 5, 7], [2, 3, 3, 6, 8, 8, 9]
    result = mann_whitney(x, y)
    reference = stats.mannwhitneyu(x, y, alternative="two-sided", method="asymptotic", use_continuity=False)
    assert result["U"] == reference.statistic
    assert result["p"] == pytest.approx(reference.pvalue, rel=1e-12)
    assert result["p"] == pytest.approx(2 * stats.norm.sf(abs(result["z"])), rel=1e-12)  # z carries the tie correction
    untied = math.sqrt(6 * 7 * 14 / 12)
    assert abs(result["z"]) > abs((result["U"] - 21) / untied)  # ties shrink sigma


def test_mann_whitney_reproduces_the_papers_z_for_u_19():
    # 20 + 20 seeds, one sample entirely below the other except 19 inverted pairs.
    x = list(range(1, 20)) + [40]  # 40 exceeds 19 of the y values (21..39)
    y = list(range(21, 40)) + [41]
    result = mann_whitney(x, y)
    assert result["U"] == 19
    assert result["z"] == pytest.approx(-4.90, abs=0.005)
    assert result["rank_biserial_r"] == pytest.approx(0.905)
    assert result["p"] < 0.001


def test_describe_uses_the_sample_std():
    d = describe([1, 2, 3, 10])
    assert (d["min"], d["max"], d["median"], d["mean"]) == (1, 10, 2.5, 4)
    assert d["std"] == pytest.approx(math.sqrt(((1 - 4) ** 2 + 4 + 1 + 36) / 3))


def test_algo_specs_with_a_credit_rule():
    assert algo_argv("rudder") == ["--algo", "rudder"]
    assert algo_argv("ppo+vcbm_bookmark") == ["--algo", "ppo", "--credit", "vcbm_bookmark"]
    with pytest.raises(VcbmGymError, match="unknown algo"):
        algo_argv("nope")
    with pytest.raises(VcbmGymError, match="ALGO\\+CREDIT_RULE"):
        algo_argv("ppo+")


def _argv(out, seeds, workers=0, max_episodes=60):
    return ["--algos", "mc", "td", "--seeds", str(seeds), "--max-episodes", str(max_episodes), "--workers", str(workers),
            "--out", str(out), "--no-progress"]  # fmt: skip


def test_compare_end_to_end_writes_results_table_and_figure(tmp_path, capsys):
    results = run(_argv(tmp_path, seeds=2, workers=2))
    for name in ("results.json", "table.md", "figure.png"):
        assert (tmp_path / name).stat().st_size > 0
    for algo in ("mc", "td"):
        for seed in (0, 1):
            summary = json.loads((tmp_path / algo / f"seed{seed}" / "summary.json").read_text())
            assert summary["seed"] == seed and summary["episodes_run"] == 60
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved == json.loads(json.dumps(results))
    mc = saved["algos"]["mc"]
    # 60 episodes cannot fill the 750-episode window: nothing converges, and that is reported.
    assert mc["converged"] == [False, False] and mc["n_converged"] == 0
    assert mc["episodes_to_converge"] == [None, None] and mc["episodes_for_stats"] == [60, 60]
    assert set(saved["mann_whitney"]) == {"mc_vs_td"}
    table = (tmp_path / "table.md").read_text()
    assert "| mc | 0/2 | 60–60 |" in table and "enter the statistics with the cap" in table
    assert "| Method | Converged | Range | Mean ± std | Median | Final % |" in capsys.readouterr().out


def test_a_resumed_comparison_ends_with_the_same_results(tmp_path):
    uninterrupted, resumed = tmp_path / "a", tmp_path / "b"
    run(_argv(uninterrupted, seeds=2))
    run(_argv(resumed, seeds=1))  # as if killed after the first seed of each algo
    stamp = (resumed / "mc" / "seed0" / "summary.json").stat().st_mtime_ns
    run(_argv(resumed, seeds=2))
    assert (resumed / "mc" / "seed0" / "summary.json").stat().st_mtime_ns == stamp  # reused, not rerun
    assert (uninterrupted / "results.json").read_text() == (resumed / "results.json").read_text()
    # A different episode cap is a different request: that run is redone, not reused.
    run(_argv(resumed, seeds=1, max_episodes=70))
    assert json.loads((resumed / "mc" / "seed0" / "summary.json").read_text())["episodes_run"] == 70
