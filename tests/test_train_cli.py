import json

import pytest
import yaml
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator


def _one_error_line(result, *needles):
    assert result.returncode != 0
    lines = [line for line in result.stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_unknown_algo(run_cli):
    _one_error_line(run_cli("algorithms.train", "--algo", "sarsa"), "'sarsa'", "expected one of", "vcbm")


def test_unknown_env(run_cli):
    _one_error_line(run_cli("algorithms.train", "--algo", "vcbm", "--env", "Watch-v9"), "'Watch-v9'", "WatchRepair-v0")


def test_unknown_hyperparameter_key(run_cli):
    result = run_cli("algorithms.train", "--algo", "vcbm", "--hyperparams", "z_treshold=3")
    _one_error_line(result, "'z_treshold'", "z_thresh")


def test_wrong_hyperparameter_type(run_cli):
    _one_error_line(run_cli("algorithms.train", "--algo", "vcbm", "--hyperparams", "forced_visits=many"), "forced_visits", "int")


def test_malformed_config_file(run_cli, tmp_path):
    bad = tmp_path / "bad.yml"
    bad.write_text("z_thresh: [4.0\nwarmup_transitions: 10\n")
    _one_error_line(run_cli("algorithms.train", "--algo", "vcbm", "--config", str(bad)), "bad.yml", "expected valid YAML")


def test_unknown_key_in_config_file(run_cli, tmp_path):
    cfg = tmp_path / "typo.yml"
    cfg.write_text("WatchRepair-v0:\n  eta_clok: 0.8\n")
    _one_error_line(run_cli("algorithms.train", "--algo", "vcbm", "--config", str(cfg)), "'eta_clok'", "eta_clock")


def test_missing_config_file(run_cli, tmp_path):
    _one_error_line(run_cli("algorithms.train", "--algo", "vcbm", "--config", "nope.yml"), "nope.yml", "does not exist")


def test_run_writes_resolved_config_summary_and_tensorboard_scalars(run_cli, tmp_path):
    cfg = tmp_path / "flat.yml"
    cfg.write_text("warmup_transitions: 500\nrefresh_every: 250\n")
    log_dir = tmp_path / "run"
    result = run_cli(
        "algorithms.train",
        "--algo",
        "vcbm",
        "--seed",
        "5",
        "--log-dir",
        str(log_dir),
        "--config",
        str(cfg),
        "--hyperparams",
        "forced_visits=10",
        "--max-episodes",
        "60",
    )
    assert result.returncode == 0, result.stderr
    assert f"TensorBoard logs: {log_dir}" in result.stdout
    resolved = yaml.safe_load((log_dir / "config.yml").read_text())
    hp = resolved["hyperparams"]
    # zoo defaults, overlaid by the file, then by --hyperparams and --max-episodes
    assert (hp["warmup_transitions"], hp["refresh_every"], hp["forced_visits"], hp["max_episodes"]) == (500, 250, 10, 60)
    assert hp["z_thresh"] == 4.0 and resolved["seed"] == 5
    summary = json.loads((log_dir / "summary.json").read_text())
    assert summary["episodes_run"] == 60 and summary["converged"] is False and summary["episodes_to_converge"] is None
    events = EventAccumulator(str(log_dir))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    for tag in ("train/correct_moving_average", "train/episode_return", "vcbm/epsilon", "roles/repaired_flag", "roles/timestep"):
        assert tag in tags, tags
    assert len(events.Scalars("train/episode_return")) == 60
    assert events.Scalars("roles/repaired_flag")[-1].value == 3.0  # Role.CONTROLLED


def test_exponent_floats_read_as_floats_in_overrides_and_files(tmp_path):
    """PyYAML's YAML 1.1 rules read `1e-3` as a string; a float field then refused it."""
    from algorithms.common.config import parse_overrides, read_yaml

    assert parse_overrides(["a=1e-3", "b=-2E+2", "c=3", "d=1.5", "e=1e3x", "f=[1e-3, 2]"]) == {
        "a": 0.001,
        "b": -200.0,
        "c": 3,
        "d": 1.5,
        "e": "1e3x",
        "f": [0.001, 2],
    }
    path = tmp_path / "c.yml"
    path.write_text("learning_rate: 5e-5\nname: 2e\n")
    assert read_yaml(path) == {"learning_rate": 5e-05, "name": "2e"}


def test_a_single_process_algo_refuses_a_multi_process_launch(tmp_path, monkeypatch):
    import pytest

    from algorithms.common.errors import VcbmGymError
    from algorithms.train import run

    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(VcbmGymError, match="WORLD_SIZE=2"):
        run(["--algo", "vcbm", "--env", "WatchRepair-v0", "--log-dir", str(tmp_path / "r"), "--max-episodes", "2"])
    assert not (tmp_path / "r").exists()


def test_a_repeated_hyperparams_flag_adds_to_the_first_instead_of_replacing_it():
    """argparse's default `store` kept only the last --hyperparams: the first flag's settings were silently lost."""
    from algorithms.compare import build_parser as compare_parser
    from algorithms.train import build_parser as train_parser
    from algorithms.tune import build_parser as tune_parser

    argv = ["--algo", "vcbm", "--hyperparams", "alpha=0.1", "--hyperparams", "beta=2"]
    assert train_parser().parse_args(argv).hyperparams == ["alpha=0.1", "beta=2"]
    assert compare_parser().parse_args(["--algos", "vcbm", "--out", "x", *argv[2:]]).hyperparams == ["alpha=0.1", "beta=2"]
    assert tune_parser().parse_args(["--trials", "1", *argv]).hyperparams == ["alpha=0.1", "beta=2"]


def test_an_env_module_that_fails_at_import_for_any_reason_is_one_line(run_cli, tmp_path):
    (tmp_path / "broken_envs.py").write_text("raise RuntimeError('no licence server')\n")
    result = run_cli("algorithms.train", "--algo", "mc", "--env", "broken_envs:Broken-v0", "--log-dir", "run")
    _one_error_line(result, "'broken_envs'", "RuntimeError: no licence server", "expected an importable module")
    assert "Traceback" not in result.stderr and not (tmp_path / "run").exists()


def test_env_ids_that_are_file_paths_are_one_line(capsys, tmp_path):
    from algorithms.train import main

    for env_id, needle in [("./envs.py:X-v0", "not a module name"), ("/tmp/x", "file path"), ("a/b/c", "file path")]:
        assert main(["--algo", "mc", "--env", env_id, "--log-dir", str(tmp_path / "run")]) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], lines
    assert not (tmp_path / "run").exists()


