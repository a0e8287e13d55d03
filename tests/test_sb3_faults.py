"""The SB3 arm's refusals and round trips: a run reruns from its own config.yml; values SB3 takes as a string or a
number; credit rules on Discrete observations; the credit rules' lesson buffers in the memory check; the device;
the env's spaces against the algorithm's; and the episodic MuJoCo benchmark's arguments."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import yaml

import vcbm_gym  # noqa: F401  (registers WatchRepair-v0, CreditTree-v0)
from algorithms.common.errors import ConfigError, VcbmGymError
from algorithms.experiment import compare, suite
from algorithms.experiment.results import locked
from algorithms.sb3 import buffers, callbacks, checks, runner
from algorithms.train import main as train_main
from algorithms.train import resolve_spec
from algorithms.train import run as train
from tests.helpers import one_error_line


def test_a_sac_run_reruns_from_its_own_config_yml(tmp_path):
    """config.yml records SAC's ent_coef and target_entropy as SB3's default "auto"; --config of that file resolves."""
    first = tmp_path / "first"
    argv = ["--algo", "sac", "--env", "Pendulum-v1", "--max-episodes", "1", "--no-progress"]
    assert train_main([*argv, "--hyperparams", "learning_starts=50", "--log-dir", str(first)]) == 0
    record = yaml.safe_load((first / "config.yml").read_text())
    assert record["hyperparams"]["ent_coef"] == "auto" and record["hyperparams"]["target_entropy"] == "auto"
    again = tmp_path / "again"
    assert train_main([*argv, "--config", str(first / "config.yml"), "--log-dir", str(again)]) == 0
    assert yaml.safe_load((again / "config.yml").read_text())["config_hash"] == record["config_hash"]


@pytest.mark.parametrize(
    "algo, env, value",
    [
        ("sac", "Pendulum-v1", {"ent_coef": "auto"}),
        ("sac", "Pendulum-v1", {"ent_coef": "auto_0.1"}),
        ("sac", "Pendulum-v1", {"ent_coef": 0.05}),
        ("sac", "Pendulum-v1", {"target_entropy": -1.5}),
        ("sac", "Pendulum-v1", {"train_freq": [1, "episode"], "gradient_steps": -1}),
        ("sac", "Pendulum-v1", {"buffer_size": 5000.0, "learning_starts": 10}),
        ("sac", "Pendulum-v1", {"policy_kwargs": {"net_arch": {"pi": [32], "qf": [32]}, "n_critics": 1}}),
        ("sac", "Pendulum-v1", {"policy_kwargs": {"activation_fn": "nn.Tanh", "optimizer_class": "torch.optim.RMSprop"}}),
        ("td3", "Pendulum-v1", {"target_policy_noise": 0.1, "target_noise_clip": 0.3, "policy_delay": 3}),
        ("td3", "Pendulum-v1", {"train_freq": [4, "step"]}),
        ("dqn", "CartPole-v1", {"train_freq": [2, "episode"]}),
        ("ppo", "CartPole-v1", {"clip_range": "lin_0.2", "ent_coef": 0.01}),
    ],
)
def test_values_sb3_takes_round_trip_through_config_yml(algo, env, value):
    """Each value resolves, builds SB3's model, and resolves from config.yml's record of it to the same config hash."""
    spec = resolve_spec(algo, env, 0, {"max_episodes": 1, **value})
    runner.ARM.validate(spec)
    recorded = yaml.safe_load(yaml.safe_dump(dict(spec.hyperparams)))
    again = resolve_spec(algo, env, 0, recorded)
    runner.ARM.validate(again)
    assert again.config_hash == spec.config_hash


def test_train_freq_and_torch_classes_reach_sb3_as_it_takes_them():
    policy_kwargs = {"activation_fn": "Tanh", "optimizer_class": "RMSprop"}
    spec = resolve_spec(
        "sac", "Pendulum-v1", 0, {"max_episodes": 1, "train_freq": [2, "episode"], "policy_kwargs": policy_kwargs}
    )
    built = runner.build(spec, tensorboard_log=None)
    built.env.close()
    assert (built.model.train_freq.frequency, built.model.train_freq.unit.value) == (2, "episode")
    assert built.model.policy_kwargs["activation_fn"] is torch.nn.Tanh
    assert isinstance(built.model.actor.optimizer, torch.optim.RMSprop)
    assert spec.hyperparams["policy_kwargs"] == policy_kwargs  # config.yml records the names


@pytest.mark.parametrize(
    "algo, env, value, named",
    [
        ("sac", "Pendulum-v1", {"ent_coef": "autox"}, "ent_coef='autox'"),
        ("sac", "Pendulum-v1", {"ent_coef": "auto_-1"}, "ent_coef='auto_-1'"),
        ("sac", "Pendulum-v1", {"ent_coef": "auto_0"}, "ent_coef='auto_0'"),
        ("sac", "Pendulum-v1", {"ent_coef": -0.1}, "ent_coef=-0.1"),
        ("sac", "Pendulum-v1", {"target_entropy": "high"}, "target_entropy='high'"),
        ("sac", "Pendulum-v1", {"train_freq": 1.5}, "train_freq=1.5"),
        ("sac", "Pendulum-v1", {"train_freq": 0}, "train_freq=0"),
        ("sac", "Pendulum-v1", {"train_freq": [1, "epoch"]}, "train_freq=[1, 'epoch']"),
        ("td3", "Pendulum-v1", {"policy_delay": 0}, "policy_delay=0"),
        ("td3", "Pendulum-v1", {"policy_delay": 1.5}, "policy_delay=1.5"),
        ("td3", "Pendulum-v1", {"target_policy_noise": -0.1}, "target_policy_noise=-0.1"),
        ("td3", "Pendulum-v1", {"action_noise": 0.1}, "action_noise=0.1"),
        ("ppo", "CartPole-v1", {"ent_coef": "auto"}, "ent_coef='auto'"),
        ("ppo", "CartPole-v1", {"policy_kwargs": {"activation_fn": "nn.Swish"}}, "policy_kwargs.activation_fn='nn.Swish'"),
        ("ppo", "CartPole-v1", {"policy_kwargs": {"optimizer_class": "os.system"}}, "optimizer_class='os.system'"),
    ],
)
def test_values_sb3_would_refuse_late_are_one_line_naming_them(algo, env, value, named):
    with pytest.raises(ConfigError) as refused:
        resolve_spec(algo, env, 0, {"max_episodes": 1, **value})
    assert named in str(refused.value) and "expected" in str(refused.value) and "\n" not in str(refused.value)


@pytest.mark.parametrize(
    "algo, rule, env, extra",
    [
        ("dqn", "rrd", "FrozenLake-v1", ["learning_starts=100"]),
        ("dqn", "rudder", "CreditTree-v0", ["episode_steps=10", "learning_starts=10"]),
        ("ppo", "rrd", "FrozenLake-v1", ["n_steps=100"]),
        ("a2c", "rudder", "CreditTree-v0", ["episode_steps=10", "n_steps=20"]),
    ],
)
def test_rrd_and_rudder_learn_from_discrete_observations(tmp_path, algo, rule, env, extra):
    """SB3 stores a Discrete observation as a (1,) row; the rule reads it as its index (one-hot features)."""
    kwargs = {"rrd": {"min_buffer_episodes": 2, "train_steps": 2}, "rudder": {"min_buffer_episodes": 2, "train_every": 2}}
    summary = train(
        ["--algo", algo, "--credit", rule, "--env", env, "--max-episodes", "40", "--no-progress",
         "--log-dir", str(tmp_path / "run"), "--hyperparams", *extra, f"credit_kwargs={json.dumps(kwargs)}"]
    )  # fmt: skip
    assert summary["credit_summary"]["episodes_seen"] >= 2
    if rule == "rrd":
        assert summary["credit_summary"]["train_steps"] > 0  # trained, so DQN's buffer relabelled through the model


def test_a_rule_that_cannot_read_the_arms_episodes_is_refused_before_the_run(tmp_path, monkeypatch):
    """The dry-built rule reads one episode assembled by the arm's own code when the run is resolved: with SB3's
    (1,) rows handed over as they are stored, the featurizer's refusal is one line, and nothing is written."""
    monkeypatch.setattr(callbacks, "in_space_shape", lambda values, space, lead: values, raising=False)
    monkeypatch.setattr(buffers, "in_space_shape", lambda values, space, lead: values, raising=False)
    monkeypatch.setattr(checks, "in_space_shape", lambda values, space, lead: values, raising=False)
    log_dir = tmp_path / "run"
    with pytest.raises(ConfigError, match=r"credit rule 'rrd' with --algo dqn on FrozenLake-v1: the rule cannot read"):
        train(["--algo", "dqn", "--credit", "rrd", "--env", "FrozenLake-v1", "--max-episodes", "4", "--no-progress",
               "--hyperparams", "learning_starts=100", "--log-dir", str(log_dir)])  # fmt: skip
    assert not log_dir.exists()


