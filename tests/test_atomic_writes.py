"""Files written atomically (algorithms.common.cli): JSON is strict and records where a value was not finite, and a
file gets the mode that open() gives a new file under the umask."""

from __future__ import annotations

import math
import os
import stat

import pytest

from algorithms.common import cli
from tests.helpers import strict_json


def test_json_writes_are_strict_and_record_what_was_not_finite(tmp_path):
    path = tmp_path / "out.json"
    cli.atomic_write_json(path, {"mean": math.inf, "shares": [0.5, math.nan], "a/b": {"low": -math.inf}, "n": 3})
    data = strict_json(path.read_text())
    assert data["mean"] is None and data["shares"] == [0.5, None] and data["n"] == 3
    assert data[cli.NON_FINITE_KEY] == {"/mean": "Infinity", "/shares/1": "NaN"}
    assert data["a/b"] == {"low": None, cli.NON_FINITE_KEY: {"/low": "-Infinity"}}  # the nearest object records it
    cli.atomic_write_json(path, data)  # read back and written again: the same file
    assert strict_json(path.read_text()) == data
    # a list of records (an LLM run's history.json): each record lists its own
    cli.atomic_write_json(path, [{"kl": math.nan, "loss": 0.5}, {"kl": 0.1}, [math.inf]])
    history = strict_json(path.read_text())
    assert history == [{"kl": None, "loss": 0.5, cli.NON_FINITE_KEY: {"/kl": "NaN"}}, {"kl": 0.1}, [None]]
    cli.atomic_write_json(path, {"mean": 0.25})
    assert cli.NON_FINITE_KEY not in strict_json(path.read_text())


@pytest.fixture
def umask():
    def set_umask(mask: int) -> None:
        os.umask(mask)

    previous = os.umask(0o022)
    yield set_umask
    os.umask(previous)


@pytest.mark.parametrize("mask", [0o022, 0o027, 0o002], ids=["022", "027", "002"])
def test_atomic_writes_get_the_mode_open_gives_a_new_file(tmp_path, umask, mask):
    umask(mask)
    cli.atomic_write_text(tmp_path / "table.md", "x")
    cli.atomic_write_json(tmp_path / "results.json", {"a": 1})
    with open(tmp_path / "plain.txt", "w") as handle:
        handle.write("x")
    expected = stat.S_IMODE((tmp_path / "plain.txt").stat().st_mode)
    assert expected == 0o666 & ~mask
    for name in ("table.md", "results.json"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == expected, name
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plain.txt", "results.json", "table.md"]  # no temp file left


def test_a_run_writes_config_and_summary_readable_by_the_group(tmp_path, umask):
    from algorithms.train import main

    umask(0o022)
    log_dir = tmp_path / "run"
    assert (
        main(["--algo", "td", "--env", "WatchRepair-v0", "--max-episodes", "20", "--no-progress", "--log-dir", str(log_dir)]) == 0
    )
    for name in ("config.yml", "summary.json"):
        assert stat.S_IMODE((log_dir / name).stat().st_mode) == 0o644, name
