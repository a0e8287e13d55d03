"""Helpers shared by the tests: commands started in a session of their own and the process tree read from /proc,
one-line errors, strict JSON, a tiny-LLM command line and an EpisodeBatch with every step trained."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
GONE_WITHIN_S = 10.0

needs_proc = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads the process tree from /proc")


def descendants(pid: int) -> set[int]:
    """Every process below `pid` (read from /proc)."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            parents[int(entry.name)] = int(fields[1])
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def start_module(module: str, *args: str, cwd: Path | str | None = None, **popen_kwargs) -> subprocess.Popen:
    """`python -m module args...` of this checkout, in a session of its own (a signal to the test's process group
    does not reach it), its stdout and stderr piped as text."""
    return subprocess.Popen(
        [sys.executable, "-m", module, *args],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        **popen_kwargs,
    )


def alive(pid: int) -> bool:
    """Running, and neither a zombie nor dead (a killed worker of a killed parent is reaped by init, maybe later)."""
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def wait_gone(pids: set[int], within_s: float = GONE_WITHIN_S) -> set[int]:
    """The pids still alive after `within_s` seconds (returns as soon as none is)."""
    deadline = time.monotonic() + within_s
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    return {pid for pid in pids if alive(pid)}


def one_error_line(capsys, *needles: str) -> str:
    """The one `error: ...` line printed on stderr (and nothing else); it names every needle."""
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def strict_json(text: str):
    """json.loads that refuses NaN and Infinity, as RFC 8259 (and strict readers such as jq or JavaScript) do."""

    def refuse(constant: str):
        raise ValueError(f"not strict JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


def tiny_llm_argv(
    algo: str,
    log_dir: Path | str,
    *extra: str,
    env: str = "TextWatchRepair-v0",
    model: str = "tiny-random",
    iterations: int = 1,
    hyperparams: tuple[str, ...] | list[str] = (),
) -> list[str]:
    """`algorithms.train` arguments of an LLM run of a tiny model (by default the untrained one), without a progress
    bar; `extra` are further flags, `hyperparams` the `--hyperparams` entries."""
    argv = ["--algo", algo, "--env", env, "--model", model, "--no-progress", "--iterations", str(iterations)]
    argv += [*extra, "--log-dir", str(log_dir)]
    return argv + ["--hyperparams", *hyperparams] if hyperparams else argv


def make_batch(rewards, mask=None, **fields):
    """An EpisodeBatch of `rewards` (B, T); `mask` defaults to every step trained."""
    from vcbm_gym.credit.base import EpisodeBatch

    rewards = np.asarray(rewards, dtype=float)
    return EpisodeBatch(rewards, np.ones(rewards.shape, bool) if mask is None else mask, **fields)