@pytest.mark.parametrize("rule", ["rrd", "rudder"])
def test_the_rules_lesson_buffer_counts_in_the_memory_check(tmp_path, monkeypatch, rule):
    """Pendulum's 200-step episodes of 4 features: 10^5 episodes are 320 MB of float32 once the rows grow to the
    episode's length; on a machine of 64 MiB the run is refused before its log dir exists."""
    monkeypatch.setattr(checks, "memory_bytes", lambda: 64 * 2**20)
    log_dir = tmp_path / "run"
    kwargs = json.dumps({rule: {"buffer_capacity": 100_000}})
    with pytest.raises(ConfigError) as refused:
        train(["--algo", "sac", "--credit", rule, "--env", "Pendulum-v1", "--max-episodes", "1", "--no-progress",
               "--hyperparams", "buffer_size=1000", "learning_starts=200", f"credit_kwargs={kwargs}",
               "--log-dir", str(log_dir)])  # fmt: skip
    message = str(refused.value)
    assert f"credit_kwargs[{rule!r}] buffer_capacity=100000" in message
    assert "lesson buffer would need 30" in message and "(100000 episodes x 200 steps x 4 features)" in message
    assert not log_dir.exists()


def test_lesson_buffer_bytes_is_what_the_buffer_holds_once_grown():
    spec = resolve_spec("sac", "Pendulum-v1", 0, {"max_episodes": 1, "credit": "rrd", "learning_starts": 200})
    from algorithms.common.config import make_env

    env = make_env("Pendulum-v1", {})
    rule = spec.config.run.slot.build(runner.ARM.credit_fit("sac"), env=env)
    features = rule.buffer.features.shape[2]
    rule.buffer.add(np.zeros((200, features), dtype=np.float32), 0.0)  # rows grow to the episode's 200 steps
    grown = rule.buffer.features.nbytes + rule.buffer.lengths.nbytes + rule.buffer.returns.nbytes
    assert grown <= checks.lesson_buffer_bytes(rule, 200) <= grown + rule.buffer.capacity * features * 4
    env.close()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without a CUDA device")
