"""The tabular runners on any discrete-action env: observations flattened into a
fresh int64 vector, float boxes and action spaces an agent cannot take refused with one line before
the log dir exists."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces

from algorithms.tabular.observations import TabularObservations, UntabulableSpace
from algorithms.train import main, run

# --- flattening --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "space, obs, flat, flat_space",
    [
        (spaces.Discrete(4, start=3), np.int64(5), [5], spaces.MultiDiscrete([4], start=[3])),
        (spaces.MultiDiscrete([[2, 3], [4, 5]]), np.array([[1, 2], [3, 4]]), [1, 2, 3, 4], spaces.MultiDiscrete([2, 3, 4, 5])),
        (spaces.MultiBinary((2, 2)), np.array([[1, 0], [0, 1]], dtype=np.int8), [1, 0, 0, 1], spaces.MultiDiscrete([2] * 4)),
        (spaces.Box(-3, 7, (1, 3), dtype=np.int32), np.array([[-3, 0, 7]], dtype=np.int32), [-3, 0, 7], None),
        (spaces.Box(0, 1, (2,), dtype=bool), np.array([True, False]), [1, 0], None),
        (
            spaces.Tuple((spaces.Discrete(3), spaces.MultiBinary(2))),
            (np.int64(2), np.array([1, 1], dtype=np.int8)),
            [2, 1, 1],
            spaces.MultiDiscrete([3, 2, 2]),
        ),
    ],
)
def test_discrete_spaces_flatten_to_int64_vectors(space, obs, flat, flat_space):
    observations = TabularObservations(space)
    out = observations.flatten(obs)
    assert out.dtype == np.int64 and out.tolist() == flat
    assert observations.space.contains(out)
    if flat_space is not None:
        assert observations.space == flat_space
    else:  # a Box piece: an int64 Box of the flattened bounds
        assert isinstance(observations.space, spaces.Box) and observations.space.dtype == np.int64
        assert observations.space.low.tolist() == np.broadcast_to(space.low, space.shape).astype(np.int64).reshape(-1).tolist()


def test_a_dict_flattens_in_its_key_order_with_names():
    space = spaces.Dict(
        {"clock": spaces.Discrete(5), "bits": spaces.MultiBinary(2), "level": spaces.Box(0, 9, (1,), dtype=np.int64)}
    )
    observations = TabularObservations(space)
    keys = list(space.spaces)
    obs = {"clock": np.int64(4), "bits": np.array([0, 1], dtype=np.int8), "level": np.array([7])}
    expected = {"clock": [4], "bits": [0, 1], "level": [7]}
    assert observations.flatten(obs).tolist() == [v for key in keys for v in expected[key]]
    named = {"clock": ["clock"], "bits": ["bits[0]", "bits[1]"], "level": ["level"]}
    assert observations.names == tuple(n for key in keys for n in named[key])
    assert isinstance(observations.space, spaces.Box)  # a Box piece makes the flat space a Box
    assert observations.n_components == 4


def test_watch_repairs_space_is_kept_and_every_observation_is_a_new_array():
    space = spaces.MultiDiscrete([2, 51, 51, 4, 51])
    observations = TabularObservations(space)
    assert observations.space is space and observations.names is None
    obs = np.array([0, 3, 1, 2, 10])
    out = observations.flatten(obs)
    obs[:] = 0  # an env rewriting the array it returned
    assert out.tolist() == [0, 3, 1, 2, 10]


@pytest.mark.parametrize(
    "space, needle",
    [
        (spaces.Box(0.0, 1.0, (1, 23), dtype=np.float32), "Box(0.0, 1.0, (1, 23), float32) is a Box of float32 values"),
        (spaces.Tuple((spaces.Discrete(2), spaces.Box(-1.0, 1.0, (2,)))), "is a Box of float32 values"),
        (spaces.Text(5), "is not a Discrete, MultiDiscrete, MultiBinary, integer Box, Tuple or Dict space"),
    ],
)
def test_spaces_without_an_integer_view_are_refused(space, needle):
    with pytest.raises(UntabulableSpace, match=None) as caught:
        TabularObservations(space)
    assert needle in str(caught.value)


# --- the runner on other envs ------------------------------------------------------------------


class ChainEnv(gym.Env):
    """A few steps of a chain; the first action is right when it equals the start bit. Observation and
    action spaces are set per test: `obs` "dict", "float" or "multidiscrete"; `n_actions`, `action_start`."""

    def __init__(self, obs: str = "dict", n_actions: int = 2, action_start: int = 0, length: int = 4) -> None:
        self.kind, self.length = obs, length
        self.action_space = spaces.Discrete(n_actions, start=action_start)
        if obs == "dict":
            self.observation_space = spaces.Dict({"bit": spaces.Discrete(2), "t": spaces.Discrete(length + 1)})
        elif obs == "float":
            self.observation_space = spaces.Box(0.0, 1.0, (1, 23), dtype=np.float32)
        else:
            self.observation_space = spaces.MultiDiscrete([2, length + 1])

    def _obs(self):
        if self.kind == "dict":
            return {"bit": self.bit, "t": self.t}
        if self.kind == "float":
            return np.full((1, 23), self.t / self.length, dtype=np.float32)
        return np.array([self.bit, self.t])

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.bit, self.t, self.first = int(self.np_random.integers(2)), 0, None
        return self._obs(), {}

    def step(self, action):
        if not self.action_space.contains(action):
            raise ValueError(f"action {action!r} outside {self.action_space}")
        self.t += 1
        if self.first is None:
            self.first = int(action) - int(self.action_space.start)
        done = self.t == self.length
        info = {"first_decision_optimal": self.first == self.bit} if done else {}
        return self._obs(), float(done and self.first == self.bit), done, False, info


CHAIN_ID = "VcbmTestChain-v0"
if CHAIN_ID not in gym.registry:
    gym.register(CHAIN_ID, entry_point=ChainEnv)


def _argv(tmp_path, algo, env_kwargs, *extra):
    import json

    return [
        "--algo", algo, "--env", CHAIN_ID, "--seed", "0", "--log-dir", str(tmp_path / "run"), "--no-progress",
        "--max-episodes", "30", "--hyperparams", f"env_kwargs={json.dumps(env_kwargs)}", *extra,
    ]  # fmt: skip


def _one_error_line(capsys, code, *needles):
    assert code == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    for needle in needles:
        assert needle in lines[0], lines[0]


@pytest.mark.parametrize("algo", ["vcbm", "vcbm-plus", "mc", "td", "rudder"])
def test_a_float_box_is_refused_with_one_line_before_the_log_dir_exists(tmp_path, capsys, algo):
    code = main(_argv(tmp_path, algo, {"obs": "float"}))
    _one_error_line(capsys, code, f"algo {algo!r}", "Box(0.0, 1.0, (1, 23), float32)", "integer")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("algo", ["vcbm", "vcbm-plus"])
def test_vcbm_refuses_more_than_two_actions_with_one_line_before_the_log_dir_exists(tmp_path, capsys, algo):
    code = main(_argv(tmp_path, algo, {"obs": "multidiscrete", "n_actions": 5}))
    _one_error_line(capsys, code, "two actions", "Discrete(5)")
    assert not (tmp_path / "run").exists()


def test_a_later_action_outside_the_env_is_refused_before_the_log_dir_exists(tmp_path, capsys):
    code = main(_argv(tmp_path, "mc", {"obs": "multidiscrete", "n_actions": 2}, "later_action=4"))
    _one_error_line(capsys, code, "later_action=4", "[0, 1]")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("algo", ["mc", "td", "rudder"])
def test_first_decision_and_td_agents_run_five_actions_on_a_dict_observation(tmp_path, algo):
    summary = run(_argv(tmp_path, algo, {"obs": "dict", "n_actions": 5, "action_start": -2}))
    assert summary["episodes_run"] == 30


def test_vcbm_runs_actions_that_start_elsewhere_and_names_dict_components(tmp_path):
    summary = run(_argv(tmp_path, "vcbm", {"obs": "dict", "action_start": 1, "length": 4}, "warmup_transitions=40"))
    assert summary["episodes_run"] == 30
    assert set(summary["roles"]) == {"bit", "t"} and summary["roles"]["t"] == "clock"