def test_sb3_constructor_refusals_are_one_line_naming_the_setting_and_write_nothing(capsys, tmp_path):
    """SB3 and torch refuse these only when the model is built: a traceback after config.yml was written."""
    from algorithms.train import main

    cases = [
        (["--algo", "ppo", "--hyperparams", "policy_kwargs={foo: 1}"], ["policy_kwargs", "'foo'", "net_arch"]),
        (["--algo", "a2c", "--hyperparams", "policy_kwargs={net_arch: [-4]}"], ["policy_kwargs.net_arch=[-4]", ">= 1"]),
        (["--algo", "ppo", "--hyperparams", "n_steps=1000000000000"], ["n_steps=1000000000000", "rollout buffer", "memory"]),
        (["--algo", "dqn", "--hyperparams", "buffer_size=100000000000000"], ["buffer_size=100000000000000", "replay buffer"]),
        (
            ["--algo", "ppo", "--hyperparams", "policy_kwargs={activation_fn: relu}"],
            ["policy_kwargs", "'relu'", "torch.nn class"],
        ),
        (["--algo", "ppo", "--hyperparams", "batch_size=1"], ["batch_size=1", "AssertionError"]),
    ]
    for argv, needles in cases:
        assert main([*argv, "--log-dir", str(tmp_path / "run")]) == 2, argv
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), lines
        for needle in needles:
            assert needle in lines[0], (needle, lines[0])
        assert not (tmp_path / "run").exists(), argv
    # the corrected command runs into the same log dir (nothing of the refused ones is in the way)
    assert main(["--algo", "ppo", "--max-episodes", "2", "--no-progress", "--log-dir", str(tmp_path / "run")]) == 0
    assert (tmp_path / "run" / "summary.json").is_file()


def test_a_linear_schedule_decays_from_its_start_to_zero_over_the_runs_step_budget(tmp_path):
    """`lin_<start>` (rl-zoo3's notation): SB3 gets a schedule of the remaining progress, config.yml the string."""
    from algorithms.sb3.runner import build
    from algorithms.train import resolve_spec

    settings = {"learning_rate": "lin_1e-3", "clip_range": "lin_0.2", "n_steps": 64, "batch_size": 64, "n_envs": 1}
    spec = resolve_spec("ppo", "WatchRepair-v0", 0, {**settings, "max_episodes": 4, "stop_at_convergence": False})
    assert spec.hyperparams["learning_rate"] == "lin_1e-3" and spec.hyperparams["clip_range"] == "lin_0.2"
    model = build(spec, str(tmp_path)).model
    seen, train = [], model.train

    def recording_train():
        train()
        progress = model._current_progress_remaining
        seen.append((progress, model.policy.optimizer.param_groups[0]["lr"], model.clip_range(progress)))

    model.train = recording_train
    model.learn(total_timesteps=4 * 50)  # the run's budget: 4 episodes of WatchRepair's 50 steps
    # 64-step rollouts end at steps 64, 128, 192 and (SB3 fills a last rollout past the budget) 256 of 200:
    # progress remaining 0.68, 0.36, 0.04, -0.28, where the schedule stays at its end, 0
    assert [round(p, 6) for p, _, _ in seen] == [0.68, 0.36, 0.04, -0.28]
    assert [lr for _, lr, _ in seen] == pytest.approx([6.8e-4, 3.6e-4, 0.4e-4, 0.0])
    assert [clip for _, _, clip in seen] == pytest.approx([0.136, 0.072, 0.008, 0.0])


@pytest.mark.parametrize("bad", ["lin_x", "lin_-1e-3", "lin_", "cos_1e-3", "lin_nan"])
def test_a_bad_schedule_is_one_line_naming_it_and_writes_nothing(capsys, tmp_path, bad):
    from algorithms.train import main

    assert main(["--algo", "ppo", "--hyperparams", f"learning_rate={bad}", "--log-dir", str(tmp_path / "run")]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and f"learning_rate={bad!r}" in lines[0] and "'lin_<" in lines[0], lines
    assert not (tmp_path / "run").exists()
