"""An LLM run's checkpoints on --resume: a file that is not what a checkpoint holds is one line naming it (and a
pickle in it never runs); a checkpoint that cannot be written for lack of space is one line, not torch's error."""

from __future__ import annotations

import os
import pickle
import shutil
from pathlib import Path

import pytest
import torch

from algorithms import train
from algorithms.common import log_dir as log_dir_policy

LOOP = [
    "--algo", "vcbm-loop", "--env", "TextWatchRepair-v0", "--model", "tiny-random", "--iterations", "1",
    "--checkpoint-every", "1", "--no-progress",
]  # fmt: skip


class Payload:
    """Unpickled, it would create the file `sentinel`."""

    def __init__(self, sentinel: Path) -> None:
        self.sentinel = sentinel

    def __reduce__(self):
        return os.system, (f"touch {self.sentinel}",)


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    log_dir = tmp_path_factory.mktemp("loop") / "run"
    train.run([*LOOP, "--log-dir", str(log_dir)])
    return log_dir


def test_everything_an_llm_run_writes_is_known_as_a_runs(finished_run):
    own, other = log_dir_policy.run_entries(finished_run)
    assert other == [] and {p.name for p in own} >= {"config.yml", "summary.json", "checkpoints", "history.json"}


@pytest.mark.parametrize(
    "name, content",
    [
        ("optimizer.pt", "torch.save of a payload"),  # the archive torch writes, holding a pickled call
        ("rng_state.pth", "a bare pickle of a payload"),
        ("scheduler.pt", "a bare pickle of a payload"),
        ("model.safetensors", "not safetensors"),
        ("trainer_state.json", "not JSON"),
    ],
)
def test_a_tampered_checkpoint_file_is_one_line_naming_it_and_never_runs(finished_run, tmp_path, capsys, name, content):
    log_dir = tmp_path / "run"
    shutil.copytree(finished_run, log_dir)
    (log_dir / "summary.json").unlink()  # cut short after its checkpoint: --resume continues from it
    (checkpoint,) = (log_dir / "checkpoints").glob("checkpoint-*")
    sentinel = tmp_path / "payload_ran"
    target = checkpoint / name
    if content == "torch.save of a payload":
        torch.save({"state": Payload(sentinel)}, target)
    elif content == "a bare pickle of a payload":
        target.write_bytes(pickle.dumps(Payload(sentinel)))
    else:
        target.write_bytes(b"\x00garbage{")
    capsys.readouterr()
    code = train.main([*LOOP, "--log-dir", str(log_dir), "--resume"])
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: checkpoint file "), lines
    assert repr(str(target)) in lines[0] and "--overwrite" in lines[0]
    assert not sentinel.exists()
    assert not (log_dir / "summary.json").exists()  # nothing was trained


def test_a_checkpoint_torch_cannot_write_on_a_full_disk_is_one_line(tmp_path, capsys, monkeypatch):
    def full_disk(*args, **kwargs):
        raise RuntimeError("basic_ios::clear: iostream error")  # what torch.save says when the disk is full

    monkeypatch.setattr(torch, "save", full_disk)
    monkeypatch.setattr(log_dir_policy, "filesystem_full", lambda path: True)
    log_dir = tmp_path / "run"
    code = train.main([*LOOP, "--log-dir", str(log_dir)])
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error: ")]
    assert code == 2 and len(lines) == 1 and "no space left on device" in lines[0], lines
    assert not log_dir.exists()  # no complete checkpoint to resume from: the folder this command made is gone
    # with space left, the same error is not a full disk: it is not hidden
    monkeypatch.setattr(log_dir_policy, "filesystem_full", lambda path: False)
    with pytest.raises(RuntimeError, match="iostream error"):
        train.main([*LOOP, "--log-dir", str(log_dir)])
