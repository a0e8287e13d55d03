"""bsuite's credit-assignment and memory experiments as Gymnasium envs, on bsuite's own code.

bsuite (Osband et al. 2020, "Behaviour Suite for Reinforcement Learning") names every setting of
every experiment by a `bsuite_id`, "<experiment>/<setting index in the experiment's sweep>", e.g.
`umbrella_length/9` (a chain of 10 steps). `BSuiteEnv(bsuite_id)` builds that setting with
`bsuite.load` (the package's own environments, not a re-implementation) and speaks Gymnasium:

- observations flattened to a Box with the experiment's true bounds, or, with
  `integer_observations=True`, the same values as a MultiDiscrete grid for the tabular arm (time as
  the step count, bits as 0/1, a context shifted to start at 0);
- the episode length known before any step (`episode_steps`, and `params.horizon`, where the SB3
  runner reads an env's horizon);
- the env contract's evaluation keys on the last step (ARCHITECTURE.md, "The env contract"):
  `first_decision_optimal` where the first action decides the return and the env knows the best
  one (umbrella: take the umbrella iff it will rain; discounting_chain: the chain with the 10%
  bonus, the largest undiscounted return), `is_success` where the last reward says win or lose
  (umbrella, memory);
- with `log_dir` (or `env.log_to(dir)` before the first reset: how a runner hands the env it plays its
  run's directory), bsuite's own CSV logging (`bsuite.utils.wrappers.Logging`, `csv_logging.Logger`)
  into that directory: one file per bsuite_id, so every run (every seed) needs its own directory.
  The file is claimed when the first row is written, so a second env logging the same bsuite_id
  into the same directory fails at its first logged episode instead of mixing the two runs.
  `algorithms/bsuite_score.py` scores such directories with bsuite's own analysis.

`snapshot()` / `restore(state, outcome_seed)` (envs/snapshot.py): bsuite's raw environments are plain Python
objects (ints, arrays and a legacy `RandomState`), so a snapshot is a copy of the raw env's attributes (through
pickle) with the adapter's own. bsuite draws everything from that one `RandomState` (umbrella's coin-flip
rewards and distractors, a memory chain's context at reset), so an outcome seed replaces it: the rest of the
episode and every later one come from a `RandomState` seeded from the outcome seed. An env that writes bsuite's
CSV log refuses `restore` (the log must count each episode once, in order): branch a copy built without
`log_dir`.

An id it does not know is one `BSuiteIdError` line naming the experiment's settings (`bsuite_id_problem`;
`env_id_problem` for an env id such as `bsuite:umbrella_length/23`), and `BSuite-v0` without a bsuite_id says
that one is required.

bsuite itself is imported only when an env is built (it takes about a second): `vcbm_gym` registers
one Gymnasium id per bsuite_id from `SWEEP_SIZES` without importing it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from envs.snapshot import SnapshotError, SnapshotMixin

SEPARATOR = "/"  # bsuite.sweep.SEPARATOR
EXAMPLE_ID = "umbrella_length/9"
# What bsuite.utils.wrappers.Logging._log_bsuite_data writes for every env; the env's bsuite_info() adds its own.
LOGGED_COLUMNS = ("steps", "episode", "total_return", "episode_len", "episode_return")
INSTALL_HINT = "bsuite is not installed: pip install 'vcbm-gym[bsuite]' (shimmy[bsuite])"


class BSuiteNotInstalled(ModuleNotFoundError, ValueError):
    """bsuite is missing: an import error to Python, and a ValueError so that a CLI that turns an env
    constructor's ValueError into one line (algorithms.common.config.make_env) reports it so."""


@dataclass(frozen=True)
class _Layout:
    """What bsuite's raw env does not say in its specs: the bounds of each observation component, the
    integer grid it lives on, the episode length, and which contract keys the env can report."""

    horizon: Callable[[Any], int]  # raw env -> steps per episode
    bounds: Callable[[Any], tuple[np.ndarray, np.ndarray]]  # raw env -> (low, high) of the flat observation
    grid: Callable[[Any], np.ndarray]  # raw env -> MultiDiscrete nvec of the integer view
    to_grid: Callable[[Any, np.ndarray], np.ndarray]  # (raw env, flat observation) -> integer view
    optimal_first_action: Callable[[Any], int] | None  # raw env just after reset -> the best first action
    success_is_positive_last_reward: bool


