"""The experiment engine: registered specs, their registration, the measures, the verdicts and the verdict table."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from algorithms.common.errors import VcbmGymError
from algorithms.experiment import archive, engine, specs, verdict
from algorithms.experiment.measures import MEASURES
from algorithms.llm.training.loss import OBJECTIVES
from tests.helpers import write_tiny_spec
from vcbm_gym.credit.empo import RATIO_SHARING_MODES
from vcbm_gym.credit.registry import RULES

REPO = Path(__file__).resolve().parents[1]


def test_every_spec_loads_and_every_published_output_belongs_to_one():
    names = specs.spec_names()
    loaded = [specs.load_spec(name) for name in names]
    claims = specs.load_claims()
    published = {spec.results for spec in loaded if spec.results is not None}
    for spec in loaded:
        assert spec.results is None or (REPO / spec.results).exists(), spec.name
        for comparison in spec.comparisons:
            assert comparison.claim in claims, (spec.name, comparison.claim)
    speed = {"llm_throughput", "llm_training_pass", "llm_old_logps", "sac_speed_levers", "sac_speed_levers_cuda", "sbx_speed"}
    for path in sorted((REPO / "benchmarks" / "results").iterdir()):
        relative = path.relative_to(REPO)
        if path.suffix == ".md" and path.with_suffix(".json").exists():
            continue  # a results file's own table
        if path.stem in speed:
            continue  # speed micro-benchmarks: ratios side by side, no claim
        assert relative in published, f"{relative} is published but no experiment spec names it"


def test_every_rule_objective_and_ratio_sharing_of_the_registry_has_a_claim_row():
    names = {name for claim in specs.load_claims().values() for name in claim["names"]}
    shipped = set(RULES) | set(OBJECTIVES) | {"effect"}
    assert shipped - names == set()
    assert set(RATIO_SHARING_MODES) - {"none", "random"} == {"effect"}  # random is EMPO's own ablation


def test_the_verdict_table_has_one_row_per_claim_with_untested_ones():
    all_specs, scores = engine.all_scores()
    claims = specs.load_claims()
    rows = verdict.verdict_rows(all_specs, scores, claims)
    assert [row["claim_id"] for row in rows] == list(claims)
    table = verdict.verdict_table(rows)
    assert table.count("\n") == len(claims) + 2
    by_id = {row["claim_id"]: row for row in rows}
    assert all(row["verdict"] == "untested" for row in rows if not row["tests"])
    untesting = [spec for spec in all_specs if all(c.claim != "empo-effect-cells" for c in spec.comparisons)]
    untested_rows = {row["claim_id"]: row for row in verdict.verdict_rows(untesting, scores, claims) if not row["tests"]}
    assert untested_rows["empo-effect-cells"]["verdict"] == "untested"
    assert "| **untested** |" in verdict.verdict_table(list(untested_rows.values()))
    assert by_id["grpo-group-baseline"]["verdict"] == "reproduced"  # the committed llm_grpo_improves: 10 seeds each
    assert by_id["vcbm-table2"]["verdict"] == "reproduced"  # the committed Table II: 20 seeds each
    headline = verdict.verdict_table(rows, headline_only=True)
    assert "untested" not in headline and "Table II" in headline


def test_detectable_effect_is_the_null_interval_of_the_probability_of_improvement():
    # Var(U / (n1 n2)) = (n1 + n2 + 1) / (12 n1 n2) under no effect: at 20 vs 20, 41 / 4800
    assert verdict.detectable_effect(20, 20) == pytest.approx(1.959964 * math.sqrt(41 / 4800), rel=1e-6)
    assert verdict.detectable_effect(3, 3) == pytest.approx(1.959964 * math.sqrt(7 / 108), rel=1e-6)
    assert verdict.detectable_effect(40, 40) < verdict.detectable_effect(10, 10) < verdict.detectable_effect(3, 3)


@pytest.mark.parametrize(
    ("x", "y", "higher", "expected"),
    [
        ([3.0, 4.0, 5.0], [0.0, 1.0, 2.0], True, "not reproduced"),  # every pair agrees, yet exact p = 0.1 at 3 vs 3
        ([5.0, 6.0, 7.0, 8.0, 9.0], [0.0, 1.0, 2.0, 3.0, 4.0], True, "reproduced"),  # exact p = 2 / 252
        ([5.0, 6.0, 7.0, 8.0, 9.0], [0.0, 1.0, 2.0, 3.0, 4.0], False, "reversed"),  # the same values, lower is better
        ([1.0, 5.0, 2.0, 6.0, 3.0], [4.0, 0.0, 7.0, 2.5, 8.0], True, "not reproduced"),
    ],
)
def test_a_verdict_needs_the_interval_and_the_test_on_the_papers_side(x, y, higher, expected):
    result = verdict._compare_values(x, y, higher_is_better=higher)
    assert result["verdict"] == expected


def test_exact_p_of_three_against_three():
    assert verdict.verdict_p([3.0, 4.0, 5.0], [0.0, 1.0, 2.0]) == pytest.approx(0.1)
    assert verdict.verdict_p([5.0, 6.0, 7.0, 8.0, 9.0], [0.0, 1.0, 2.0, 3.0, 4.0]) == pytest.approx(2 / 252)


def test_the_smallest_attainable_p_says_whether_a_comparison_can_decide():
    assert verdict.smallest_p(3, 3) == pytest.approx(2 / 20)  # 2 / C(6, 3): no outcome of 3 against 3 decides
    assert verdict.smallest_p(4, 4) == pytest.approx(2 / 70)
    assert verdict.smallest_p(3, 2) == pytest.approx(2 / 10)
    apart = verdict._compare_values([3.0, 4.0, 5.0], [0.0, 1.0, 2.0], higher_is_better=True)
    assert not apart["decidable"] and apart["verdict"] == "not reproduced"
    assert verdict._compare_values([4.0, 5.0, 6.0, 7.0], [0.0, 1.0, 2.0, 3.0], True)["decidable"]
    assert verdict._compare_values([0.5] * 12, [0.5] * 12, True)["decidable"]  # ties now, yet other outcomes could decide


def test_the_headline_counts_the_comparisons_too_small_to_decide():
    spec = specs.load_spec("table2")
    small = {"comparison": {"claim": "vcbm-table2", "treatment": "vcbm", "control": "rudder", "setting": None}}
    small |= verdict._compare_values([3.0, 4.0, 5.0], [0.0, 1.0, 2.0], higher_is_better=True)
    large = dict(small) | verdict._compare_values([5.0, 6.0, 7.0, 8.0, 9.0], [0.0, 1.0, 2.0, 3.0, 4.0], True)
    claims = {"vcbm-table2": specs.load_claims()["vcbm-table2"]}
    rows = verdict.verdict_rows([spec], {spec.name: {"comparisons": [small, large]}}, claims)
    headline = verdict.headline_table(rows)
    assert "| **reproduced** | 1 of 2 (1 with too few seeds to decide) |" in headline
    assert "Untested" not in headline  # every claim here has a comparison
    all_claims = verdict.verdict_rows([spec], {spec.name: {"comparisons": [small]}}, specs.load_claims())
    with_untested = verdict.headline_table(all_claims)  # every claim but Table II's has no comparison here
    assert with_untested.rstrip().splitlines()[-1].startswith("Untested so far: ")
    assert "3 vs 3 (too few to decide)" in verdict.verdict_table(rows)
    assert "(too few to decide)<br>5 vs 5 |" in verdict.verdict_table(rows)


def test_the_committed_table_ii_is_scored_from_its_per_seed_episodes():
    spec = specs.load_spec("table2")
    results = json.loads((REPO / "benchmarks/results/table2/results.json").read_text())
    scored = verdict.score(spec)
    (comparison,) = scored["comparisons"]
    vcbm, rudder = results["algos"]["vcbm"]["episodes_for_stats"], results["algos"]["rudder"]["episodes_for_stats"]
    pairs = sum((a < b) + 0.5 * (a == b) for a in vcbm for b in rudder)
    assert comparison["probability_of_improvement"]["estimate"] == pytest.approx(pairs / (len(vcbm) * len(rudder)))
    assert comparison["treatment"]["median"] == pytest.approx(1202.5)  # the published median of VCBM's 20 seeds
    assert scored["status"] == "predates-spec"


def test_a_spec_changed_after_its_first_run_is_never_pooled(tmp_path, capsys):
    spec_file = write_tiny_spec(tmp_path / "mine.yml")
    out = tmp_path / "out"
    assert engine.main(["run", str(spec_file), "--out", str(out), "--workers", "1", "--no-progress"]) == 0
    record = json.loads((out / specs.RECORD_FILE).read_text())
    assert record["spec_hash"] == specs.load_spec(str(spec_file)).hash and record["deviations"] == {}
    assert verdict.score(specs.load_spec(str(spec_file)), out)["status"] == "unregistered"  # outside the repository
    write_tiny_spec(spec_file, budget={"ours": "40 episodes, edited after the run", "paper": "until convergence"})
    capsys.readouterr()
    assert engine.main(["run", str(spec_file), "--out", str(out), "--workers", "1", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "never pooled" in err
    scored = verdict.score(specs.load_spec(str(spec_file)), out)
    assert scored["status"] == "changed" and [c["verdict"] for c in scored["comparisons"]] == ["untested"]
    # a deviating command into the same --out is refused as well: its runs are not the spec's
    assert engine.main(["run", str(spec_file), "--out", str(out), "--seeds", "1", "--no-progress"]) == 2


@pytest.mark.slow
def test_run_table2_gives_the_per_seed_episodes_of_compare(tmp_path):
    from algorithms.experiment import compare

    argv = ["--seeds", "2", "--max-episodes", "150", "--workers", "2", "--no-progress"]
    assert engine.main(["run", "table2", "--out", str(tmp_path / "engine"), *argv]) == 0
    assert compare.main(["--env", "WatchRepair-v0", "--algos", "vcbm", "rudder", "--out", str(tmp_path / "compare"), *argv]) == 0
    via_engine = json.loads((tmp_path / "engine" / "results.json").read_text())
    direct = json.loads((tmp_path / "compare" / "results.json").read_text())
    for algo in ("vcbm", "rudder"):
        for key in ("episodes_to_converge", "final_correct_rate", "seeds"):
            assert via_engine["algos"][algo][key] == direct["algos"][algo][key], (algo, key)
    record = json.loads((tmp_path / "engine" / specs.RECORD_FILE).read_text())
    assert record["deviations"] == {"seeds": 2, "max_episodes": 150}


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        ({"kind": "sweep"}, "kind='sweep'"),
        ({"seeds": {"start": 0, "n": 0}}, "expected start >= 0 and n >= 1"),
        ({"measure": {"name": "vibes"}}, "measure 'vibes'"),
        ({"tuning": {"by": "a pilot", "seeds": {"start": 1, "n": 5}}}, "both chose the settings and test them"),
        ({"budget": {"ours": "x"}}, "budget="),
        ({"comparisons": [{"claim": "x", "treatment": "a"}]}, "expected {claim, treatment, control"),
    ],
)
def test_a_bad_spec_is_one_line_naming_the_field(tmp_path, change, fragment):
    path = write_tiny_spec(tmp_path / "bad.yml", **change)
    with pytest.raises(VcbmGymError, match="experiment spec") as info:
        specs.load_spec(str(path))
    assert fragment in str(info.value) and "\n" not in str(info.value)


def test_plan_prints_cost_and_detectable_effect(capsys):
    assert engine.main(["plan", "table2", "--seeds", "40"]) == 0
    out = capsys.readouterr().out
    assert "80 runs" in out and f"0.5 +- {verdict.detectable_effect(40, 40):.2f}" in out and "core-hours" in out


def test_plan_counts_every_setting_of_a_suites_protocol(capsys):
    pytest.importorskip("bsuite")
    assert engine.main(["plan", "bsuite_umbrella_distract_power"]) == 0
    out = capsys.readouterr().out
    assert "440 runs" in out  # 11 methods x 4 settings of the short protocol x 10 seeds
    assert engine.main(["plan", "bsuite_discounting_chain_power"]) == 0
    assert "1600 runs" in capsys.readouterr().out  # 8 methods x bsuite's 20 settings x 10 seeds


def test_plan_borrows_a_never_run_suites_rate_only_from_the_same_suite_methods_and_episodes():
    pytest.importorskip("bsuite")
    short = specs.load_spec("bsuite_discounting_chain_short")
    rate, source = engine.borrowed_seconds_per_run(specs.load_spec("bsuite_discounting_chain_power"))
    assert source == short.name and rate == engine.measured_seconds_per_run(short)
    # the vcbm-only budget spec plays umbrella_distract's settings too, but other methods: no rate to borrow
    assert engine.borrowed_seconds_per_run(specs.load_spec("bsuite_umbrella_distract_vcbm_budget")) is None
    assert engine.borrowed_seconds_per_run(specs.load_spec("table2")) is None  # not a suite


def test_every_measure_is_named_by_some_spec():
    used = {specs.load_spec(name).measure["name"] for name in specs.spec_names()}
    assert used == set(MEASURES)


def test_unknown_experiment_is_one_line(capsys):
    assert engine.main(["report", "nope"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: unknown experiment 'nope'; expected one of:") and "table2" in err


def test_the_readme_shows_the_generated_headline_verdicts(capsys):
    assert engine.main(["verdicts", "--headline"]) == 0
    generated = capsys.readouterr().out
    readme = (REPO / "README.md").read_text()
    block = readme[readme.index("<!-- verdicts:start") : readme.index("<!-- verdicts:end -->")]
    assert block.split("\n", 1)[1] == generated  # regenerate: python benchmarks/make_results.py


def test_a_run_refused_by_its_command_leaves_nothing(tmp_path, capsys):
    spec_file = write_tiny_spec(tmp_path / "bad_algo.yml", run={"env": "WatchRepair-v0", "algos": ["vcbm", "nope"]})
    out = tmp_path / "out"
    assert engine.main(["run", str(spec_file), "--out", str(out), "--no-progress"]) == 2
    assert "unknown algo 'nope'" in capsys.readouterr().err and not out.exists()


def test_the_spec_hash_covers_what_the_experiment_is_and_not_where_it_is_published(tmp_path):
    base = specs.load_spec(str(write_tiny_spec(tmp_path / "a.yml"))).hash
    assert specs.load_spec(str(write_tiny_spec(tmp_path / "a.yml", notes="said later", title="renamed"))).hash == base
    assert specs.load_spec(str(write_tiny_spec(tmp_path / "a.yml", results="benchmarks/results/elsewhere"))).hash == base
    assert specs.load_spec(str(write_tiny_spec(tmp_path / "a.yml", seeds={"start": 0, "n": 3}))).hash != base
    extra = [{"claim": "vcbm-table2", "treatment": "mc", "control": "vcbm"}]
    assert specs.load_spec(str(write_tiny_spec(tmp_path / "a.yml", comparisons=extra))).hash != base


def test_your_own_spec_runs_and_reports_its_verdict_rows_beside_the_zoos(tmp_path, capsys):
    own = {"mine-vcbm-vs-mc": {"paper": "My note", "claim": "VCBM needs fewer episodes than Monte Carlo", "names": ["vcbm"]}}
    comparisons = [{"claim": "mine-vcbm-vs-mc", "treatment": "vcbm", "control": "mc"}]
    spec_file = write_tiny_spec(tmp_path / "mine.yml", claims=own, comparisons=comparisons, results="out")
    assert engine.main(["run", str(spec_file), "--out", str(tmp_path / "out"), "--workers", "1", "--no-progress"]) == 0
    capsys.readouterr()
    assert engine.main(["verdicts", "--spec", str(spec_file)]) == 0
    table = capsys.readouterr().out
    row = next(line for line in table.splitlines() if "VCBM needs fewer episodes than Monte Carlo" in line)
    assert "[mine](#mine): vcbm vs mc" in row and "P = " in row and "2 vs 2" in row
    assert "Table II" in table  # beside the zoo's own rows
    clash = write_tiny_spec(tmp_path / "clash.yml", claims={"vcbm-table2": own["mine-vcbm-vs-mc"]})
    assert engine.main(["verdicts", "--spec", str(clash)]) == 2
    assert "already a claim of the zoo" in capsys.readouterr().err


def test_list_says_where_each_experiments_results_stand(capsys):
    assert engine.main(["list"]) == 0
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    assert set(rows) == set(specs.spec_names())
    assert " predates-spec " in rows["table2"] and " registered " in rows["vcbm_plus"]
    for name in rows:  # registered, neither published nor archived
        spec = specs.load_spec(name)
        if spec.results is None and archive.archived_runs(spec) is None:
            assert " no results " in rows[name]
    for path in archive.IN_PROGRESS.glob(f"*{archive.SUFFIX}"):  # unpublished runs carried between machines
        assert " in progress " in rows[path.name.removesuffix(archive.SUFFIX)]


def test_a_script_experiment_gets_workers_only_when_run_is_given_it():
    import argparse

    spec = specs.load_spec("two_role_credit_rated")
    given = argparse.Namespace(short=False, seeds=None, seed_start=None, max_episodes=None, workers=1, no_progress=True,
                               backend="process", address=None)  # fmt: skip
    assert engine.command_argv(spec, given, Path("out"))[-2:] == ["--workers", "1"]
    assert "--workers" not in engine.command_argv(spec, argparse.Namespace(**{**vars(given), "workers": None}), Path("out"))


def test_a_script_experiments_child_imports_the_packages_of_the_engines_own_checkout(tmp_path):
    import os
    import subprocess
    import sys

    other = tmp_path / "other_checkout"
    (other / "algorithms").mkdir(parents=True)
    (other / "algorithms" / "__init__.py").write_text("")  # what an editable install of another checkout would give
    probe = tmp_path / "probe.py"  # a script's own folder, not the checkout, is first on its sys.path
    probe.write_text("import algorithms, pathlib; print(pathlib.Path(algorithms.__file__).resolve())")
    environ = {**os.environ, "PYTHONPATH": str(other)}
    child = engine.script_environment(environ)
    found = subprocess.run([sys.executable, str(probe)], env=child, capture_output=True, text=True, check=True).stdout
    assert Path(found.strip()) == REPO / "algorithms" / "__init__.py"
    assert child["PYTHONPATH"].split(os.pathsep) == [str(specs.REPO), str(other)]
    unchanged = subprocess.run([sys.executable, str(probe)], env=environ, capture_output=True, text=True, check=True).stdout
    assert Path(unchanged.strip()) == other / "algorithms" / "__init__.py"  # the probe can tell the two apart


def test_a_descriptive_spec_says_it_compares_nothing_and_a_spec_without_results_says_so(tmp_path):
    descriptive = specs.load_spec("bsuite_umbrella_length_vcbm_full")
    text = verdict.spec_markdown(descriptive, verdict.score(descriptive))
    assert "No comparison: the spec describes its methods." in text and "No results yet." not in text
    unrun = specs.load_spec(str(write_tiny_spec(tmp_path / "unrun.yml")))
    text = verdict.spec_markdown(unrun, verdict.score(unrun))
    assert "No results yet." in text and "No comparison" not in text


def test_a_sigterm_to_the_engine_stops_the_benchmark_script_it_runs(tmp_path):
    """Nothing outlives its parent: a benchmark script run by the engine ends when the engine is sent SIGTERM."""
    import os
    import signal
    import subprocess
    import sys
    import time

    pid_file = tmp_path / "child.pid"
    script = tmp_path / "slow_benchmark.py"
    script.write_text(f"import os, time\nopen({str(pid_file)!r}, 'w').write(str(os.getpid()))\ntime.sleep(120)\n")
    engine_code = (
        "import types; from pathlib import Path; from algorithms.experiment import engine; "
        f"engine.execute_script(types.SimpleNamespace(name='slow'), [{str(script)!r}], Path({str(tmp_path / 'out')!r}), {{}})"
    )
    parent = subprocess.Popen([sys.executable, "-c", engine_code], cwd=specs.REPO, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while not (pid_file.is_file() and pid_file.read_text()) and time.monotonic() < deadline:
        time.sleep(0.1)
    child = int(pid_file.read_text())
    parent.send_signal(signal.SIGTERM)
    assert parent.wait(timeout=30) != 0
    for _ in range(100):  # the child has been sent SIGTERM and waited for before the engine exits
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        os.kill(child, signal.SIGKILL)
        pytest.fail(f"the benchmark script (pid {child}) outlived the engine")
