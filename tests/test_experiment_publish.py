"""`publish NAME --out DIR`: only a run that counts becomes an experiment's committed results, whole, with its spec
naming them and its in-progress archive retired; every refusal is one line and leaves nothing written."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Callable

import pytest

from algorithms.experiment import archive, engine, publish, specs
from tests.helpers import write_tiny_spec

RUN = ["--workers", "1", "--no-progress"]


def _register(repo: Path) -> None:
    """`repo` as a repository of its own with the tiny spec committed, as the zoo's specs are."""
    write_tiny_spec(repo / "zoo_configs" / "experiments" / "mine.yml")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "register mine"], check=True)


def _as_zoo(monkeypatch: pytest.MonkeyPatch, repo: Path) -> None:
    monkeypatch.setattr(specs, "REPO", repo)
    monkeypatch.setattr(specs, "SPEC_DIR", repo / "zoo_configs" / "experiments")
    monkeypatch.setattr(archive, "IN_PROGRESS", repo / "benchmarks" / "in_progress")
    monkeypatch.setattr(publish, "RESULTS_DIR", repo / "benchmarks" / "results")


@pytest.fixture(scope="module")
def engine_run(tmp_path_factory) -> Path:
    """One run of the registered tiny spec by the engine, made once: each test works on a copy."""
    repo = tmp_path_factory.mktemp("first") / "repo"
    (repo / "zoo_configs" / "experiments").mkdir(parents=True)
    _register(repo)
    out = repo.parent / "out"
    with pytest.MonkeyPatch.context() as monkeypatch:
        _as_zoo(monkeypatch, repo)
        assert engine.main(["run", str(repo / "zoo_configs" / "experiments" / "mine.yml"), "--out", str(out), *RUN]) == 0
    return out


@pytest.fixture
def zoo(tmp_path, monkeypatch) -> Path:
    repo = tmp_path / "repo"
    (repo / "zoo_configs" / "experiments").mkdir(parents=True)
    _register(repo)
    _as_zoo(monkeypatch, repo)
    return repo


def _registered_run(zoo: Path, tmp_path: Path, engine_run: Path) -> tuple[Path, Path]:
    """A copy of the engine's run as made in `zoo`: the same spec (same hash), committed there before the run."""
    spec_file, out = zoo / "zoo_configs" / "experiments" / "mine.yml", tmp_path / "out"
    shutil.copytree(engine_run, out)
    _edit_json(out / specs.RECORD_FILE, spec_commit=specs.spec_commit(specs.load_spec(str(spec_file))))
    _edit_json(out / "run.json", git_dirty=False)  # this checkout may hold edits; CI's does not
    return spec_file, out


def _edit_json(path: Path, **changes) -> None:
    path.write_text(json.dumps(json.loads(path.read_text()) | changes))


def test_a_registered_run_is_published_whole_and_its_archive_retired(zoo, tmp_path, engine_run, capsys):
    spec_file, out = _registered_run(zoo, tmp_path, engine_run)
    before = specs.load_spec(str(spec_file))
    assert specs.registration(before, out)["status"] == "registered"
    archive.write_archive(out, archive.IN_PROGRESS / "mine.tar.xz")
    other_row = "| someone_elses | 3 | 40 | abc1234 |\n"
    (archive.IN_PROGRESS / "README.md").write_text(f"| experiment |\n| mine | 4 | 4 | abc1234 |\n{other_row}")

    assert engine.main(["publish", str(spec_file), "--out", str(out)]) == 0
    target = zoo / "benchmarks" / "results" / "mine"
    printed = capsys.readouterr().out
    assert f"published mine in {target}" in printed, printed[-400:]
    top = sorted(p.name for p in out.iterdir() if p.is_file() and not p.name.startswith("."))  # not the run's lock
    assert sorted(p.name for p in target.iterdir()) == top and {"results.json", "run.json", "experiment.json"} <= set(top)
    assert all((target / name).read_bytes() == (out / name).read_bytes() for name in top)
    assert not any(p.is_dir() for p in target.iterdir())  # the runs' log dirs stay behind
    after = specs.load_spec(str(spec_file))
    assert spec_file.read_text().endswith("results: benchmarks/results/mine\n")
    assert after.results == Path("benchmarks/results/mine") and after.hash == before.hash
    assert specs.registration(after, target)["status"] == "registered"
    assert not (archive.IN_PROGRESS / "mine.tar.xz").exists()
    assert (archive.IN_PROGRESS / "README.md").read_text() == f"| experiment |\n{other_row}"

    assert engine.main(["publish", str(spec_file), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: publish mine") and "already names its results" in err and "\n" not in err


REFUSALS: dict[str, tuple[Callable[[Path], None], str]] = {
    "another spec version": (lambda out: _edit_json(out / specs.RECORD_FILE, spec_hash="0" * 64), "another version"),
    "deviating": (lambda out: _edit_json(out / specs.RECORD_FILE, deviations={"seeds": 1}), "overrides"),
    "spec uncommitted": (lambda out: _edit_json(out / specs.RECORD_FILE, spec_commit=None), "not committed"),
    "dirty code": (lambda out: _edit_json(out / "run.json", git_dirty=True), "git_dirty True"),
    "a run missing": (lambda out: shutil.rmtree(next(out.rglob("summary.json")).parent), "3 finished runs"),
    "no results": (lambda out: (out / "results.json").unlink(), "no results.json"),
}


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_a_run_that_does_not_count_is_refused_before_anything_is_written(zoo, tmp_path, engine_run, capsys, case):
    spec_file, out = _registered_run(zoo, tmp_path, engine_run)
    archive.write_archive(out, archive.IN_PROGRESS / "mine.tar.xz")
    spec_text = spec_file.read_text()
    spoil, why = REFUSALS[case]
    spoil(out)
    capsys.readouterr()
    assert engine.main(["publish", str(spec_file), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: publish mine --out") and why in err and "\n" not in err, err
    assert not (zoo / "benchmarks" / "results").exists()
    assert spec_file.read_text() == spec_text and (archive.IN_PROGRESS / "mine.tar.xz").is_file()


def test_only_a_registered_experiment_is_published(tmp_path, capsys):
    own = write_tiny_spec(tmp_path / "own.yml")
    assert engine.main(["publish", str(own), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert "expected a registered experiment of" in err and not (tmp_path / "out").exists()