def _elapsed(time_to_live: np.ndarray, length: int) -> np.ndarray:
    # bsuite shows time as 1 - t / length; the step count t is the exact grid value.
    return np.rint((1.0 - time_to_live) * length).astype(np.int64)


def _umbrella_bounds(raw: Any) -> tuple[np.ndarray, np.ndarray]:
    n = 3 + raw._n_distractor  # (need_umbrella, has_umbrella, time_to_live, distractor bits)
    return np.zeros(n, np.float32), np.ones(n, np.float32)


def _umbrella_grid(raw: Any) -> np.ndarray:
    return np.array([2, 2, raw._chain_length + 1] + [2] * raw._n_distractor, dtype=np.int64)


def _umbrella_to_grid(raw: Any, obs: np.ndarray) -> np.ndarray:
    out = np.rint(obs).astype(np.int64)
    out[2] = _elapsed(obs[2], raw._chain_length)
    return out


def _memory_bounds(raw: Any) -> tuple[np.ndarray, np.ndarray]:
    # (time_to_live, query index on the last step, context bits as -1/+1 on the first step, else 0)
    # With one bit the query is always 0; a bound of 1 keeps the Box from being degenerate (low == high).
    low = np.array([0.0, 0.0] + [-1.0] * raw._num_bits, np.float32)
    high = np.array([1.0, max(raw._num_bits - 1, 1)] + [1.0] * raw._num_bits, np.float32)
    return low, high


def _memory_to_grid(raw: Any, obs: np.ndarray) -> np.ndarray:
    out = np.rint(obs).astype(np.int64)
    out[0] = _elapsed(obs[0], raw._memory_length)
    out[2:] += 1
    return out


_UMBRELLA = _Layout(
    horizon=lambda raw: raw._chain_length,
    bounds=_umbrella_bounds,
    grid=_umbrella_grid,
    to_grid=_umbrella_to_grid,
    # The first action sets has_umbrella; the last step pays +1 iff it equals need_umbrella (drawn at reset).
    optimal_first_action=lambda raw: int(raw._need_umbrella),
    success_is_positive_last_reward=True,
)
_MEMORY = _Layout(
    horizon=lambda raw: raw._memory_length + 1,
    bounds=_memory_bounds,
    grid=lambda raw: np.array([raw._memory_length + 1, raw._num_bits] + [3] * raw._num_bits, dtype=np.int64),
    to_grid=_memory_to_grid,
    optimal_first_action=None,  # the deciding action is the last one
    success_is_positive_last_reward=True,
)
_DISCOUNTING_CHAIN = _Layout(
    horizon=lambda raw: raw._episode_len,
    # (context: -1 before the first action, then the chosen chain; time t / episode_len)
    bounds=lambda raw: (np.array([-1.0, 0.0], np.float32), np.array([raw._n_actions - 1, 1.0], np.float32)),
    grid=lambda raw: np.array([raw._n_actions + 1, raw._episode_len + 1], dtype=np.int64),
    to_grid=lambda raw, obs: np.array([int(round(obs[0])) + 1, int(round(obs[1] * raw._episode_len))], dtype=np.int64),
    # The first action picks the chain; every chain pays 1 once, the bonus chain 1.1: bsuite's optimal_return.
    optimal_first_action=lambda raw: int(np.argmax(raw._rewards)),
    success_is_positive_last_reward=False,
)