def test_device_cuda_without_cuda_is_one_line_before_the_log_dir(tmp_path, capsys):
    log_dir = tmp_path / "run"
    argv = ["--algo", "ppo", "--env", "CartPole-v1", "--max-episodes", "1", "--no-progress", "--log-dir", str(log_dir)]
    assert train_main([*argv, "--hyperparams", "device=cuda"]) == 2
    assert "device='cuda': no CUDA device is available; expected cpu or auto" in one_error_line(capsys)
    assert not log_dir.exists()


def test_a_malformed_device_is_refused_naming_device(tmp_path, capsys):
    log_dir = tmp_path / "run"
    argv = ["--algo", "sac", "--env", "Pendulum-v1", "--max-episodes", "1", "--no-progress", "--log-dir", str(log_dir)]
    assert train_main([*argv, "--hyperparams", "device=foo"]) == 2
    err = one_error_line(capsys)
    assert "device='foo'" in err and "expected cpu, cuda" in err and "refused hyperparameters" not in err
    assert not log_dir.exists()


def test_the_summary_records_the_device_trained_on(tmp_path):
    summary = train(["--algo", "ppo", "--env", "CartPole-v1", "--max-episodes", "1", "--no-progress",
                     "--hyperparams", "device=auto", "n_steps=64", "--log-dir", str(tmp_path / "run")])  # fmt: skip
    assert summary["device"] == ("cuda" if torch.cuda.is_available() else "cpu")


def test_supported_action_spaces_are_read_from_sb3():
    from gymnasium import spaces

    assert checks.supported_action_spaces(runner.algo_class("sac")) == (spaces.Box,)
    assert checks.supported_action_spaces(runner.algo_class("dqn")) == (spaces.Discrete,)
    assert spaces.MultiBinary in checks.supported_action_spaces(runner.algo_class("ppo"))


