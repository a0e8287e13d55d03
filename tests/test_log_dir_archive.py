"""A log dir packed on one node and unpacked on another (algorithms.experiment.distributed): modes made safe, and
members that would land outside refused, on Pythons with and without tarfile's "data" filter."""

from __future__ import annotations

import io
import os
import shutil
import stat
import subprocess
import tarfile
from pathlib import Path

import pytest

from algorithms.experiment import distributed
from algorithms.experiment.distributed import pack_dir, unpack_dir

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(params=["data filter", "before 3.11.4"])
def python_tarfile(request, monkeypatch):
    """This Python's tarfile, or one as Python < 3.11.4 (3.12) has it: no data_filter, no `filter` argument."""
    if request.param == "before 3.11.4":
        if not hasattr(tarfile, "data_filter"):
            return request.param
        extractall = tarfile.TarFile.extractall

        def old_extractall(self, path=".", members=None, *, numeric_owner=False):
            return extractall(self, path, members, numeric_owner=numeric_owner, filter="fully_trusted")

        monkeypatch.delattr(tarfile, "data_filter")
        monkeypatch.setattr(tarfile.TarFile, "extractall", old_extractall)
    elif not hasattr(tarfile, "data_filter"):
        pytest.skip("this Python's tarfile has no data filter")
    return request.param


def _archive(*members: tuple[tarfile.TarInfo, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for info, content in members:
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content) if info.isfile() else None)
    return buffer.getvalue()


def _member(name: str, kind: bytes = tarfile.REGTYPE, linkname: str = "", mode: int = 0o644) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode = kind, linkname, mode
    return info


def test_a_packed_log_dir_round_trips_with_its_modes_made_safe(tmp_path, python_tarfile):
    source = tmp_path / "source"
    (source / "events").mkdir(parents=True)
    (source / "summary.json").write_text("{}")
    (source / "events" / "tb").write_text("e")
    (source / "run.sh").write_text("#!/bin/sh")
    os.chmod(source / "run.sh", 0o4777)  # set-uid, world-writable: the data filter drops both
    os.symlink("events/tb", source / "latest")
    target = tmp_path / "out" / "run"
    unpack_dir(pack_dir(source), target)
    assert (target / "summary.json").read_text() == "{}" and (target / "latest").read_text() == "e"
    assert stat.S_IMODE((target / "run.sh").stat().st_mode) == 0o755


def test_an_absolute_member_lands_inside_as_the_data_filter_puts_it(tmp_path, python_tarfile):
    target = tmp_path / "a" / "run"
    unpack_dir(_archive((_member("/abs"), b"x"), (_member("//twice/x"), b"y")), target)
    assert (target / "abs").read_text() == "x" and (target / "twice" / "x").read_text() == "y"


@pytest.mark.parametrize(
    "members",
    [
        [(_member("../escaped"), b"x")],
        [(_member("sub/../../escaped"), b"x")],
        [(_member("link", tarfile.SYMTYPE, "/etc/passwd"), b"")],
        [(_member("link", tarfile.SYMTYPE, "../outside"), b"")],
        [(_member("hard", tarfile.LNKTYPE, "../outside"), b"")],
        [(_member("dev", tarfile.CHRTYPE), b"")],
        [(_member("fifo", tarfile.FIFOTYPE), b"")],
        # a link to ".", then a link through it to ".." (lexically inside), then a file through that
        [(_member("q", tarfile.SYMTYPE, "."), b""), (_member("p", tarfile.SYMTYPE, "q/.."), b""), (_member("p/evil"), b"x")],
    ],
    ids=["dotdot", "nested-dotdot", "abs-symlink", "symlink-out", "hardlink-out", "device", "fifo", "chain"],
)
def test_unsafe_members_are_refused_and_nothing_lands_outside(tmp_path, python_tarfile, members):
    (tmp_path / "outside").write_text("keep")
    target = tmp_path / "a" / "run"
    with pytest.raises(tarfile.TarError):
        unpack_dir(_archive(*members), target)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "outside"]
    assert list((tmp_path / "a").iterdir()) == [] and (tmp_path / "outside").read_text() == "keep"


def test_the_fallback_runs_on_a_real_python_without_the_data_filter(tmp_path):
    """Debian 12's /usr/bin/python3 (3.11.2) is such a Python; elsewhere this is skipped (the monkeypatched
    branch above stands in for it)."""
    python = shutil.which("python3", path="/usr/bin")
    if python is None:
        pytest.skip("no /usr/bin/python3")
    probe = subprocess.run(
        [python, "-c", "import tarfile; print(hasattr(tarfile, 'data_filter'))"], capture_output=True, text=True
    )
    if probe.stdout.strip() != "False":
        pytest.skip(f"{python} has tarfile's data filter")
    source = tmp_path / "source"
    source.mkdir()
    (source / "summary.json").write_text('{"ok": 1}')
    (tmp_path / "packed").write_bytes(pack_dir(source))
    bad = _archive(
        (_member("q", tarfile.SYMTYPE, "."), b""), (_member("p", tarfile.SYMTYPE, "q/.."), b""), (_member("p/evil"), b"x")
    )
    (tmp_path / "bad").write_bytes(bad)
    script = (
        "import sys, tarfile; from pathlib import Path; from algorithms.experiment.distributed import unpack_dir\n"
        "unpack_dir(Path(sys.argv[1], 'packed').read_bytes(), Path(sys.argv[1], 'good'))\n"
        "try:\n    unpack_dir(Path(sys.argv[1], 'bad').read_bytes(), Path(sys.argv[1], 'bad_run'))\n"
        "except tarfile.TarError as exc:\n    print('refused', exc)\n"
    )
    done = subprocess.run([python, "-c", script, str(tmp_path)], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "good" / "summary.json").read_text() == '{"ok": 1}'
    assert done.stdout.startswith("refused") and not (tmp_path / "bad_run").exists() and not (tmp_path / "evil").exists()


def test_unpack_uses_the_data_filter_where_python_has_it(monkeypatch):
    if not hasattr(tarfile, "data_filter"):
        pytest.skip("this Python's tarfile has no data filter")
    seen = []
    monkeypatch.setattr(tarfile.TarFile, "extractall", lambda self, path, **kwargs: seen.append(kwargs))
    distributed.extract_data(tarfile.open(fileobj=io.BytesIO(_archive()), mode="r:gz"), Path("unused"))
    assert seen == [{"filter": "data"}]