LAYOUTS: Mapping[str, _Layout] = {
    "umbrella_length": _UMBRELLA,
    "umbrella_distract": _UMBRELLA,
    "discounting_chain": _DISCOUNTING_CHAIN,
    "memory_len": _MEMORY,
    "memory_size": _MEMORY,
}
# The number of settings in each supported experiment's sweep (bsuite 0.3: len(bsuite.sweep.<EXPERIMENT>)),
# so that vcbm_gym registers the ids without importing bsuite; tests check it against bsuite.sweep.
SWEEP_SIZES: Mapping[str, int] = {
    "umbrella_length": 23,
    "umbrella_distract": 23,
    "discounting_chain": 20,
    "memory_len": 23,
    "memory_size": 17,
}
BSUITE_IDS: tuple[str, ...] = tuple(f"{name}{SEPARATOR}{i}" for name, size in SWEEP_SIZES.items() for i in range(size))


class BSuiteIdError(ValueError):
    """No bsuite_id, or one this adapter does not know. The message stands on its own (it names the id and the
    valid ones), so that algorithms.common.config.make_env reports it without the env_kwargs around it."""


def bsuite_id_problem(text: str, prefix: str = "") -> str | None:
    """Why `text` is not a bsuite_id this adapter knows, naming the valid ones (examples written with `prefix`,
    e.g. "bsuite:"); None for a known id."""
    name, sep, index = text.partition(SEPARATOR)
    if name not in SWEEP_SIZES:
        return (
            f"experiment {name!r} is none of {', '.join(SWEEP_SIZES)}: expected {prefix}<experiment>/<setting> "
            f"(e.g. {prefix}{EXAMPLE_ID})"
        )
    last = SWEEP_SIZES[name] - 1
    settings = f"{name} has settings 0 to {last} (e.g. {prefix}{name}{SEPARATOR}{last})"
    if not sep:
        return f"no setting: expected {prefix}{name}{SEPARATOR}<setting>; {settings}"
    if not (index.isascii() and index.isdigit() and index == str(int(index))):
        return f"setting {index!r} is not written as bsuite writes it (digits, no sign, no leading zero); {settings}"
    if int(index) > last:
        return settings
    return None


def parse_bsuite_id(bsuite_id: Any) -> tuple[str, int]:
    """'umbrella_length/9' -> ('umbrella_length', 9); BSuiteIdError (one line) for an id this adapter does not know."""
    if not isinstance(bsuite_id, str):
        raise BSuiteIdError(f"bsuite_id={bsuite_id!r}: expected a string '<experiment>/<setting>' (e.g. {EXAMPLE_ID})")
    problem = bsuite_id_problem(bsuite_id)
    if problem is not None:
        raise BSuiteIdError(f"bsuite_id={bsuite_id!r}: {problem}")
    name, _, index = bsuite_id.partition(SEPARATOR)
    return name, int(index)


def env_id_problem(env_id: str) -> str | None:
    """For an env id in bsuite's form that names no registered setting (`bsuite:umbrella_length`,
    `bsuite:umbrella_length/23`, `bsuite:nope/1`, `umbrella_length/03`): one line naming the experiment's valid
    settings; None for any other id (a registered one, or one that is not bsuite's)."""
    module, _, name = env_id.rpartition(":")
    if module != "bsuite" and name.partition(SEPARATOR)[0] not in SWEEP_SIZES:
        return None
    problem = bsuite_id_problem(name, prefix="bsuite:")
    return None if problem is None else f"--env {env_id!r}: {problem}"


def csv_log_path(log_dir: str | os.PathLike, bsuite_id: str) -> str:
    """Where bsuite's CSV logger writes `bsuite_id`'s results in `log_dir` (bsuite's own file naming)."""
    from bsuite.logging import csv_logging

    safe_id = bsuite_id.replace(SEPARATOR, csv_logging.SAFE_SEPARATOR)
    return os.path.join(os.fspath(log_dir), f"{csv_logging.BSUITE_PREFIX}{safe_id}.csv")


