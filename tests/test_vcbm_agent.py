import json

import pytest

from algorithms.train import run
from envs.watch_repair import GROUND_TRUTH_ROLES


def _train(tmp_path, seed, name):
    return run(
        ["--algo", "vcbm", "--env", "WatchRepair-v0", "--seed", str(seed), "--log-dir", str(tmp_path / name), "--no-progress"]
    )


@pytest.mark.parametrize("seed", [0, 1])
def test_vcbm_converges_and_recovers_the_causal_roles(tmp_path, seed):
    summary = _train(tmp_path, seed, f"s{seed}")
    assert summary["converged"] is True
    # Warm-up 40 episodes + ~120 forced visits per brand + a full 750-episode window: ~1,200.
    assert 1_100 <= summary["episodes_to_converge"] <= 1_400
    assert summary["final_correct_rate"] >= 0.95
    assert tuple(summary["roles"].values()) == GROUND_TRUTH_ROLES
    on_disk = json.loads((tmp_path / f"s{seed}" / "summary.json").read_text())
    for key in ("algo", "env", "seed", "converged", "episodes_to_converge", "final_correct_rate", "roles", "wall_time_s"):
        assert key in on_disk
    # The bookmark is the t=0 decision of an unrepaired watch, one key per brand.
    assert summary["bookmark_contexts"] == [[0, 0]]


def test_same_seed_reproduces_episodes_to_converge(tmp_path):
    first = _train(tmp_path, 3, "a")
    second = _train(tmp_path, 3, "b")
    assert first["episodes_to_converge"] == second["episodes_to_converge"]
    assert first["bookmark_values"] == second["bookmark_values"]
