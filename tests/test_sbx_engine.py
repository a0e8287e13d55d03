"""The SB3 arm's `engine` setting (algorithms/sb3/engines.py): SBX's JAX classes train SAC, TD3 and DQN with the
credit slot's relabelling replay buffer unchanged; a bad or unavailable engine is one line before anything is written."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("sbx")
pytest.importorskip("mujoco")

import sbx  # noqa: E402
import stable_baselines3 as sb3  # noqa: E402

from algorithms import train  # noqa: E402
from algorithms.common.errors import ConfigError, VcbmGymError  # noqa: E402
from algorithms.sb3 import runner  # noqa: E402
from algorithms.sb3.buffers import RelabelingReplayBuffer  # noqa: E402
from tests.helpers import run_without_xla_settings  # noqa: E402

HOPPER = "EpisodicHopper-v5"
# short Hopper episodes, so that a credit run (learning_starts >= one episode) learns within a few hundred steps
SHORT = {"env_kwargs": {"max_episode_steps": 20}, "learning_starts": 100, "batch_size": 32, "buffer_size": 2000}


def hopper_spec(algo: str, engine: str, credit: str = "none", **more):
    return train.resolve_spec(algo, HOPPER, 0, {**SHORT, "engine": engine, "credit": credit, **more})


@pytest.mark.parametrize(
    "algo, engine, expected",
    [("sac", "sbx", sbx.SAC), ("td3", "sbx", sbx.TD3), ("sac", "sb3", sb3.SAC), ("td3", "sb3", sb3.TD3)],
)
def test_engine_setting_picks_the_class_that_trains(algo, engine, expected):
    built = runner.build(hopper_spec(algo, engine), tensorboard_log=None)
    try:
        assert type(built.model) is expected
    finally:
        built.env.close()


def test_sbx_dqn_takes_the_relabelling_buffer(tmp_path):
    spec = train.resolve_spec(
        "dqn", "CartPole-v1", 0, {"engine": "sbx", "credit": "ircr", "learning_starts": 500, "buffer_size": 2000}
    )
    built = runner.build(spec, tensorboard_log=str(tmp_path))  # a run's build (with a log dir) builds the rule
    try:
        assert type(built.model) is sbx.DQN
        assert isinstance(built.model.replay_buffer, RelabelingReplayBuffer)
    finally:
        built.env.close()


def test_engine_is_a_zoo_setting_and_sbx_uses_sbx_constructor_arguments():
    # qf_learning_rate is SBX's own argument: with engine sbx from a config it is known, under SB3's class it is not
    spec = train.resolve_spec("sac", HOPPER, 0, {**SHORT, "engine": "sbx", "qf_learning_rate": 0.001})
    assert spec.config.algo_cls is sbx.SAC and spec.config.algo_kwargs["qf_learning_rate"] == 0.001
    with pytest.raises(ConfigError, match=r"unknown hyperparameter 'qf_learning_rate' for algo 'sac'"):
        train.resolve_spec("sac", HOPPER, 0, {**SHORT, "qf_learning_rate": 0.001})
    with pytest.raises(ConfigError, match=r"unknown hyperparameter 'target_update_interval' for algo 'sac' \(engine sbx\)"):
        train.resolve_spec("sac", HOPPER, 0, {**SHORT, "engine": "sbx", "target_update_interval": 2})


def test_default_engine_keeps_the_config_hash_and_sbx_changes_it():
    default = train.resolve_spec("sac", HOPPER, 0, SHORT)
    explicit = train.resolve_spec("sac", HOPPER, 0, {**SHORT, "engine": "sb3"})
    on_sbx = hopper_spec("sac", "sbx")
    assert "engine" not in default.hyperparams and default.config_hash == explicit.config_hash
    assert on_sbx.hyperparams["engine"] == "sbx" and on_sbx.config_hash != default.config_hash


@pytest.mark.parametrize(
    "extra, message",
    [
        (["engine=jax"], "error: hyperparameter engine='jax': expected one of sb3, sbx"),
        (["engine=[sbx]"], "error: hyperparameter engine=['sbx']: expected one of sb3, sbx"),
        (["engine=sbx", "device=cuda"], "error: hyperparameter device='cuda' with engine=sbx"),
        (["engine=sbx", "policy_kwargs={activation_fn: ReLU}"], "error: hyperparameter policy_kwargs.activation_fn='ReLU'"),
    ],
)
def test_bad_engine_settings_are_one_line_before_the_log_dir(tmp_path, capsys, extra, message):
    log_dir = tmp_path / "run"
    argv = ["--algo", "sac", "--env", HOPPER, "--log-dir", str(log_dir), "--no-progress", "--hyperparams", *extra]
    assert train.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(message) and err.count("\n") == 1
    assert not log_dir.exists()


def test_engine_sbx_with_an_on_policy_algo_names_the_engines_that_run_it(tmp_path, capsys):
    argv = ["--algo", "ppo", "--env", "CartPole-v1", "--log-dir", str(tmp_path / "run"), "--hyperparams", "engine=sbx"]
    assert train.main(argv) == 2
    err = capsys.readouterr().err
    expected = "error: hyperparameter engine='sbx' with --algo ppo: engine sbx runs --algo dqn, sac, td3; expected engine sb3"
    assert err == f"{expected} for ppo\n"
    assert not (tmp_path / "run").exists()


def test_missing_sbx_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "sbx", None)  # importlib finds no module set to None
    with pytest.raises(
        VcbmGymError, match=r'engine=sbx needs the sbx extra \(sbx is not installed\): pip install -e "\.\[sbx\]"'
    ):
        hopper_spec("sac", "sbx")


def random_episodes(count: int) -> list[list[tuple]]:
    """`count` episodes of uniformly random actions on short Hopper episodes, as SB3 hands transitions to a buffer."""
    import gymnasium as gym

    env = gym.make(HOPPER, **SHORT["env_kwargs"])
    env.action_space.seed(0)
    episodes = []
    for index in range(count):
        obs, _ = env.reset(seed=index)
        steps, done = [], False
        while not done:
            action = env.action_space.sample()
            next_obs, reward, terminated, truncated, _ = env.step(action)
            done = terminated or truncated
            steps.append((obs, next_obs, action, reward, done, {"TimeLimit.truncated": truncated and not terminated}))
            obs = next_obs
        episodes.append(steps)
    env.close()
    return episodes


def rewards_trained_on(spec, episodes, log_dir: Path) -> tuple[RelabelingReplayBuffer, np.ndarray]:
    """The run's buffer after `episodes` were stored, and the rewards of the batch its first update trains on: what
    SB3's SAC samples, or what SBX's SAC hands its jitted update (after its torch -> numpy conversion)."""
    from stable_baselines3.common.logger import configure

    built = runner.build(spec, tensorboard_log=str(log_dir))
    model, seen = built.model, []
    try:
        for episode in episodes:
            for obs, next_obs, action, reward, done, info in episode:
                model.replay_buffer.add(obs[None], next_obs[None], action[None], np.array([reward]), np.array([done]), [info])
        model.set_logger(configure(None, []))
        if spec.config.run.engine == "sbx":
            jitted = model._train

            def recording(*args):
                seen.append(next(a for a in args if type(a).__name__ == "ReplayBufferSamplesNp").rewards)
                return jitted(*args)

            model._train = recording
        else:
            sample = model.replay_buffer.sample

            def recording(*args, **kwargs):
                seen.append(sample(*args, **kwargs).rewards.numpy().reshape(-1))
                return sample(*args, **kwargs)

            model.replay_buffer.sample = recording
        np.random.seed(0)  # the buffer draws its rows with numpy's global generator
        model.train(gradient_steps=1, batch_size=SHORT["batch_size"])
    finally:
        built.env.close()
    return model.replay_buffer, np.asarray(seen[0], dtype=np.float64)


@pytest.mark.parametrize("credit", ["ircr", "rrd"])
def test_sbx_trains_on_the_rules_relabelled_rewards(tmp_path, credit):
    episodes = random_episodes(8)
    sb3_buffer, sb3_rewards = rewards_trained_on(hopper_spec("sac", "sb3", credit), episodes, tmp_path / "sb3")
    sbx_buffer, rewards = rewards_trained_on(hopper_spec("sac", "sbx", credit), episodes, tmp_path / "sbx")
    assert isinstance(sbx_buffer, RelabelingReplayBuffer) and len(rewards) == SHORT["batch_size"]
    np.testing.assert_allclose(rewards, sb3_rewards, rtol=1e-6)
    if credit == "ircr":
        # IRCR's reward of a step: its episode's return scaled by the min and max of the returns seen, not the env's
        # episodic reward (0 on all but an episode's last step); half the batch from the heap of the best episodes
        returns = np.array([sum(step[3] for step in episode) for episode in episodes])
        expected = (returns - returns.min()) / (returns.max() - returns.min())
        assert np.isclose(rewards[:, None], expected[None], atol=1e-5).any(axis=1).all()
        env_rewards = np.concatenate([[step[3] for step in episode] for episode in episodes])
        assert (rewards > 0).mean() > 0.5 and (env_rewards == 0).mean() > 0.5
        assert len(sbx_buffer.elites) == min(sbx_buffer.elite_episodes, len(episodes))
    else:
        # RRD's reward model on [s, a, s - s'], trained on the same episodes in both runs
        written = sbx_buffer.rewards[: sbx_buffer.pos, 0]  # the model's rewards when each episode ended
        assert np.unique(rewards).size > len(rewards) // 2 and not np.isin(rewards.astype(np.float32), written).all()


@pytest.mark.parametrize("algo, credit", [("sac", "ircr"), ("sac", "rrd"), ("td3", "ircr")])
def test_train_command_with_sbx_engine_and_a_reward_rule(tmp_path, capsys, algo, credit):
    log_dir = tmp_path / "run"
    overrides = ["engine=sbx", "env_kwargs={max_episode_steps: 20}", "learning_starts=100", "max_steps=300", "batch_size=32"]
    argv = ["--algo", algo, "--credit", credit, "--env", HOPPER, "--log-dir", str(log_dir), "--no-progress"]
    assert train.main([*argv, "--hyperparams", *overrides]) == 0, capsys.readouterr().err
    summary = json.loads((log_dir / "summary.json").read_text())
    assert summary["timesteps"] == 300 and summary["credit"] == credit and summary["device"] == "jax:cpu"
    assert "engine: sbx" in (log_dir / "config.yml").read_text()


def test_xla_flags_follow_torch_threads():
    from algorithms.sb3 import engines

    assert engines.xla_flags(1, None) == engines.SINGLE_THREAD_XLA
    assert engines.xla_flags(1, "--xla_dump_to=/tmp/x") == f"--xla_dump_to=/tmp/x {engines.SINGLE_THREAD_XLA}"
    assert engines.xla_flags(2, "--xla_dump_to=/tmp/x") == "--xla_dump_to=/tmp/x"  # XLA's own pool
    assert engines.xla_flags(1, "--xla_cpu_multi_thread_eigen=true") == "--xla_cpu_multi_thread_eigen=true"  # the user's


def test_resolving_an_sbx_run_sets_xla_threads_before_jax_is_imported():
    single_thread = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
    code = (
        "import os, sys\n"
        "from algorithms import train\n"
        "assert 'jax' not in sys.modules\n"
        "train.resolve_spec('sac', 'EpisodicHopper-v5', 0, {'engine': 'sbx'})\n"
        "import jax\n"
        "print(os.environ['XLA_FLAGS'], jax.default_backend())\n"
    )
    done = run_without_xla_settings(code)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == f"{single_thread} cpu"