class RunCsvLogger:
    """bsuite's `csv_logging.Logger`, created at the first row (an env built only to be checked writes
    nothing, not even the directory), with the file claimed exclusively then (two envs of one
    bsuite_id never share a file) and each rewrite of the file atomic (a crash leaves the last
    complete table). Rows and file naming are bsuite's; `bsuite.logging.csv_load` reads the result."""

    def __init__(self, bsuite_id: str, results_dir: str | os.PathLike) -> None:
        self.bsuite_id = bsuite_id
        self.results_dir = os.fspath(results_dir)
        self.path = csv_log_path(self.results_dir, bsuite_id)
        self._logger = None

    def write(self, data: Mapping[str, Any]) -> None:
        import pandas as pd
        from bsuite.logging import csv_logging

        if self._logger is None:
            # bsuite's Logger makes the directory and refuses a file that exists; O_EXCL closes the window
            # between that check and the first write, where another process could create it.
            logger = csv_logging.Logger(self.bsuite_id, self.results_dir, overwrite=False)
            try:
                os.close(os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                raise ValueError(
                    f"bsuite log {self.path} is being written by another env: give every run its own log_dir"
                ) from None
            self._logger = logger
        self._logger._data.append(dict(data))
        partial = f"{self.path}.partial"  # not *.csv: csv_load never reads it
        pd.DataFrame(self._logger._data).to_csv(partial, index=False)
        os.replace(partial, self.path)


@dataclass(frozen=True)
class BSuiteParams:
    """The setting an env plays: its bsuite_id, bsuite's constructor kwargs for it, and its episode length."""

    bsuite_id: str
    experiment: str
    kwargs: Mapping[str, Any]
    horizon: int


class BSuiteEnv(SnapshotMixin, gym.Env):
    """One bsuite setting (`bsuite_id`, e.g. 'umbrella_length/9') as a Gymnasium env; see the module docstring.

    `log_dir`: write bsuite's CSV log of this run there (one directory per run; or later, before the first
    reset, with `log_to`). `integer_observations`: MultiDiscrete observations (the tabular arm) instead
    of the flat Box.
    """

    metadata = {"render_modes": []}
    snapshot_fields = ("_started", "_running", "_first_action", "_optimal_first_action")

    def __init__(
        self,
        bsuite_id: str | None = None,
        log_dir: str | os.PathLike | None = None,
        integer_observations: bool = False,
        render_mode: str | None = None,
    ) -> None:
        if bsuite_id is None:  # a keyword with a default so that the error can say what to pass
            raise BSuiteIdError(
                f"bsuite_id is required: expected env_kwargs={{bsuite_id: {EXAMPLE_ID}}} with BSuite-v0, "
                f"or the id form bsuite:{EXAMPLE_ID}"
            )
        experiment, _ = parse_bsuite_id(bsuite_id)
        if render_mode is not None:
            raise ValueError(f"render_mode={render_mode!r}: bsuite envs do not render (expected None)")
        if not isinstance(integer_observations, (bool, np.bool_)):
            raise ValueError(f"integer_observations={integer_observations!r}: expected true or false")
        try:
            import bsuite
            from bsuite import sweep
            from bsuite.utils import wrappers
        except ModuleNotFoundError as exc:
            raise BSuiteNotInstalled(f"{INSTALL_HINT} ({exc})") from None
        kwargs = dict(sweep.SETTINGS[bsuite_id])
        self.bsuite_id = bsuite_id
        # bsuite.load, not load_from_id: the same env, without load_from_id's banner on stdout.
        self._raw = bsuite.load(experiment, kwargs)
        self._layout = LAYOUTS[experiment]
        self._logging_wrapper = wrappers.Logging
        self.logger: RunCsvLogger | None = None
        self._dm_env = self._raw  # bsuite's Logging wrapper around it once a log dir is given
        self._started = False
        if log_dir is not None:
            self.log_to(log_dir)
        self.episode_steps = int(self._layout.horizon(self._raw))
        self.params = BSuiteParams(bsuite_id, experiment, kwargs, self.episode_steps)
        self.bsuite_num_episodes = int(self._raw.bsuite_num_episodes)  # what bsuite's analysis expects per id
        self.integer_observations = bool(integer_observations)
        self.render_mode = None
        self.action_space = spaces.Discrete(int(self._raw.action_spec().num_values))
        if self.integer_observations:
            self.observation_space = spaces.MultiDiscrete(self._layout.grid(self._raw))
        else:
            low, high = self._layout.bounds(self._raw)
            self.observation_space = spaces.Box(low, high, dtype=np.float32)
        self._running = False
        self._first_action: int | None = None
        self._optimal_first_action: int | None = None

    def log_to(self, log_dir: str | os.PathLike) -> None:
        """Write bsuite's CSV log of this env's episodes into `log_dir` (a runner gives the env it plays its
        run's directory this way; `log_dir=` at construction does the same). Only before the first reset:
        bsuite's log counts every episode from the first."""
        if self._started:
            raise RuntimeError(f"log_to({os.fspath(log_dir)!r}) after the first reset: bsuite's log must see every episode")
        if not isinstance(log_dir, (str, os.PathLike)):
            raise ValueError(f"log_dir={log_dir!r}: expected a directory path")
        self.logger = RunCsvLogger(self.bsuite_id, log_dir)
        self._dm_env = self._logging_wrapper(self._raw, self.logger)

    @property
    def log_columns(self) -> tuple[str, ...]:
        """The columns of bsuite's CSV log of this setting, as bsuite's Logging wrapper writes them."""
        return (*LOGGED_COLUMNS, *self._raw.bsuite_info())

    @property
    def log_path(self) -> str | None:
        """The CSV file bsuite's logger writes (None without `log_dir`)."""
        return None if self.logger is None else self.logger.path

    def _observation(self, raw_observation: Any) -> np.ndarray:
        flat = np.asarray(raw_observation, dtype=np.float32).reshape(-1)
        return self._layout.to_grid(self._raw, flat) if self.integer_observations else flat.copy()

    def snapshot_identity(self) -> tuple:
        return (self.bsuite_id, self.integer_observations)

    def snapshot_state(self) -> dict[str, Any]:
        return {**super().snapshot_state(), "raw": vars(self._raw)}

    def restore_state(self, fields: dict[str, Any]) -> None:
        if self.logger is not None:
            raise SnapshotError(
                f"restore(state) into a {self.bsuite_id} env that writes bsuite's CSV log ({self.log_path}): the log must "
                "count each episode once, in order; restore into an env built without log_dir"
            )
        self._raw.__dict__.update(fields.pop("raw"))
        super().restore_state(fields)

    def redraw_outcome(self, rng: np.random.Generator) -> None:
        # bsuite draws from a legacy RandomState, seeded here from `rng` (restore seeded it with the outcome seed);
        # discounting_chain has none: nothing random happens after its construction
        if hasattr(self._raw, "_rng"):
            self._raw._rng = np.random.RandomState(rng.integers(2**32))

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        if seed is not None and hasattr(self._raw, "_rng"):
            # bsuite draws everything from the raw env's legacy RandomState (as shimmy's BSuiteCompatibilityV0 seeds it).
            self._raw._rng = np.random.RandomState(seed)
        timestep = self._dm_env.reset()
        self._started = self._running = True
        self._first_action = None
        optimal = self._layout.optimal_first_action
        self._optimal_first_action = None if optimal is None else optimal(self._raw)
        return self._observation(timestep.observation), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        if not self._running:
            raise RuntimeError("step() called before reset() or after the episode ended")
        if not self.action_space.contains(action):
            raise ValueError(f"action {action!r} is not in {self.action_space}")
        action = int(action)
        if self._first_action is None:
            self._first_action = action
        timestep = self._dm_env.step(action)
        reward = float(timestep.reward)
        info: dict[str, Any] = {}
        terminated = truncated = False
        if timestep.last():
            self._running = False
            # dm_env: a termination has discount 0, a truncation keeps its discount.
            terminated = bool(timestep.discount == 0)
            truncated = not terminated
            if self._optimal_first_action is not None:
                info["first_decision_optimal"] = self._first_action == self._optimal_first_action
            if self._layout.success_is_positive_last_reward:
                info["is_success"] = reward > 0
        return self._observation(timestep.observation), reward, terminated, truncated, info
