"""benchmarks/RESULTS.md is generated from the registered experiments and their outputs: the verdict table first, then
one section per spec with the command, commit and wall time its outputs record."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

from algorithms.credit_fidelity import run as credit_fidelity

REPO = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("make_results", REPO / "benchmarks" / "make_results.py")
make_results = importlib.util.module_from_spec(spec)
spec.loader.exec_module(make_results)


def test_results_md_is_what_the_generator_makes_of_the_committed_outputs():
    # after new outputs land in benchmarks/results/, regenerate: python benchmarks/make_results.py
    assert (REPO / "benchmarks" / "RESULTS.md").read_text() == make_results.render(REPO / "benchmarks" / "results")


def test_every_section_says_what_its_outputs_record(tmp_path):
    results = tmp_path / "results"
    credit_fidelity(["--env", "SetRetrieval-v0", "--requests", "10", "--out", str(results / "credit_fidelity")])
    record = json.loads((results / "credit_fidelity" / "run.json").read_text())
    expected = f"python -m algorithms.credit_fidelity --env SetRetrieval-v0 --requests 10 --out {results}/credit_fidelity"
    assert record["command"] == expected
    assert record["wall_time_s"] > 0 and "git_commit" in record
    # an LLM benchmark output that records its wall time but neither command nor commit
    shutil.copytree(REPO / "benchmarks" / "results" / "llm_learning", results / "llm_learning")
    (results / "llm_learning" / "run.json").unlink(missing_ok=True)  # as the benchmark wrote before it kept run.json
    text = make_results.render(results)
    fidelity = text[text.index("## CASI on SetRetrieval-v0") :]
    assert f"| command | `{record['command']}` |" in fidelity and "| Rule | Sign all |" in fidelity
    llm = text[text.index("## LLM learning") :]
    llm = llm[: llm.index("<a id=")]
    assert "| command | not recorded |" in llm and "| commit | not recorded |" in llm
    wall = json.loads((results / "llm_learning" / "results.json").read_text())["wall_time_s"]
    assert f"| wall time | {make_results._seconds(wall)} |" in llm and "| setting | noise | method |" in llm
    table2 = text[text.index('<a id="table2">') :]
    assert "Not produced yet: run `python -m algorithms.experiment run table2 --out OUT`" in table2  # no table2/ here
    # the verdict table opens the file; without table2's outputs its claim is untested
    verdicts = text[: text.index("## Experiments")]
    assert "| Visual Causal-chain Bookmarking (Selvakumar, 2026), Table II |" in verdicts
    row = next(line for line in verdicts.splitlines() if "Table II |" in line)
    assert row.endswith("**untested** |")


def test_a_resumed_commands_section_counts_the_runs_it_reused_and_every_runs_time():
    """Its wall time is the last invocation's alone: 22 runs of 120 here."""
    record = {"command": "c", "wall_time_s": 2164.3, "runs": 120, "runs_reused": 98, "run_time_s_sum": 22104.9}
    text = make_results.provenance(record | {"backend": "process"})
    assert "| runs | 120 (98 reused from an earlier invocation, 22 run by this one; backend process) |" in text
    assert "| run time summed over runs | 22,105 s (368.4 min) |" in text
    assert "| runs |" not in make_results.provenance({"command": "c", "wall_time_s": 1.0})  # nothing reused to say


def test_the_tuning_seeds_are_named_once():
    from algorithms.experiment.verdict import tuning_text

    seeds = {"start": 961, "n": 6}
    assert tuning_text({"by": "pilots of the notes"}) == "pilots of the notes"
    assert tuning_text({"by": "pilots of the notes", "seeds": seeds}) == "pilots of the notes (seeds 961-966)"
    assert tuning_text({"by": "pilots (seeds 961-966)", "seeds": seeds}) == "pilots (seeds 961-966)"


def test_the_readmes_verdict_block_is_replaced_and_nothing_else():
    readme = "# Title\n\nbefore\n<!-- verdicts:start (generated) -->\n| old |\n<!-- verdicts:end -->\nafter\n"
    new = make_results.with_headline(readme, "| new |\n| rows |\n")
    block = "<!-- verdicts:start (generated) -->\n| new |\n| rows |\n<!-- verdicts:end -->\n"
    assert new == f"# Title\n\nbefore\n{block}after\n"
    assert make_results.with_headline(new, "| new |\n| rows |\n") == new
