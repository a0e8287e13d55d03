"""Helpers shared by the tests: commands started in a session of their own and the process tree read from /proc,
one-line errors, strict JSON, tiny-LLM command lines, an env whose first action decides the return, an EpisodeBatch
with every step trained and a tiny experiment spec."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
import types
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import yaml

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


def run_without_xla_settings(code: str) -> subprocess.CompletedProcess:
    """`code` run by this Python in a fresh process at REPO without XLA_FLAGS and JAX_PLATFORMS: XLA reads them once, at
    jax's import, so a test of who sets them first needs a process that has not imported jax."""
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)


def replayed_sokoban_turns(examples: list[dict], env) -> tuple[int, list[tuple[str, tuple[str, ...]]]]:
    """A Sokoban warm start's examples replayed on `env`: (episodes, [(each answer, the optimal moves of the board it
    answered)]). An episode starts where the prompt is the system prompt and a board, which must be the board of its
    seed (the warm start's boards are 10,000 on)."""
    episode, turns = -1, []
    for example in examples:
        if len(example["prompt"]) == 2:
            episode += 1
            assert example["prompt"][1]["content"] == env.reset(seed=10_000 + episode)[0]
        answer = example["completion"][0]["content"]
        turns.append((answer, env.unwrapped._solution.optimal_moves(env.unwrapped._state)))
        env.step(answer)
    return episode + 1, turns


def load_file(path: str, name: str) -> types.ModuleType:
    """The module of the file REPO/path, imported under `name` (benchmarks and examples are files, not packages)."""
    spec = importlib.util.spec_from_file_location(name, REPO / path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def two_process_train_argv(iterations: int, *hyperparams: str) -> list[str]:
    """`algorithms.train` arguments of the multi-process tests' run: vcbm-loop on TextWatchRepair (seed 3, 3 turns),
    checkpointed every iteration, without a progress bar; `hyperparams` go before the turns' (model and log dir are the
    caller's)."""
    return [
        "--algo", "vcbm-loop", "--env", "TextWatchRepair-v0", "--seed", "3", "--iterations", str(iterations),
        "--checkpoint-every", "1", "--no-progress", "--hyperparams", *hyperparams, "env_kwargs={max_turns: 3}", "max_turns=3",
    ]  # fmt: skip


class DecideFirst(gym.Env):
    """The first action decides the return, paid at the last of HORIZON steps (`payoff`: 1 for action 1, 0 for action
    0, plus noise); later actions do nothing. State [decided value (0 before, 1 + action after), clock]."""

    HORIZON = 4
    observation_space = gym.spaces.MultiDiscrete([3, HORIZON + 1])
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t, self.decided = 0, 0
        return np.array([0, 0]), {}

    def payoff(self) -> float:
        return float(self.decided - 1) + 0.3 * float(self.np_random.normal())

    def step(self, action):
        if self.t == 0:
            self.decided = 1 + int(action)
        self.t += 1
        done = self.t >= self.HORIZON
        reward = self.payoff() if done else 0.0
        info = {"first_decision_optimal": self.decided == 2} if done else {}
        return np.array([self.decided, self.t]), reward, done, False, info


def make_batch(rewards, mask=None, **fields):
    """An EpisodeBatch of `rewards` (B, T); `mask` defaults to every step trained."""
    from vcbm_gym.credit.base import EpisodeBatch

    rewards = np.asarray(rewards, dtype=float)
    return EpisodeBatch(rewards, np.ones(rewards.shape, bool) if mask is None else mask, **fields)


def write_tiny_spec(path: Path, **changes) -> Path:
    """An experiment spec of its own (VCBM against Monte Carlo on WatchRepair-v0, 2 seeds of 40 episodes), with
    `changes` replacing its fields: seconds to run."""
    data = {
        "title": "VCBM against Monte Carlo, a tiny check",
        "kind": "compare",
        "run": {"env": "WatchRepair-v0", "algos": ["vcbm", "mc"], "max_episodes": 40},
        "seeds": {"start": 0, "n": 2},
        "budget": {"ours": "40 episodes", "paper": "until convergence"},
        "measure": {"name": "episodes_to_converge"},
        "comparisons": [{"claim": "vcbm-table2", "treatment": "vcbm", "control": "mc"}],
    } | changes
    path.write_text(yaml.safe_dump(data))
    return path
