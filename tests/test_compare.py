"""`algorithms.compare` (Table II, Figure 1) and its statistics (docs/papers/vcbm.md, "Convergence and statistics")."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy import stats

from algorithms.common.errors import VcbmGymError
from algorithms.experiment.compare import Job, aggregate, build_parser, main, run, table_markdown
from algorithms.experiment.jobs import parse_label
from algorithms.experiment.stats import (
    aggregate_estimates,
    describe,
    fraction_estimate,
    improvement_estimate,
    mann_whitney,
)


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
    assert parse_label("rudder") == ("rudder", None)
    assert parse_label("vcbm-plus") == ("vcbm-plus", None)
    assert parse_label("vcbm+") == ("vcbm+", None)  # the deprecated name, with a "+" in it, is still an algo's name
    assert parse_label("ppo+vcbm_bookmark") == ("ppo", "vcbm_bookmark")
    with pytest.raises(VcbmGymError, match="unknown algo"):
        parse_label("nope")
    for label in ("ppo+", "ppo+a+b"):
        with pytest.raises(VcbmGymError, match="ALGO\\+CREDIT_RULE"):
            parse_label(label)


def _argv(out, seeds, workers=0, max_episodes=60):
    return ["--algos", "mc", "td", "--seeds", str(seeds), "--max-episodes", str(max_episodes), "--workers", str(workers),
            "--out", str(out), "--no-progress"]  # fmt: skip


def test_compare_end_to_end_writes_results_table_and_figure(tmp_path, capsys):
    results = run(_argv(tmp_path, seeds=2, workers=2))
    for name in ("results.json", "table.md", "figure.png", "curves.png", "curves.svg", "run.json"):
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
    assert "| mc | 0/2 | 60–60 |" in table and "enter every statistic here" in table
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


# Fixed numbers: episodes to converge of 20 seeds each; two seeds of each method hit a 5,000-episode cap.
EPISODES_A = [
    1195,
    1199,
    1199,
    1200,
    1200,
    1201,
    1202,
    1202,
    1203,
    1203,
    1204,
    1205,
    1206,
    1207,
    1209,
    1211,
    1230,
    1407,
    5000,
    5000,
]
EPISODES_B = [
    1389,
    1500,
    1700,
    1887,
    1950,
    2010,
    2100,
    2256,
    2256,
    2300,
    2500,
    2686,
    2900,
    3100,
    3365,
    3600,
    4000,
    5000,
    5000,
    1200,
]


def _direct_bootstrap(samples, statistic, n=40_000, seed=7):
    """A bootstrap written out: resample every sample's runs with replacement, percentile interval."""
    rng = np.random.default_rng(seed)
    draws = [np.asarray(s, float)[rng.integers(0, len(s), (n, len(s)))] for s in samples]
    return np.quantile(statistic(*draws), [0.025, 0.975])


def _iqm_by_hand(v):
    v = np.sort(v, axis=-1)
    return v[..., 5:15].mean(axis=-1)  # 20 runs: drop the 5 lowest and the 5 highest


def _poi_by_hand(x, y):
    """P(x < y) + P(x == y) / 2 over all pairs (lower episodes is better)."""
    less = (x[..., :, None] < y[..., None, :]).mean(axis=(-2, -1))
    tie = (x[..., :, None] == y[..., None, :]).mean(axis=(-2, -1))
    return less + 0.5 * tie


def test_aggregate_estimates_match_a_direct_computation():
    x = np.array(EPISODES_A, float)
    agg = aggregate_estimates(EPISODES_A)
    assert agg["iqm"]["estimate"] == pytest.approx(np.sort(x)[5:15].mean()) == pytest.approx(1204.2)
    assert agg["median"]["estimate"] == 1203.5 and agg["mean"]["estimate"] == pytest.approx(x.mean())
    for name, statistic, tolerance in (
        ("iqm", _iqm_by_hand, 0.02),
        ("median", lambda v: np.median(v, axis=-1), 0.01),
        ("mean", lambda v: v.mean(axis=-1), 0.03),
    ):
        low, high = _direct_bootstrap([x], statistic)
        assert agg[name]["ci_low"] <= agg[name]["estimate"] <= agg[name]["ci_high"]
        assert agg[name]["ci_low"] == pytest.approx(low, rel=tolerance), name
        assert agg[name]["ci_high"] == pytest.approx(high, rel=tolerance), name
    # the same numbers always give the same interval (results.json must be reproducible)
    assert aggregate_estimates(EPISODES_A) == agg
    # a sample without spread has a point interval; a single run has none
    assert aggregate_estimates([7, 7, 7])["iqm"] == {"estimate": 7.0, "ci_low": 7.0, "ci_high": 7.0}
    assert aggregate_estimates([7])["mean"] == {"estimate": 7.0, "ci_low": None, "ci_high": None}


def test_probability_of_improvement_is_the_normalised_mann_whitney_u():
    x, y = np.array(EPISODES_A, float), np.array(EPISODES_B, float)
    poi = improvement_estimate(EPISODES_A, EPISODES_B, lower_is_better=True)
    assert poi["estimate"] == pytest.approx(_poi_by_hand(x, y))  # 1200 vs 1200 and 5000 vs 5000 tie
    assert poi["estimate"] == pytest.approx((1 + mann_whitney(EPISODES_A, EPISODES_B)["rank_biserial_r"]) / 2)
    low, high = _direct_bootstrap([x, y], _poi_by_hand)
    assert poi["ci_low"] == pytest.approx(low, abs=0.01) and poi["ci_high"] == pytest.approx(high, abs=0.01)
    reverse = improvement_estimate(EPISODES_B, EPISODES_A, lower_is_better=True)
    assert reverse["estimate"] == pytest.approx(1 - poi["estimate"])
    higher = improvement_estimate(EPISODES_A, EPISODES_B, lower_is_better=False)  # for returns: higher is better
    assert higher["estimate"] == pytest.approx(1 - poi["estimate"])
    separated = improvement_estimate([1, 2, 3], [4, 5, 6], lower_is_better=True)
    assert separated == {"estimate": 1.0, "ci_low": 1.0, "ci_high": 1.0}


