"""Batched VCBM seeds (algorithms/tabular/vcbm_batch.py) against separate runs of algorithms.train."""

import numpy as np
import pytest

from algorithms.tabular.vcbm_batch import run_batch
from algorithms.train import run

FIELDS = (
    "converged",
    "episodes_to_converge",
    "episodes_run",
    "final_correct_rate",
    "roles",
    "bookmark_contexts",
    "bookmark_values",
)


def _separate(tmp_path, algo, seed, overrides=()):
    argv = [
        "--algo",
        algo,
        "--env",
        "WatchRepair-v0",
        "--seed",
        str(seed),
        "--log-dir",
        str(tmp_path / f"{algo}{seed}"),
        "--no-progress",
    ]
    return run(argv + (["--hyperparams", *overrides] if overrides else []))


@pytest.mark.parametrize("algo", ["vcbm", "vcbm-plus"])
def test_batched_seeds_equal_separate_runs(tmp_path, algo):
    seeds = [0, 5, 19]
    batched = run_batch(seeds, algo, batch_size=2)  # two chunks
    for seed, got in zip(seeds, batched):
        want = _separate(tmp_path, algo, seed)
        assert got["seed"] == seed
        assert {k: got[k] for k in FIELDS} == {k: want[k] for k in FIELDS}


def test_batched_seeds_equal_separate_runs_when_later_states_are_bookmarks(tmp_path):
    # z_thresh 0 makes the noisy counters "controlled": contexts then include states after t = 0,
    # so the batch must step those seeds through act() one state at a time.
    overrides = ["z_thresh=0.0", "max_episodes=120"]
    batched = run_batch([1, 2], "vcbm", {"z_thresh": 0.0, "max_episodes": 120})
    for seed, got in zip([1, 2], batched):
        want = _separate(tmp_path, "vcbm", seed, overrides)
        assert any(c[-1] > 0 for c in want["bookmark_contexts"])  # a bookmark after t = 0 exists
        assert {k: got[k] for k in FIELDS} == {k: want[k] for k in FIELDS}


def test_random_actions_draw_what_one_call_per_step_draws():
    from gymnasium import spaces

    from algorithms.tabular.vcbm import VCBMAgent, VCBMConfig

    space = spaces.MultiDiscrete([2, 3])
    a, b = (VCBMAgent(space, spaces.Discrete(2), VCBMConfig(), seed=7) for _ in range(2))
    a.rng.random(), b.rng.random()
    stepwise = [a.act(np.array([0, 0])) for _ in range(49)] + [float(a.rng.random())]
    at_once = b.random_actions(49).tolist() + [float(b.rng.random())]
    assert stepwise == at_once


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"warmup_transitions": 2010}, r"warmup_transitions=2010: .*multiple of the horizon \(50\)"),
        ({"refresh_every": 0}, r"refresh_every=0: expected a finite number >= 1"),
    ],
)
def test_batched_runner_rejects_refreshes_inside_an_episode(overrides, message):
    with pytest.raises(ValueError, match=message):
        run_batch([0], "vcbm", overrides)


def test_batched_runner_runs_the_papers_test_only():
    # it counts change frequencies (Eq. 10), not the value test's arrivals; the zoo's WatchRepair-v0 entry is the paper's
    with pytest.raises(ValueError, match=r"causal_test='frequency\+value': the batched runner counts change frequencies only"):
        run_batch([0], "vcbm", {"causal_test": "frequency+value"})


def test_batched_runner_rejects_non_vcbm_algos():
    with pytest.raises(ValueError, match="algo 'rudder'"):
        run_batch([0], "rudder")


def test_uniform_actions_in_blocks_draw_what_one_call_per_step_draws():
    from algorithms.tabular.vcbm import UniformActions

    stepwise, blocked = np.random.default_rng(3), np.random.default_rng(3)
    uniform = UniformActions(blocked, 2, block=8)
    want, got = [], []
    for run_length in [3, 0, 8, 13, 1, 20]:  # uniform actions, then another use of the generator
        want += [int(stepwise.integers(2)) for _ in range(run_length)] + [stepwise.random()]
        got += [uniform.next() for _ in range(run_length)]
        uniform.sync()
        got.append(blocked.random())
    assert got == want
