"""Trains an SB3 algorithm (PPO, A2C, DQN) with a pluggable credit rule until convergence.

`--credit RULE` (a name in vcbm_gym.credit.base.RULES, or none): PPO/A2C get a CreditCallback
that rewrites the rollout buffer's advantages; DQN gets an EpisodeRedistributionBuffer that writes
return-equivalent redistributed rewards. The SPEC section 4 criterion (window of correct first
decisions, evaluation only) stops the run, or `max_episodes` does. Hyperparameters: the run's
own (`SB3RunConfig`) plus the algorithm's constructor arguments (`PPOConfig`, `A2CConfig`,
`DQNConfig`, SB3's defaults), flat in zoo_configs/<algo>.yml; credit-rule arguments go under
`credit_kwargs`, keyed by rule name (`credit_kwargs: {vcbm_bookmark: {alpha: 0.01}}`), so one
config serves every --credit. SB3 writes its own TensorBoard logs into the run's log dir.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import gymnasium as gym
import torch
from stable_baselines3.common.callbacks import CallbackList
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.vec_env import DummyVecEnv

from algorithms.common.config import as_plain_dict, build_dataclasses
from algorithms.common.convergence import ConvergenceTracker, EpisodeRunConfig
from algorithms.common.errors import ConfigError, VcbmGymError
from algorithms.common.run_context import RunContext
from algorithms.registry import get_algo, load_object
from algorithms.sb3.callbacks import GROUP_BY, ConvergenceCallback, CreditCallback
from algorithms.sb3.wrappers import EpisodeRedistributionBuffer
from vcbm_gym.credit.base import RULES, CreditRule, make_rule


@dataclass
class SB3RunConfig(EpisodeRunConfig):
    max_episodes: int = 30_000
    n_envs: int = 1
    policy: str = "MlpPolicy"
    episode_steps: int | None = None  # None: the env's max_episode_steps or params.horizon
    credit_kwargs: dict = field(default_factory=dict)  # rule name -> that rule's constructor kwargs
    credit_group_by: str = "none"  # on-policy only: "none" or "initial_obs" (see callbacks.py)
    torch_threads: int = 1
    device: str = "cpu"


@dataclass
class PPOConfig:
    learning_rate: float = 3e-4
    n_steps: int = 2048
    batch_size: int = 64
    n_epochs: int = 10
    gamma: float = 0.99
    gae_lambda: float = 0.95
    clip_range: float = 0.2
    normalize_advantage: bool = True
    ent_coef: float = 0.0
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    policy_kwargs: dict = field(default_factory=dict)


@dataclass
class A2CConfig:
    learning_rate: float = 7e-4
    n_steps: int = 5
    gamma: float = 0.99
    gae_lambda: float = 1.0
    ent_coef: float = 0.0
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    rms_prop_eps: float = 1e-5
    use_rms_prop: bool = True
    normalize_advantage: bool = False
    policy_kwargs: dict = field(default_factory=dict)


@dataclass
class DQNConfig:
    learning_rate: float = 1e-4
    buffer_size: int = 1_000_000
    learning_starts: int = 100
    batch_size: int = 32
    tau: float = 1.0
    gamma: float = 0.99
    train_freq: int = 4
    gradient_steps: int = 1
    target_update_interval: int = 10_000
    exploration_fraction: float = 0.1
    exploration_initial_eps: float = 1.0
    exploration_final_eps: float = 0.05
    max_grad_norm: float = 10.0
    policy_kwargs: dict = field(default_factory=dict)


ALGO_CONFIGS = {"stable_baselines3:PPO": PPOConfig, "stable_baselines3:A2C": A2CConfig, "stable_baselines3:DQN": DQNConfig}
CREDIT_CHOICES = ("none", *RULES)


def credit_name(value: str) -> str:
    if value not in CREDIT_CHOICES:
        raise argparse.ArgumentTypeError(f"unknown credit rule {value!r}; expected one of: {', '.join(CREDIT_CHOICES)}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--credit", type=credit_name, default="none", help=f"credit rule, one of: {', '.join(CREDIT_CHOICES)}")


def _config_class(algo: str) -> type:
    target = get_algo(algo).target
    if target not in ALGO_CONFIGS:
        raise VcbmGymError(f"algo {algo!r} targets {target!r}: the SB3 runner knows {', '.join(ALGO_CONFIGS)}")
    return ALGO_CONFIGS[target]


def _configs(algo: str, mapping: dict[str, Any]) -> tuple[SB3RunConfig, Any]:
    run_cfg, algo_cfg = build_dataclasses(mapping, [SB3RunConfig, _config_class(algo)], owner=f"algo {algo!r}")
    if run_cfg.max_episodes < 1 or run_cfg.n_envs < 1:
        raise ConfigError(f"max_episodes={run_cfg.max_episodes}, n_envs={run_cfg.n_envs}: expected integers >= 1")
    for name, kwargs in run_cfg.credit_kwargs.items():
        if name not in RULES or not isinstance(kwargs, dict):
            raise ConfigError(
                f"hyperparameter credit_kwargs[{name!r}]={kwargs!r}: expected rule name -> mapping of its arguments, "
                f"rule names: {', '.join(RULES)}"
            )
    if run_cfg.credit_group_by not in GROUP_BY:
        raise ConfigError(f"hyperparameter credit_group_by={run_cfg.credit_group_by!r}: expected one of {', '.join(GROUP_BY)}")
    return run_cfg, algo_cfg


def resolve(algo: str, env_id: str, mapping: dict[str, Any]) -> dict[str, Any]:
    return as_plain_dict(*_configs(algo, mapping))


def build_rule(name: str, kwargs: dict[str, Any]) -> CreditRule | None:
    """`make_rule` with the user's errors turned into one clear line."""
    if name == "none":
        return None
    if name not in RULES:
        raise ConfigError(f"unknown credit rule --credit {name!r}; expected one of: {', '.join(CREDIT_CHOICES)}")
    try:
        return make_rule(name, **kwargs)
    except ModuleNotFoundError as exc:
        raise VcbmGymError(f"credit rule {name!r} is registered as {RULES[name]!r} but cannot be imported: {exc}") from None
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"credit_kwargs {kwargs!r} for rule {name!r}: {exc}") from None


