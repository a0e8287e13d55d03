"""An experiment's finished runs carried to another machine: `archive`, then `run --resume-from`."""

from __future__ import annotations

import dataclasses
import json
import re
import tarfile
from pathlib import Path

import pytest

from algorithms.common.errors import VcbmGymError
from algorithms.common.log_dir import EVENT_FILE
from algorithms.experiment import archive, engine, specs, verdict
from tests.helpers import write_tiny_spec

RUN = ["--workers", "1", "--no-progress"]


def _finished_experiment(tmp_path: Path) -> tuple[Path, Path]:
    spec_file = write_tiny_spec(tmp_path / "mine.yml")
    out = tmp_path / "first_machine"
    assert engine.main(["run", str(spec_file), "--out", str(out), *RUN]) == 0
    return spec_file, out


def test_a_resumed_experiment_reuses_every_archived_run_and_scores_the_same(tmp_path, capsys):
    spec_file, out = _finished_experiment(tmp_path)
    summaries = sorted(p.relative_to(out) for p in out.rglob("summary.json"))
    assert len(summaries) == 4  # 2 methods x 2 seeds
    unfinished = out / "runs" / "vcbm" / "seed99"
    unfinished.mkdir(parents=True)
    (unfinished / "config.yml").write_text("algo: vcbm\n")
    assert any(p.name.startswith(EVENT_FILE) for p in out.rglob("*"))  # the runs wrote TensorBoard logs
    to = tmp_path / "carried" / "mine.tar.xz"
    assert engine.main(["archive", "--out", str(out), "--to", str(to)]) == 0
    assert "4 finished run(s) of experiment mine" in capsys.readouterr().out
    with tarfile.open(to) as tar:
        names = tar.getnames()
    assert specs.RECORD_FILE in names and sorted(Path(n) for n in names if n.endswith("summary.json")) == summaries
    assert "seed99" not in str(names) and any(Path(n).name.startswith(EVENT_FILE) for n in names)  # compare's curves

    second = tmp_path / "second_machine"
    assert engine.main(["run", str(spec_file), "--out", str(second), "--resume-from", str(to), *RUN]) == 0
    run = json.loads((second / "run.json").read_text())
    assert (run["runs_reused"], run["runs_run"]) == (4, 0)
    first, resumed = (json.loads((d / "results.json").read_text())["algos"] for d in (out, second))
    assert resumed == first