@pytest.mark.parametrize(
    "algo, env, said",
    [
        ("sac", "WatchRepair-v0", "--algo sac needs a Box action space; WatchRepair-v0 has Discrete(2)"),
        ("td3", "CartPole-v1", "--algo td3 needs a Box action space; CartPole-v1 has Discrete(2)"),
        ("dqn", "Pendulum-v1", "--algo dqn needs a Discrete action space; Pendulum-v1 has Box("),
    ],
)
def test_an_action_space_the_algo_does_not_take_is_named_not_blamed_on_hyperparameters(tmp_path, capsys, algo, env, said):
    log_dir = tmp_path / "run"
    assert train_main(["--algo", algo, "--env", env, "--max-episodes", "1", "--no-progress", "--log-dir", str(log_dir)]) == 2
    err = one_error_line(capsys)
    assert said in err and "hyperparameters" not in err
    assert not log_dir.exists()


def test_compare_refuses_an_algo_the_env_cannot_run_before_any_worker_starts(tmp_path, capsys):
    out = tmp_path / "out"
    argv = ["--algos", "mc", "sac", "--seeds", "1", "--max-episodes", "2", "--workers", "0", "--out", str(out), "--no-progress"]
    assert compare.main(argv) == 2
    err = one_error_line(capsys)
    assert "--algo sac needs a Box action space; WatchRepair-v0 has Discrete(2)" in err, err
    assert not out.exists()


def test_suite_refuses_an_algo_the_env_cannot_run_before_any_worker_starts(tmp_path, capsys):
    pytest.importorskip("bsuite")
    out = tmp_path / "out"
    argv = ["--experiment", "umbrella_length", "--settings", "0", "--episodes", "3", "--workers", "0", "--no-progress",
            "--algos", "mc", "sac", "--out", str(out)]  # fmt: skip
    assert suite.main(argv) == 2
    err = one_error_line(capsys)
    assert "--algo sac needs a Box action space" in err, err
    assert not (out / "runs").exists()


@pytest.fixture
def benchmark(monkeypatch):
    """benchmarks/episodic_mujoco.py with its runs and its measurement replaced by a refusal to start."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "episodic_mujoco.py"
    module_spec = importlib.util.spec_from_file_location("episodic_mujoco_under_test", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)

    def started(*args, **kwargs):
        raise AssertionError("the benchmark started training")

    monkeypatch.setattr(module, "train_jobs", started)
    monkeypatch.setattr(module, "measure", started)
    return module


@pytest.mark.parametrize("steps", ["0", "-999"])
def test_the_benchmark_refuses_a_measure_below_one_step(tmp_path, capsys, benchmark, steps):
    assert benchmark.main(["--measure", steps, "--out", str(tmp_path / "out")]) == 2
    assert f"--measure {steps}: expected an integer >= 1" in one_error_line(capsys)
    assert not (tmp_path / "out").exists()


def test_the_lock_refusal_names_the_command_refused(tmp_path):
    with locked(tmp_path, "episodic_mujoco"):
        with pytest.raises(VcbmGymError) as refused:
            with locked(tmp_path, "episodic_mujoco"):
                pass
    message = str(refused.value)
    assert "in use by another episodic_mujoco" in message and "run this episodic_mujoco with another --out" in message
    assert "compare or suite" not in message


def test_the_benchmark_runs_its_seeds_from_seed_start_on_the_engine_asked_for(tmp_path, benchmark):
    pytest.importorskip("mujoco")
    pytest.importorskip("sbx")
    argv = ["--envs", "EpisodicHopper-v5", "--methods", "sac", "sac+ircr", "--seeds", "2", "--seed-start", "400",
            "--steps", "10000", "--engine", "sbx", "--out", str(tmp_path / "out")]  # fmt: skip
    args = benchmark.parse_args(argv)
    jobs = benchmark.method_jobs(args, tmp_path / "out")["EpisodicHopper-v5"]
    for method, per_seed in jobs.items():
        assert [job.spec.seed for job in per_seed] == [400, 401]
        assert [job.log_dir.name for job in per_seed] == ["seed400", "seed401"]
        assert all(job.spec.hyperparams["engine"] == "sbx" for job in per_seed), method
    sb3_argv = argv[:-4] + ["--engine", "sb3", "--out", str(tmp_path / "out")]
    sb3 = benchmark.method_jobs(benchmark.parse_args(sb3_argv), tmp_path / "out")
    assert "engine" not in sb3["EpisodicHopper-v5"]["sac"][0].spec.hyperparams  # sb3 keeps the earlier runs' hash
    default = benchmark.method_jobs(benchmark.parse_args(argv[:-4] + ["--out", str(tmp_path / "out")]), tmp_path / "out")
    assert default["EpisodicHopper-v5"]["sac"][0].spec.hyperparams["engine"] == "sbx"  # the benchmark's default engine