def episode_steps(env: gym.Env, configured: int | None) -> int:
    steps = configured or (env.spec.max_episode_steps if env.spec else None) or getattr(getattr(env.unwrapped, "params", None), "horizon", None)
    if not steps:
        raise ConfigError("the env declares no episode length: set hyperparameter episode_steps")
    return int(steps)


def run(ctx: RunContext) -> dict[str, Any]:
    run_cfg, algo_cfg = _configs(ctx.algo, ctx.hyperparams)
    credit = getattr(ctx.args, "credit", "none")
    rule = build_rule(credit, run_cfg.credit_kwargs.get(credit, {}))
    algo_cls = load_object(get_algo(ctx.algo).target)
    off_policy = isinstance(algo_cfg, DQNConfig)
    torch.set_num_threads(run_cfg.torch_threads)

    probe = gym.make(ctx.env_id, **run_cfg.env_kwargs)
    steps = episode_steps(probe, run_cfg.episode_steps)
    probe.close()
    kwargs = asdict(algo_cfg)
    callbacks = []
    if rule is not None and off_policy:
        if run_cfg.n_envs != 1 or algo_cfg.learning_starts < steps:
            raise ConfigError(
                f"DQN with --credit needs n_envs=1 and learning_starts >= one episode ({steps} steps); "
                f"got n_envs={run_cfg.n_envs}, learning_starts={algo_cfg.learning_starts}"
            )
        kwargs.update(replay_buffer_class=EpisodeRedistributionBuffer, replay_buffer_kwargs={"rule": rule})
    elif rule is not None:
        callbacks.append(CreditCallback(rule, run_cfg.credit_group_by))

    # SB3's make_vec_env asks for render_mode="rgb_array", which text envs reject; the model's seed
    # seeds these envs (BaseAlgorithm.set_random_seed).
    env = DummyVecEnv([lambda: Monitor(gym.make(ctx.env_id, **run_cfg.env_kwargs))] * run_cfg.n_envs)
    model = algo_cls(run_cfg.policy, env, seed=ctx.seed, device=run_cfg.device, tensorboard_log=ctx.log_dir, **kwargs)
    tracker = ConvergenceTracker(run_cfg.convergence_window, run_cfg.convergence_threshold)
    convergence = ConvergenceCallback(tracker, run_cfg.max_episodes, run_cfg.stop_at_convergence)
    start = time.perf_counter()
    try:
        model.learn(
            total_timesteps=run_cfg.max_episodes * steps,
            callback=CallbackList([*callbacks, convergence]),
            tb_log_name=f"{ctx.algo}_{credit}",
            progress_bar=ctx.progress,
        )
    finally:
        env.close()
    roles = getattr(rule, "roles", None)  # vcbm_bookmark: the causal roles it found (Eq. 9)
    names = getattr(env.envs[0].unwrapped, "component_names", None) or range(len(roles or []))
    return {
        **convergence.summary(),
        "credit": credit,
        **({"credit_roles": {str(n): str(r) for n, r in zip(names, roles)}} if roles else {}),
        "timesteps": int(model.num_timesteps),
        "train_time_s": time.perf_counter() - start,
    }