def test_an_archive_of_another_spec_version_is_refused_before_anything_is_written(tmp_path, capsys):
    spec_file, out = _finished_experiment(tmp_path)
    to = tmp_path / "mine.tar.xz"
    assert engine.main(["archive", "--out", str(out), "--to", str(to)]) == 0
    write_tiny_spec(spec_file, seeds={"start": 0, "n": 3})
    capsys.readouterr()
    second = tmp_path / "second_machine"
    assert engine.main(["run", str(spec_file), "--out", str(second), "--resume-from", str(to), *RUN]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "never pooled" in err and "--resume-from" in err
    assert not second.exists()


def test_resuming_into_an_out_that_holds_an_experiment_is_refused(tmp_path, capsys):
    spec_file, out = _finished_experiment(tmp_path)
    to = tmp_path / "mine.tar.xz"
    assert engine.main(["archive", "--out", str(out), "--to", str(to)]) == 0
    capsys.readouterr()
    assert engine.main(["run", str(spec_file), "--out", str(out), "--resume-from", str(to), *RUN]) == 2
    assert "expected a new --out" in capsys.readouterr().err


def test_bad_archive_arguments_are_one_line(tmp_path, capsys):
    assert engine.main(["archive", "--out", str(tmp_path), "--to", str(tmp_path / "a.tar.xz")]) == 2
    assert "holds no experiment.json" in capsys.readouterr().err
    (tmp_path / specs.RECORD_FILE).write_text("{}")
    assert engine.main(["archive", "--out", str(tmp_path), "--to", str(tmp_path / "a.zip")]) == 2
    assert "expected a file name ending in .tar.xz" in capsys.readouterr().err
    not_archive = tmp_path / "b.tar.xz"
    not_archive.write_text("plain text")
    spec_file = write_tiny_spec(tmp_path / "mine.yml")
    assert engine.main(["run", str(spec_file), "--out", str(tmp_path / "o"), "--resume-from", str(not_archive), *RUN]) == 2
    err = capsys.readouterr().err.strip()
    assert "not an experiment archive" in err and len(err.splitlines()) == 1 and not (tmp_path / "o").exists()


def test_event_files_and_weights_travel_only_where_the_experiments_outputs_read_them(tmp_path):
    assert archive.keeps_whole_runs({"experiment": "table2"})  # compare: its curve figure reads TensorBoard
    assert not archive.keeps_whole_runs({"experiment": "bsuite_umbrella_distract_power"})  # bsuite's CSV logs
    assert not archive.keeps_whole_runs({"experiment": "llm_power_workshop"})  # history.json
    assert archive.keeps_whole_runs({"experiment": "episodic_mujoco_power"})  # a benchmark script's own reads
    assert archive.keeps_whole_runs({"experiment": "a spec file of your own"})
    assert archive.carried(Path("env_log/bsuite_id_-_umbrella_distract-0.csv")) and archive.carried(Path("history.json"))
    assert not archive.carried(Path("adapter/adapter_model.safetensors")) and not archive.carried(Path("model/config.json"))
    _, out = _finished_experiment(tmp_path)
    weights = next(out.rglob("summary.json")).parent / "adapter"
    weights.mkdir()
    (weights / "adapter_model.safetensors").write_bytes(b"weights")
    record = json.loads((out / specs.RECORD_FILE).read_text())
    (out / specs.RECORD_FILE).write_text(json.dumps(record | {"experiment": "bsuite_umbrella_distract_power"}))
    to = tmp_path / "suite.tar.xz"
    assert archive.write_archive(out, to) == ("bsuite_umbrella_distract_power", 4)
    assert to.stat().st_mode & 0o044 == 0o044  # readable as any file written plainly (umask 022)
    with tarfile.open(to) as tar:
        names = tar.getnames()
    assert not any(Path(n).name.startswith(EVENT_FILE) or "adapter" in n for n in names)
    assert sum(n.endswith("summary.json") for n in names) == 4


def test_every_experiment_in_progress_resumes_under_its_spec_as_it_stands():
    folder = Path(__file__).resolve().parents[1] / "benchmarks" / "in_progress"
    listed = (folder / "README.md").read_text()
    for path in sorted(folder.glob(f"*{archive.SUFFIX}")):
        spec = specs.load_spec(path.name.removesuffix(archive.SUFFIX))
        record = archive.archived_record(path)
        assert (record["experiment"], record["spec_hash"], record["deviations"]) == (spec.name, spec.hash, {}), path.name
        assert spec.results is None, f"{spec.name} is published: delete its archive"
        with tarfile.open(path) as tar:
            runs = sum(1 for name in tar.getnames() if name.endswith("summary.json"))
        assert f"| {spec.name} | {runs} | {specs.planned_runs_text(spec)} |" in listed, path.name


def test_a_suites_runs_carried_without_event_files_are_reused_and_scored_the_same(tmp_path):
    """A suite scores bsuite's CSV logs: its runs travel without TensorBoard files and still score the same."""
    pytest.importorskip("bsuite", reason="bsuite is not installed: pip install -e '.[bsuite]'")
    from algorithms.experiment import suite

    sweep = ["--experiment", "umbrella_length", "--algos", "vcbm", "--settings", "0", "--episodes", "60"]
    sweep += ["--seeds", "2", "--workers", "0", "--no-progress"]
    out, second = tmp_path / "first_machine", tmp_path / "second_machine"
    assert suite.main([*sweep, "--out", str(out)]) == 0
    assert any(p.name.startswith(EVENT_FILE) for p in out.rglob("*"))
    record = specs.run_record(specs.load_spec("bsuite_umbrella_length_power"), {})
    (out / specs.RECORD_FILE).write_text(json.dumps(record))
    to = tmp_path / "suite.tar.xz"
    assert archive.write_archive(out, to) == ("bsuite_umbrella_length_power", 2)
    archive.unpack_archive(to, second)
    assert not any(p.name.startswith(EVENT_FILE) for p in second.rglob("*"))
    assert suite.main([*sweep, "--out", str(second)]) == 0
    assert json.loads((second / "run.json").read_text())["runs_reused"] == 2
    first, resumed = (json.loads((d / "results.json").read_text())["experiments"] for d in (out, second))
    assert resumed == first


def test_an_archived_experiment_is_listed_as_in_progress_with_its_count(tmp_path, monkeypatch, capsys):
    pytest.importorskip("bsuite", reason="bsuite is not installed: pip install -e '.[bsuite]'")
    from algorithms.common.log_dir import summary_checksum

    spec = specs.load_spec("bsuite_discounting_chain_power")
    out = tmp_path / "out"
    out.mkdir()
    (out / specs.RECORD_FILE).write_text(json.dumps(specs.run_record(spec, {})))
    for method, seed, seconds in (("ppo", 400, 30.0), ("ppo", 401, 31.0), ("ppo", 402, 32.0), ("dqn", 400, 90.0)):
        run_dir = out / "runs" / method / "discounting_chain-0" / f"seed{seed}"
        run_dir.mkdir(parents=True)
        summary = {"seed": seed, "wall_time_s": seconds}
        (run_dir / "summary.json").write_text(json.dumps(summary | {"checksum": summary_checksum(summary)}))
    broken = out / "runs" / "ppo" / "discounting_chain-0" / "seed403"
    broken.mkdir()
    (broken / "summary.json").write_text('{"seed": 403, "checksum": "edited"}')
    monkeypatch.setattr(archive, "IN_PROGRESS", tmp_path / "in_progress")
    assert verdict.status(spec) == "no results"
    archive.write_archive(out, tmp_path / "in_progress" / "bsuite_discounting_chain_power.tar.xz")
    assert archive.archived_runs(spec) == 4
    assert verdict.status(spec) == "in progress"
    assert "in progress: 4 of 1600 runs archived" in verdict.spec_markdown(spec, verdict.score(spec))
    assert engine.main(["list"]) == 0
    assert "in progress" in next(line for line in capsys.readouterr().out.splitlines() if line.startswith(spec.name))
    assert engine.main(["plan", spec.name]) == 0
    # 200 runs a method: ppo's 197 left at its 31 s, dqn's 199 at its 90 s, the 6 methods not run at the short
    # sweep's measured 76.0 s a run; the mean of all archived runs (45.75 s) would say 20.29
    rate, twin = engine.borrowed_seconds_per_run(spec)
    assert (f"{rate:.1f}", twin) == ("76.0", "bsuite_discounting_chain_short")
    left = (197 * 31.0 + 199 * 90.0 + 6 * 200 * rate) / 3600
    out_text = capsys.readouterr().out
    assert f"in progress: 4 of 1600 runs archived in benchmarks/in_progress; about {left:.2f} core-hours left" in out_text
    assert "6 method(s) not yet run at bsuite_discounting_chain_short's rate, 76.0 s" in out_text


def test_time_left_prices_each_method_at_its_own_mean_and_unseen_ones_at_the_borrowed_rate_or_the_median():
    by_method = {"ppo": [{"wall_time_s": 30.0}, {"wall_time_s": 32.0}], "dqn": [{"wall_time_s": 90.0}], "dqn+rrd": []}
    # 10 runs a method: ppo's 8 left at 31 s, dqn's 9 at 90 s, dqn+rrd's 10 at the median of 31 and 90 (60.5 s)
    assert "about 0.46 core-hours left" in engine.time_left(by_method, 30)
    assert f"{(8 * 31 + 9 * 90 + 10 * 60.5) / 3600:.2f}" == "0.46"
    # with a twin spec's rate, dqn+rrd's 10 runs cost 120 s each instead
    with_twin = engine.time_left(by_method, 30, (120.0, "twin"))
    assert f"about {(8 * 31 + 9 * 90 + 10 * 120) / 3600:.2f} core-hours left" in with_twin
    assert "1 method(s) not yet run at twin's rate, 120.0 s" in with_twin
    assert engine.time_left({"ppo": [], "dqn": []}, 20) == ""


def test_a_benchmark_scripts_archive_counts_its_finished_runs_without_a_total(tmp_path, monkeypatch):
    """A script's jobs are the script's own (runs_of counts one invocation): no "of 1" beside its runs."""
    from algorithms.common.log_dir import summary_checksum

    spec = dataclasses.replace(specs.load_spec("episodic_mujoco_power"), results=None)  # a script not yet published
    out = tmp_path / "out"
    out.mkdir()
    (out / specs.RECORD_FILE).write_text(json.dumps(specs.run_record(spec, {})))
    for seed in (400, 401):
        run_dir = out / "runs" / "EpisodicHopper-v5" / "sac" / f"seed{seed}"
        run_dir.mkdir(parents=True)
        summary = {"seed": seed, "wall_time_s": 90.0}
        (run_dir / "summary.json").write_text(json.dumps(summary | {"checksum": summary_checksum(summary)}))
        (run_dir / "evaluations.npz").write_bytes(b"read by the script")
    monkeypatch.setattr(archive, "IN_PROGRESS", tmp_path / "in_progress")
    to = tmp_path / "in_progress" / "episodic_mujoco_power.tar.xz"
    assert archive.write_archive(out, to) == ("episodic_mujoco_power", 2)
    with tarfile.open(to) as tar:
        assert sum(name.endswith("evaluations.npz") for name in tar.getnames()) == 2  # a script's runs travel whole
    text = verdict.spec_markdown(spec, verdict.score(spec))
    assert "in progress: 2 runs archived" in text and "of 1 runs" not in text
    assert specs.planned_runs_text(spec) == "-"
    assert specs.planned_runs_text(specs.load_spec("bsuite_discounting_chain_power")) == "1600"


def _suite_runs(out: Path, spec: specs.ExperimentSpec, commits: list[str], record: dict | None = None) -> None:
    """Finished runs of a suite as its runs lay them out, each recording the commit whose code made it."""
    from algorithms.common.log_dir import summary_checksum

    out.mkdir(parents=True, exist_ok=True)
    (out / specs.RECORD_FILE).write_text(json.dumps(record or specs.run_record(spec, {})))
    for seed, commit in enumerate(commits):
        run_dir = out / "runs" / "dqn" / "discounting_chain-0" / f"seed{seed}"
        run_dir.mkdir(parents=True, exist_ok=True)
        summary = {"seed": seed, "wall_time_s": 60.0}
        (run_dir / "summary.json").write_text(json.dumps(summary | {"checksum": summary_checksum(summary)}))
        (run_dir / "config.yml").write_text(f"config_hash: abc\ngit_commit: {commit}\n")


TABLE = (
    "# In progress\n\n| experiment | finished runs | of | made from commit |\n|---|---|---|---|\n| other | 3 | 9 | 1234567 |\n"
)


@pytest.fixture
def zoo_table(tmp_path, monkeypatch) -> tuple[Path, specs.ExperimentSpec, Path, Path]:
    """An in-progress folder holding TABLE: (its listing, a suite's spec, that suite's --out, its archive there)."""
    monkeypatch.setattr(archive, "IN_PROGRESS", tmp_path / "in_progress")
    listing = archive.IN_PROGRESS / archive.LISTING
    listing.parent.mkdir()
    listing.write_text(TABLE)
    spec = specs.load_spec("bsuite_discounting_chain_power")
    return listing, spec, tmp_path / "out", archive.IN_PROGRESS / f"{spec.name}{archive.SUFFIX}"


def test_archiving_into_in_progress_keeps_the_experiments_row_current_and_publishing_deletes_it(tmp_path, zoo_table):
    from algorithms.experiment import publish

    listing, spec, out, to = zoo_table
    _suite_runs(out, spec, ["a" * 40] * 2)
    assert archive.write_archive(out, to) == (spec.name, 2)
    assert listing.read_text() == TABLE + f"| {spec.name} | 2 | 1600 | aaaaaaa |\n"
    _suite_runs(out, spec, ["a" * 40] * 3)  # a third run finished: the same row, updated in place
    assert archive.write_archive(out, to) == (spec.name, 3)
    assert listing.read_text() == TABLE + f"| {spec.name} | 3 | 1600 | aaaaaaa |\n"
    publish.retire_archive(spec.name)
    assert listing.read_text() == TABLE and not to.exists()
    elsewhere = tmp_path / "carried" / f"{spec.name}{archive.SUFFIX}"
    assert archive.write_archive(out, elsewhere) == (spec.name, 3) and listing.read_text() == TABLE  # no row


@pytest.mark.parametrize(
    "commits, record, refused",
    [
        (["a" * 40, "b" * 40], None, "runs made at 2 commits (aaaaaaa, bbbbbbb): expected one code version"),
        (["a" * 40], {"deviations": {"seeds": "0-1"}}, "runs made with overrides {'seeds': '0-1'}"),
        (["a" * 40], {"spec_hash": "0" * 64}, "runs made with another spec version"),
    ],
)
def test_an_archive_the_in_progress_table_cannot_list_is_refused_before_anything_is_written(zoo_table, commits, record, refused):
    listing, spec, out, to = zoo_table
    _suite_runs(out, spec, commits, specs.run_record(spec, {}) | (record or {}))
    with pytest.raises(VcbmGymError, match=re.escape(refused)):
        archive.write_archive(out, to)
    assert listing.read_text() == TABLE and sorted(p.name for p in listing.parent.iterdir()) == [archive.LISTING]


def test_an_own_specs_runs_are_not_archived_into_the_zoos_in_progress_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(archive, "IN_PROGRESS", tmp_path / "in_progress")
    _, out = _finished_experiment(tmp_path)
    to = archive.IN_PROGRESS / f"mine{archive.SUFFIX}"
    capsys.readouterr()
    assert engine.main(["archive", "--out", str(out), "--to", str(to)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "mine" in err
    assert not archive.IN_PROGRESS.exists()
