"""The log-dir policy of algorithms.train: --resume and --overwrite delete only what a run writes, a run holds its
log dir's lock, a full disk is one line and leaves no empty log dir, a log dir that is a symbolic link is the folder
it points to."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from algorithms import train
from algorithms.common import cli
from algorithms.common.log_dir import run_entries, summary_checksum
from algorithms.common.scalar_writer import ScalarWriter

TD = ["--algo", "td", "--env", "WatchRepair-v0", "--max-episodes", "30", "--no-progress"]


def _one_error(code: int, err: str) -> str:
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), err
    return lines[0]


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _tamper_summary(log_dir: Path) -> None:
    """Change a result in summary.json and leave its checksum as the run wrote it."""
    summary = json.loads((log_dir / "summary.json").read_text())
    summary["episodes_run"] += 1
    (log_dir / "summary.json").write_text(json.dumps(summary))


# ------------------------------------------------------------------ what --resume and --overwrite delete
@pytest.mark.parametrize("damage", ["tampered summary", "no summary"])
def test_resume_that_reruns_deletes_only_what_the_run_wrote_and_says_why(tmp_path, capsys, damage):
    log_dir = tmp_path / "run"
    first = train.run([*TD, "--log-dir", str(log_dir)])
    (log_dir / "NOTES.md").write_text("my notes\n")
    (log_dir / "mine").mkdir()
    (log_dir / "mine" / "plot.png").write_bytes(b"png")
    if damage == "tampered summary":
        _tamper_summary(log_dir)
    else:
        (log_dir / "summary.json").unlink()
    capsys.readouterr()
    again = train.run([*TD, "--log-dir", str(log_dir), "--resume"])
    err = capsys.readouterr().err.strip().splitlines()
    assert (log_dir / "NOTES.md").read_text() == "my notes\n" and (log_dir / "mine" / "plot.png").read_bytes() == b"png"
    assert again["checksum"] == summary_checksum(again) and again["episodes_run"] == first["episodes_run"]
    assert len(list(log_dir.glob("events.out.tfevents.*"))) == 1  # the first run's events went with it
    why = "summary.json was changed" if damage == "tampered summary" else "did not finish"
    assert len(err) == 1 and err[0].startswith("--resume: ") and why in err[0] and "rerunning" in err[0], err
    assert "NOTES.md" in err[0] and "mine" in err[0]


def test_overwrite_deletes_only_what_a_run_writes_sb3_event_folders_included(tmp_path, capsys):
    log_dir = tmp_path / "run"
    ppo = ["--algo", "ppo", "--env", "WatchRepair-v0", "--max-episodes", "20", "--no-progress", "--log-dir", str(log_dir)]
    first = train.run(ppo)
    (old_events,) = log_dir.glob("*/events.out.tfevents.*")  # SB3's <algo>_<credit>_<n>/ folder
    (log_dir / "NOTES.md").write_text("keep me")
    capsys.readouterr()
    second = train.run([*ppo, "--overwrite", "--hyperparams", "gamma=0.9"])
    assert second["config_hash"] != first["config_hash"]
    assert (log_dir / "NOTES.md").read_text() == "keep me" and not old_events.exists()
    assert len(list(log_dir.rglob("events.out.tfevents.*"))) == 1  # only the new run's
    assert run_entries(log_dir)[1] == [log_dir / "NOTES.md"]  # all else an SB3 run writes is known as a run's
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("--overwrite: ") and "NOTES.md" in err[0], err


def test_a_symbolic_link_where_a_run_writes_is_refused_before_anything_is_deleted(tmp_path, capsys):
    log_dir = tmp_path / "run"
    train.run([*TD, "--log-dir", str(log_dir)])
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "precious").write_text("x")
    (log_dir / "env_log").symlink_to(elsewhere)
    before = _files(log_dir)
    line = _one_error(train.main([*TD, "--log-dir", str(log_dir), "--overwrite"]), capsys.readouterr().err)
    assert "symbolic link" in line and "env_log" in line
    assert _files(log_dir) == before and (elsewhere / "precious").read_text() == "x"


# ------------------------------------------------------------------ the lock
def test_a_run_holds_its_log_dir_so_a_second_train_is_one_line_and_changes_nothing(tmp_path, capsys):
    log_dir = tmp_path / "run"
    argv = [*TD, "--max-episodes", "40", "--log-dir", str(log_dir)]
    seen: list[tuple[str, int, str, bool]] = []

    def report(episode: int, progress) -> None:
        if episode == 20:  # mid-run: config.yml and an open event file in the folder
            before = _files(log_dir)
            for flags in (["--overwrite", "--seed", "1"], ["--resume"], []):
                code = train.main([*argv, *flags])
                seen.append((" ".join(flags), code, capsys.readouterr().err, _files(log_dir) == before))

    summary = train.run(argv, report=report)
    assert len(seen) == 3
    for flags, code, err, unchanged in seen:
        line = _one_error(code, err)
        assert "is in use by a running train" in line and f"(pid {os.getpid()})" in line, (flags, line)
        assert unchanged, flags
    assert summary["seed"] == 0 and json.loads((log_dir / "summary.json").read_text())["seed"] == 0
    assert len(list(log_dir.glob("events.out.tfevents.*"))) == 1


def test_the_lock_of_a_process_that_died_does_not_outlive_it(tmp_path, capsys):
    log_dir = tmp_path / "run"
    train.run([*TD, "--log-dir", str(log_dir)])
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, os, sys, time\n"
            "with open(sys.argv[1], 'a') as lock:\n"
            "    fcntl.flock(lock, fcntl.LOCK_EX); lock.truncate(0); lock.write(f'{os.getpid()} train'); lock.flush()\n"
            "    print('held', flush=True); time.sleep(60)",
            str(log_dir / ".train.lock"),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        line = _one_error(train.main([*TD, "--log-dir", str(log_dir), "--overwrite"]), capsys.readouterr().err)
        assert f"in use by a running train (pid {holder.pid})" in line
    finally:
        holder.kill()
        holder.wait()
    assert train.main([*TD, "--log-dir", str(log_dir), "--overwrite"]) == 0  # killed: the kernel released its lock


# ------------------------------------------------------------------ a full disk
def _no_space(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def test_a_full_disk_at_config_yml_is_one_line_and_leaves_no_log_dir(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(os, "fsync", _no_space)  # atomic writes fsync before the rename
    log_dir = tmp_path / "runs" / "td" / "seed0"
    line = _one_error(train.main([*TD, "--log-dir", str(log_dir)]), capsys.readouterr().err)
    assert "no space left on device" in line and "config.yml" in line
    assert list(tmp_path.iterdir()) == []  # the folders this command made are gone again


def test_a_full_disk_while_logging_scalars_is_one_line_and_leaves_no_log_dir(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(ScalarWriter, "add_scalars", _no_space)
    log_dir = tmp_path / "run"
    line = _one_error(train.main([*TD, "--log-dir", str(log_dir)]), capsys.readouterr().err)
    assert "no space left on device" in line and str(log_dir) in line
    assert not log_dir.exists()


def test_a_full_disk_in_tensorboards_writer_thread_is_one_line_without_a_traceback(tmp_path, capsys, monkeypatch):
    from tensorboard.summary.writer.record_writer import RecordWriter

    monkeypatch.setattr(RecordWriter, "write", _no_space)  # called in TensorBoard's writer thread
    log_dir = tmp_path / "run"
    ppo = ["--algo", "ppo", "--env", "WatchRepair-v0", "--max-episodes", "20", "--no-progress", "--log-dir", str(log_dir)]
    code = train.main(ppo)
    time.sleep(0.2)  # a thread's traceback would be printed by now
    line = _one_error(code, capsys.readouterr().err)
    assert "no space left on device" in line and not log_dir.exists()


def test_a_full_disk_in_a_log_dir_that_existed_keeps_it(tmp_path, capsys, monkeypatch):
    log_dir = tmp_path / "run"
    train.run([*TD, "--log-dir", str(log_dir)])
    (log_dir / "NOTES.md").write_text("mine")
    monkeypatch.setattr(ScalarWriter, "add_scalars", _no_space)
    assert train.main([*TD, "--log-dir", str(log_dir), "--overwrite"]) == 2
    notice, line = capsys.readouterr().err.strip().splitlines()  # what --overwrite kept, then the error
    assert notice.startswith("--overwrite: ") and line.startswith("error: ") and "no space left on device" in line
    assert (log_dir / "NOTES.md").read_text() == "mine" and (
        log_dir / "config.yml"
    ).is_file()  # what the failed run wrote: --resume or --overwrite replaces it


def test_no_space_finds_the_errno_behind_a_chain_of_exceptions():
    try:
        try:
            _no_space()
        except OSError:
            raise RuntimeError("the writer failed")  # noqa: B904 (an implicit chain, as a library raises it)
    except RuntimeError as exc:
        assert cli.space_error(exc).errno == errno.ENOSPC
    assert cli.space_error(RuntimeError("x")) is None and cli.space_error(OSError(errno.EACCES, "no")) is None


# ------------------------------------------------------------------ a log dir that is a symbolic link
def test_a_log_dir_that_is_a_symbolic_link_is_the_folder_it_points_to(tmp_path, capsys):
    target = tmp_path / "disk" / "runs"
    target.mkdir(parents=True)
    link = tmp_path / "run"
    link.symlink_to(target, target_is_directory=True)
    first = train.run([*TD, "--log-dir", str(link)])
    (target / "NOTES.md").write_text("mine")
    replaced = train.run([*TD, "--log-dir", str(link), "--overwrite", "--hyperparams", "epsilon=0.2"])
    assert replaced["config_hash"] != first["config_hash"]
    _tamper_summary(target)
    again = train.run([*TD, "--log-dir", str(link), "--resume", "--hyperparams", "epsilon=0.2"])
    assert again["config_hash"] == replaced["config_hash"]
    assert link.is_symlink() and link.resolve() == target.resolve() and (target / "NOTES.md").read_text() == "mine"
    assert json.loads((target / "summary.json").read_text())["checksum"] == again["checksum"]


@pytest.mark.parametrize("flags", [[], ["--overwrite"], ["--resume"]])
def test_a_dangling_symbolic_link_as_log_dir_is_one_line(tmp_path, capsys, flags):
    link = tmp_path / "run"
    link.symlink_to(tmp_path / "gone")
    line = _one_error(train.main([*TD, "--log-dir", str(link), *flags]), capsys.readouterr().err)
    assert "symbolic link" in line and "does not exist" in line
    assert link.is_symlink() and not (tmp_path / "gone").exists()