def test_fraction_converged_has_the_exact_clopper_pearson_interval():
    f = fraction_estimate(18, 20)
    assert f["estimate"] == 0.9
    assert f["ci_low"] == pytest.approx(stats.beta.ppf(0.025, 18, 3))
    assert f["ci_high"] == pytest.approx(stats.beta.ppf(0.975, 19, 2))
    assert fraction_estimate(20, 20)["ci_high"] == 1.0


def test_results_and_table_give_iqm_and_probability_of_improvement_with_cis(tmp_path):
    """compare's results.json and table.md on fixed per-seed outcomes (no training)."""
    args = build_parser().parse_args(["--algos", "vcbm", "rudder", "--seeds", "20", "--out", str(tmp_path)])
    jobs, summaries = [], {}
    for label, episodes in (("vcbm", EPISODES_A), ("rudder", EPISODES_B)):
        for seed, n in enumerate(episodes):
            job = Job(label, seed, tmp_path / label / f"seed{seed}", None)
            converged = n < 5000
            jobs.append(job)
            summaries[job] = {
                "converged": converged,
                "episodes_to_converge": n if converged else None,
                "episodes_run": n,
                "final_correct_rate": 0.95,
            }
    results = aggregate(args, jobs, summaries)
    vcbm = results["algos"]["vcbm"]["aggregate"]
    assert vcbm["iqm"]["estimate"] == pytest.approx(1204.2)
    assert vcbm["fraction_converged"]["estimate"] == 0.9
    poi = results["probability_of_improvement"]["vcbm_vs_rudder"]
    assert poi["estimate"] == pytest.approx(_poi_by_hand(np.array(EPISODES_A, float), np.array(EPISODES_B, float)))
    table = table_markdown(results)
    iqm = vcbm["iqm"]
    assert (
        f"| vcbm | 1,203.5 [{vcbm['median']['ci_low']:,.1f}, {vcbm['median']['ci_high']:,.1f}] | "
        f"1,204.2 [{iqm['ci_low']:,.1f}, {iqm['ci_high']:,.1f}] |" in table
    )
    interval = f"{poi['estimate']:.3f} [{poi['ci_low']:.3f}, {poi['ci_high']:.3f}]"
    assert f"probability of improvement P(vcbm < rudder) = {interval}" in table
    assert "90.0% [68.3%, 98.8%]" in table  # 18/20 converged, exact CI
    assert "with the cap, a lower bound" in table and "IQM" in table
    assert results["bootstrap"]["library"] == "scipy.stats.bootstrap"


def test_an_env_without_the_convergence_criterion_is_refused_before_any_run(tmp_path, capsys):
    """CartPole reports no first_decision_optimal: its runs train for their budget with null convergence
    fields, which compare cannot turn into episodes to converge; one line, nothing run."""
    argv = ["--env", "CartPole-v1", "--algos", "ppo", "--seeds", "2", "--max-episodes", "5", "--workers", "0",
            "--out", str(tmp_path), "--no-progress"]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "'CartPole-v1'" in err and "first_decision_optimal" in err
    assert not (tmp_path / "ppo").exists() and not (tmp_path / "results.json").exists()


def test_an_llm_algo_is_refused_before_any_run(tmp_path, capsys):
    """An LLM run's summary has no episodes to converge: compare would train every seed, then fail."""
    pytest.importorskip("trl")
    # loop alone: no tabular algo resolves on TextWatchRepair's Text observation (refused with its own line)
    argv = ["--env", "TextWatchRepair-v0", "--algos", "loop", "--seeds", "2", "--workers", "0",
            "--out", str(tmp_path), "--no-progress"]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--algos loop" in err and "benchmarks/llm_learning.py" in err
    assert not (tmp_path / "loop").exists() and not (tmp_path / "vcbm").exists()


def test_aggregate_refuses_summaries_with_null_convergence_fields(tmp_path):
    """A summary of a run without the criterion (found in --out, say) fails with one line naming the env
    and the key, not with float(None)."""
    args = build_parser().parse_args(["--env", "CartPole-v1", "--algos", "ppo", "--seeds", "1", "--out", str(tmp_path)])
    job = Job("ppo", 0, tmp_path / "ppo" / "seed0", None)
    summary = {"converged": None, "episodes_to_converge": None, "episodes_run": 5, "final_correct_rate": None,
               "mean_return_last_episodes": 21.0}  # fmt: skip
    with pytest.raises(VcbmGymError, match=r"env 'CartPole-v1' reports no info\['first_decision_optimal'\].*ppo seed 0"):
        aggregate(args, [job], {job: summary})


@pytest.mark.parametrize("algos", [["bogus"], ["mc", "td+bogus_rule"]], ids=["unknown-algo", "unknown-credit-rule"])
def test_bad_algos_leave_nothing_on_disk(tmp_path, capsys, algos):
    """Every algo is resolved before --out is created: a refused compare leaves neither --out nor its lock."""
    out = tmp_path / "new" / "out"
    assert main(["--algos", *algos, "--seeds", "1", "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("error: ") and "bogus" in err, err
    assert not (tmp_path / "new").exists()
