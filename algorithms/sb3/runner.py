"""Trains an SB3 algorithm (PPO, A2C, DQN, SAC, TD3) with a pluggable credit rule on any Gymnasium env.

`--credit RULE` (a name in vcbm_gym.credit.registry.RULES, or none), through the credit slot
(algorithms/common/credit_slot.py): PPO/A2C get a CreditCallback that rewrites the rollout with the rule's
rewards (GAE and value targets then computed on them) or advantages; DQN, SAC and TD3 take reward rules only,
through a RelabelingReplayBuffer (algorithms/sb3/buffers.py) whose sampled rewards are the rule's current
ones. Rules are built for the env (`make_rule(name, env=...)`: RUDDER reads the env's features). A rule whose
declared needs (CreditRule.batch_needs, info_needs) the SB3 batch does not meet, or whose kind of credit the
learner does not take, is refused (vcbm_blend, casi: this arm collects no env info keys). The convergence
criterion (algorithms/common/convergence.py; needs the env contract's evaluation-only
`first_decision_optimal`) stops the run, or `max_episodes` does; without that key the run trains
for `max_episodes` and reports its return and success rate (`is_success`). Hyperparameters: the
run's own (`SB3RunConfig`) plus the algorithm's constructor arguments, checked against the
class's own signature (that class is the only source of their defaults; zoo_configs/<algo>.yml lists what
differs). The class is SB3's, or with `engine: sbx` SBX's JAX one for SAC, TD3 and DQN (algorithms/sb3/engines.py),
which takes the same replay buffer and callbacks; credit-rule arguments go under `credit_kwargs`, keyed by rule name
(`credit_kwargs: {vcbm_bookmark: {alpha: 0.01}}`), so one config serves every --credit. SB3 writes
its own TensorBoard logs into the run's log dir.

`ARM` (`SB3Arm`, an algorithms.common.spec.Arm) is what algorithms.train drives: `resolve` builds the
run's typed config (`SB3Config`) once into the RunSpec (the rule built dry there), `validate` builds the model
dry, and `run` builds the rule and the model and trains from the typed config.
The checks `resolve` makes (arguments, device, spaces, memory, the rule's batches, policy_kwargs) are
algorithms/sb3/checks.py.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import functools
import inspect
import re
import time
import traceback
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from stable_baselines3.common.callbacks import CallbackList, EvalCallback
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.off_policy_algorithm import OffPolicyAlgorithm
from stable_baselines3.common.vec_env import DummyVecEnv
from threadpoolctl import threadpool_limits

from algorithms.common.config import as_plain_dict, build_dataclasses, log_env_to_run_dir, make_env
from algorithms.common.convergence import ConvergenceTracker, EpisodeOutcomes, EpisodeRunConfig
from algorithms.common.credit_slot import CreditSlot, add_credit_argument, credit_flag, rule_summary
from algorithms.common.errors import ConfigError
from algorithms.common.spec import EPISODES, Arm, RunOptions, RunSpec
from algorithms.common.validation import AT_LEAST_ONE, Range
from algorithms.sb3 import engines
from algorithms.sb3.buffers import RelabelingReplayBuffer
from algorithms.sb3.callbacks import (
    DEFAULT_GROUP_BY,
    GROUP_BY,
    ConvergenceCallback,
    CreditCallback,
    RewardFitCallback,
)
from algorithms.sb3.checks import (
    SCHEDULED_ARGS,
    check_buffer_memory,
    check_device,
    check_policy_kwargs,
    check_rule_reads_batches,
    check_spaces,
    coerce_arg,
    linear_start,
    with_torch_classes,
)
from algorithms.sb3.env_checks import Float32Rewards
from vcbm_gym.credit.base import ADVANTAGES, NO_CREDIT, REWARDS, CreditRule

# The arm's algorithms, algo -> "module:Class" (SB3's own classes; engines.AGENTS has each engine's).
AGENTS = engines.AGENTS[engines.SB3]


def algo_class(algo: str, engine: str = engines.SB3) -> type:
    return engines.algo_class(algo, engine)


@dataclass
class SB3RunConfig(EpisodeRunConfig):
    RANGES = {
        "n_envs": AT_LEAST_ONE,
        "episode_steps": Range(1, optional=True),
        "torch_threads": AT_LEAST_ONE,
        "max_steps": Range(1, optional=True),
        "eval_every_steps": Range(1, optional=True),
        "eval_episodes": AT_LEAST_ONE,
    }

    max_episodes: int = 30_000
    max_steps: int | None = None  # an env-step budget as well (MuJoCo protocols count steps); the first reached ends the run
    # SB3's EvalCallback every this many steps: the deterministic policy's return on a fresh env (evaluations.npz); on
    # an episodic-reward env the episode's sum is the dense task's return, the true return the papers report
    eval_every_steps: int | None = None
    eval_episodes: int = 10
    credit: str = NO_CREDIT  # set by --credit; a rule name in vcbm_gym.credit.registry.RULES
    n_envs: int = 1
    policy: str = "MlpPolicy"
    episode_steps: int | None = None  # None: the env's max_episode_steps or params.horizon
    credit_kwargs: dict = field(default_factory=dict)  # rule name -> that rule's constructor kwargs
    credit_group_by: str = DEFAULT_GROUP_BY  # on-policy only: "none" or "initial_obs" (see callbacks.py)
    torch_threads: int = 1  # torch's, numpy's BLAS's and (engine sbx) XLA's threads
    device: str = "cpu"
    engine: str = engines.SB3  # which library's class trains the run: sb3 (PyTorch) or sbx (JAX); see engines.py

    @property
    def slot(self) -> CreditSlot:
        return CreditSlot(self.credit, self.credit_kwargs)


# Constructor arguments the runner sets itself (the env, the credit rule's buffer, logging).
RUNNER_OWNED = {
    "self",
    "policy",
    "env",
    "seed",
    "device",
    "tensorboard_log",
    "verbose",
    "_init_setup_model",
    "rollout_buffer_class",
    "rollout_buffer_kwargs",
    "replay_buffer_class",
    "replay_buffer_kwargs",
}
# What every SB3 algorithm's EpisodeBatch holds beyond rewards and mask (callbacks.rollout_episode_batch,
# buffers.RelabelingReplayBuffer), in the terms of CreditRule.batch_needs; no env info key is collected.
SB3_BATCH_PROVIDES = frozenset({"observations", "actions", "group_ids"})
SB3_INFO_PROVIDES: frozenset[str] = frozenset()
# What PPO and A2C add (CreditCallback): SB3's GAE advantages and the critic's V(s_0); what the replay buffer
# of DQN, SAC and TD3 adds: each step's next observation.
ON_POLICY_EXTRAS = frozenset({"extras['advantages']", "extras['baseline']"})
OFF_POLICY_EXTRAS = frozenset({"extras['next_observations']"})


def sb3_schedules(kwargs: dict[str, Any]) -> dict[str, Any]:
    """kwargs as SB3 takes them: each "lin_<start>" string made SB3's LinearSchedule (<start> when the run begins, 0 at
    its budget's end), train_freq's [n, unit] a tuple, and policy_kwargs' torch classes named in the config classes."""
    from stable_baselines3.common.utils import LinearSchedule

    out = dict(kwargs)
    for name in SCHEDULED_ARGS:
        if isinstance(out.get(name), str):
            out[name] = LinearSchedule(start=linear_start(name, out[name]), end=0.0, end_fraction=1.0)
    if isinstance(out.get("train_freq"), list):  # SB3 reads only a tuple as (n, unit)
        out["train_freq"] = tuple(out["train_freq"])
    out["policy_kwargs"] = with_torch_classes(out.get("policy_kwargs"))
    return out


def is_off_policy(algo: str) -> bool:
    return issubclass(algo_class(algo), OffPolicyAlgorithm)


def algo_defaults(algo_cls: type) -> dict[str, Any]:
    """The SB3 class's own constructor defaults: SB3 stays the single source of them."""
    params = inspect.signature(algo_cls.__init__).parameters
    return {name: p.default for name, p in params.items() if name not in RUNNER_OWNED and p.default is not p.empty}


def algo_kwargs(algo: str, mapping: dict[str, Any], engine: str = engines.SB3) -> dict[str, Any]:
    """Every constructor argument of the engine's class: its defaults overlaid by `mapping` (checked)."""
    defaults = algo_defaults(algo_class(algo, engine))
    out = dict(defaults)
    for key, value in mapping.items():
        out[key] = coerce_arg(key, value, defaults[key], owner(algo, engine))
    if out.get("policy_kwargs") is not None and not isinstance(out["policy_kwargs"], dict):
        raise ConfigError(f"hyperparameter policy_kwargs={out['policy_kwargs']!r}: expected a mapping")
    return out


@dataclass(frozen=True)
class SB3Config:
    """An SB3 run's typed config (RunSpec.config), built once by `SB3Arm.resolve` from the mapping."""

    algo_cls: type
    run: SB3RunConfig
    algo_kwargs: Mapping[str, Any]  # every constructor argument of algo_cls: SB3's defaults overlaid, checked
    episode_steps: int  # the env's episode length (or the run's episode_steps): the step budget per episode

    @property
    def off_policy(self) -> bool:
        return issubclass(self.algo_cls, OffPolicyAlgorithm)

    def hyperparams(self) -> dict[str, Any]:
        """The plain values config.yml records and the config hash identifies. The engine is recorded only when it is
        not the default: an SB3 run's identity is the same with or without the setting (its stored results stay
        resumable by hash); an sbx run records `engine: sbx`, and its hash differs."""
        run = as_plain_dict(self.run)
        if run["engine"] == engines.SB3:
            del run["engine"]
        return {**run, **copy.deepcopy(dict(self.algo_kwargs))}


def owner(algo: str, engine: str) -> str:
    return f"algo {algo!r}" if engine == engines.SB3 else f"algo {algo!r} (engine {engine})"


def _configs(algo: str, mapping: Mapping[str, Any]) -> tuple[SB3RunConfig, dict[str, Any]]:
    run_names = {f.name for f in dataclasses.fields(SB3RunConfig)}
    engine = mapping.get("engine", engines.SB3)
    engines.check_engine(engine, algo)
    (run_cfg,) = build_dataclasses(
        {k: v for k, v in mapping.items() if k in run_names}, [SB3RunConfig], owner=owner(algo, engine)
    )
    # before sbx, or a rule computing in JAX, imports jax: XLA reads its thread settings once
    if engine == engines.SBX or engines.rule_uses_jax(run_cfg.credit, run_cfg.credit_kwargs):
        engines.configure_jax(run_cfg.torch_threads, run_cfg.device)
    defaults = algo_defaults(algo_class(algo, engine))
    unknown = [key for key in mapping if key not in run_names and key not in defaults]
    if unknown:
        known = ", ".join(sorted(run_names | set(defaults)))
        raise ConfigError(f"unknown hyperparameter {unknown[0]!r} for {owner(algo, engine)}; expected one of: {known}")
    kwargs = algo_kwargs(algo, {k: v for k, v in mapping.items() if k not in run_names}, engine)
    run_cfg.slot.check(ARM.credit_fit(algo))
    if run_cfg.credit_group_by not in GROUP_BY:
        raise ConfigError(f"hyperparameter credit_group_by={run_cfg.credit_group_by!r}: expected one of {', '.join(GROUP_BY)}")
    return run_cfg, kwargs


def sb3_config(algo: str, env_id: str, mapping: Mapping[str, Any]) -> SB3Config:
    """Run settings and every SB3 constructor argument, checked against each other and the env: bad env_kwargs,
    episode length, policy_kwargs or a buffer larger than this machine's memory fails before the log dir exists
    (the credit rule is built here dry: a bad argument, or an option that adds a need, is one line)."""
    run_cfg, kwargs = _configs(algo, mapping)
    engines.check_engine_settings(run_cfg.engine, run_cfg.device, kwargs.get("policy_kwargs"))
    check_device(run_cfg.device)
    algo_cls = algo_class(algo, run_cfg.engine)
    off_policy = issubclass(algo_cls, OffPolicyAlgorithm)
    probe = make_env(env_id, run_cfg.env_kwargs)
    try:
        check_spaces(algo, algo_cls, env_id, probe, engines.AGENTS[run_cfg.engine])
        steps = episode_steps(probe, run_cfg.episode_steps)
        try:
            rule = run_cfg.slot.build(ARM.credit_fit(algo), env=probe)
        except MemoryError as exc:
            raise ConfigError(
                f"credit rule {run_cfg.credit!r} on {env_id}: its buffers cannot be allocated ({exc}); expected a smaller "
                f"buffer_capacity in credit_kwargs[{run_cfg.credit!r}]"
            ) from None
        check_buffer_memory(off_policy, run_cfg.n_envs, kwargs, probe, rule, steps)
        if rule is not None:
            check_rule_reads_batches(algo, rule, env_id, probe, off_policy)
    finally:
        probe.close()
    check_policy_kwargs(algo_cls, run_cfg.policy, kwargs.get("policy_kwargs"))
    if not run_cfg.slot.empty and off_policy and (run_cfg.n_envs != 1 or kwargs["learning_starts"] < steps):
        raise ConfigError(
            f"{algo} with --credit needs n_envs=1 and learning_starts >= one episode ({steps} steps); "
            f"got n_envs={run_cfg.n_envs}, learning_starts={kwargs['learning_starts']}"
        )
    if not run_cfg.slot.empty and not off_policy and kwargs["n_steps"] < steps:
        # CreditCallback rewrites only the episodes that lie whole inside one rollout: a full-length one never would
        raise ConfigError(
            f"{algo} with --credit needs n_steps >= one episode ({steps} steps) so that whole episodes reach the "
            f"credit rule; got n_steps={kwargs['n_steps']}"
        )
    return SB3Config(algo_cls, run_cfg, kwargs, steps)


def episode_steps(env: gym.Env, configured: int | None) -> int:
    steps = (
        configured
        or (env.spec.max_episode_steps if env.spec else None)
        or getattr(getattr(env.unwrapped, "params", None), "horizon", None)
    )
    if not steps:
        raise ConfigError("the env declares no episode length: set hyperparameter episode_steps")
    return int(steps)


@dataclass
class Built:
    """What a run trains: the model on its vector env, the credit rule and its callbacks."""

    model: Any
    env: DummyVecEnv
    rule: CreditRule | None
    callbacks: list


def build(spec: RunSpec, tensorboard_log: str | None) -> Built:
    """The run's model, env and credit rule, with SB3's, torch's and the rule's refusals turned into one line
    naming the hyperparameter. `SB3Arm.validate` builds the model dry (tensorboard_log None: no log dir, no
    rule: resolve built it dry) before algorithms.train writes anything."""
    config: SB3Config = spec.config
    run_cfg = config.run
    kwargs = sb3_schedules(copy.deepcopy(dict(config.algo_kwargs)))  # SB3 keeps (and may change) what it is given
    torch.set_num_threads(run_cfg.torch_threads)
    # numpy's BLAS too (RRD's reward model, relabelling): its default, a thread per core, contends with torch's and
    # the other workers' threads; benchmarks/sac_speed_levers.py measured SAC+RRD at 7 steps/s with it, 53-69 without
    threadpool_limits(run_cfg.torch_threads)
    rule = None
    if tensorboard_log is not None and not run_cfg.slot.empty:
        probe = make_env(spec.env, run_cfg.env_kwargs)
        try:
            rule = run_cfg.slot.build(ARM.credit_fit(spec.algo), env=probe, seed=spec.seed)
        finally:
            probe.close()
    callbacks = []
    if rule is not None and config.off_policy:
        # The buffer computes the n-step returns from the relabelled rewards (as SB3 sets up its NStepReplayBuffer);
        # the algorithm's own n_steps, which SB3 reads only to pick its buffer and ignores (warning) beside a custom
        # one, becomes 1. config.yml records the configured n_steps (SB3Config.hyperparams).
        relabel_kwargs = {"rule": rule, "n_steps": kwargs["n_steps"], "gamma": kwargs["gamma"]}
        kwargs.update(replay_buffer_class=RelabelingReplayBuffer, replay_buffer_kwargs=relabel_kwargs, n_steps=1)
        callbacks.append(RewardFitCallback())
    elif rule is not None:
        callbacks.append(CreditCallback(rule, run_cfg.credit_group_by))

    # SB3's make_vec_env asks for render_mode="rgb_array", which text envs reject; the model's seed
    # seeds these envs (BaseAlgorithm.set_random_seed).
    def played_env(index: int) -> Monitor:
        env = make_env(spec.env, run_cfg.env_kwargs)
        if tensorboard_log is not None:  # the run itself, not validate's dry build
            log_env_to_run_dir(env, tensorboard_log, run_cfg.env_kwargs, None if run_cfg.n_envs == 1 else index)
        return Monitor(Float32Rewards(env))

    env = DummyVecEnv([functools.partial(played_env, index) for index in range(run_cfg.n_envs)])
    try:
        model = config.algo_cls(
            run_cfg.policy, env, seed=spec.seed, device=run_cfg.device, tensorboard_log=tensorboard_log, **kwargs
        )
    except (TypeError, ValueError, AssertionError, RuntimeError, KeyError, AttributeError, MemoryError) as exc:
        env.close()
        raise ConfigError(_refusal(spec.algo, config.algo_cls, run_cfg, kwargs, exc)) from None
    except BaseException:
        env.close()
        raise
    return Built(model, env, rule, callbacks)


def _refusal(algo: str, algo_cls: type, run_cfg: SB3RunConfig, kwargs: dict[str, Any], exc: BaseException) -> str:
    """One line for SB3's (or torch's) refusal of the constructor arguments: the settings that differ from
    SB3's defaults are the suspects, and the policy's when the error rose while building the network."""
    first = str(exc).strip().splitlines()
    reason = f"{type(exc).__name__}: {first[0][:200]}" if first else type(exc).__name__
    defaults = algo_defaults(algo_cls)
    frames = [frame.filename for frame in traceback.extract_tb(exc.__traceback__)]
    in_network = any(("policies.py" in f or "torch_layers.py" in f or "/torch/" in f) for f in frames)
    suspects = {"policy_kwargs": kwargs.get("policy_kwargs")} if in_network and kwargs.get("policy_kwargs") else {}
    if not suspects:  # the settings SB3's message names, else every one that is not SB3's default
        named_in_message = {k: v for k, v in kwargs.items() if k in defaults and re.search(rf"\b{k}\b", str(exc))}
        suspects = named_in_message or {
            k: v for k, v in kwargs.items() if k in defaults and v != defaults[k] and k != "replay_buffer_kwargs"
        }
        if run_cfg.n_envs != 1 and not named_in_message:
            suspects["n_envs"] = run_cfg.n_envs
    named = ", ".join(f"{k}={v!r}" for k, v in suspects.items()) or "the defaults"
    return f"algo {algo!r} refused hyperparameters {named} ({reason}); expected values {algo_cls.__name__} accepts"


def evaluation_callback(spec: RunSpec, log_dir: str) -> EvalCallback | None:
    """SB3's EvalCallback on a fresh env of the run's, seeded apart from the training env, or None."""
    run_cfg = spec.config.run
    if run_cfg.eval_every_steps is None:
        return None
    eval_env = DummyVecEnv([lambda: Monitor(make_env(spec.env, run_cfg.env_kwargs))])
    eval_env.seed(spec.seed + 10_000)
    return EvalCallback(
        eval_env, n_eval_episodes=run_cfg.eval_episodes, eval_freq=run_cfg.eval_every_steps, log_path=log_dir, verbose=0
    )


def train(spec: RunSpec, log_dir: str, options: RunOptions) -> dict[str, Any]:
    """Learn until the criterion (when the run stops at it) or the episode cap; the summary's entries."""
    config: SB3Config = spec.config
    run_cfg, credit = config.run, config.run.credit
    built = build(spec, tensorboard_log=log_dir)
    outcomes = EpisodeOutcomes(ConvergenceTracker(run_cfg.convergence_window, run_cfg.convergence_threshold), repr(spec.env))
    convergence = ConvergenceCallback(outcomes, run_cfg.max_episodes, run_cfg.stop_at_convergence, report=options.report)
    evaluation = evaluation_callback(spec, log_dir)
    start = time.perf_counter()
    try:
        built.model.learn(
            total_timesteps=min(run_cfg.max_episodes * config.episode_steps, run_cfg.max_steps or 2**62),
            callback=CallbackList([*built.callbacks, convergence, *([evaluation] if evaluation else [])]),
            tb_log_name=f"{spec.algo}_{credit}",
            progress_bar=options.progress,
        )
    finally:
        built.env.close()
        if evaluation is not None:
            evaluation.eval_env.close()
    names = getattr(built.env.envs[0].unwrapped, "component_names", None)
    return {
        **convergence.summary(),
        "credit": credit,
        **rule_summary(built.rule, names),
        **reward_fit_summary(built.model),
        "timesteps": int(built.model.num_timesteps),
        "device": engines.trained_on(built.model, run_cfg.engine),  # ("auto" in the config names no device)
        **(
            {"eval_last_mean_return": float(evaluation.last_mean_reward)} if evaluation and evaluation.evaluations_results else {}
        ),
        "train_time_s": time.perf_counter() - start,
    }


def reward_fit_summary(model: Any) -> dict[str, Any]:
    """summary.json's record of a reward rule's fit to the dense reward (RelabelingReplayBuffer.reward_fit):
    the last point and the mean of the last ten, when the env reports the rewards it withheld."""
    fit = [r for _, r in getattr(getattr(model, "replay_buffer", None), "reward_fit", []) if np.isfinite(r)]
    if not fit:
        return {}
    return {"reward_fit_corr_last": fit[-1], "reward_fit_corr_last10_mean": float(np.mean(fit[-10:]))}


class SB3Arm(Arm):
    """Stable-Baselines3's PPO, A2C, DQN, SAC and TD3, each with a credit slot (`--credit RULE`)."""

    name = "sb3"
    budget_key = "max_episodes"
    budget_flag = "--max-episodes"
    budget_unit = "episodes"
    objective = EPISODES
    metric_tags = {"correct": "rollout/correct_moving_average", "return": "rollout/ep_rew_mean"}
    reports_convergence = True
    batch_provides = SB3_BATCH_PROVIDES
    info_provides = SB3_INFO_PROVIDES

    def provides(self, algo: str | None = None) -> tuple[frozenset[str], frozenset[str]]:
        if algo is None:
            return SB3_BATCH_PROVIDES, SB3_INFO_PROVIDES
        return SB3_BATCH_PROVIDES | (OFF_POLICY_EXTRAS if is_off_policy(algo) else ON_POLICY_EXTRAS), SB3_INFO_PROVIDES

    def consumes(self, algo: str | None = None) -> frozenset[str]:
        """PPO and A2C take both kinds (rewards through GAE, advantages in place of GAE's); DQN, SAC and TD3 have
        no advantage to replace: they take rewards, in their replay buffer."""
        if algo is not None and is_off_policy(algo):
            return frozenset({REWARDS})
        return frozenset({REWARDS, ADVANTAGES})

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        add_credit_argument(parser, self)

    def flag_hyperparams(self, args: argparse.Namespace) -> dict[str, Any]:
        return credit_flag(args)

    def resolve(self, algo: str, env: str, seed: int, mapping: Mapping[str, Any]) -> RunSpec:
        config = sb3_config(algo, env, mapping)
        return RunSpec(algo, env, seed, config.hyperparams(), config)

    def validate(self, spec: RunSpec) -> None:
        """Build the run's model on its env without a log dir, then drop it: a constructor argument SB3 or
        torch refuses is one line before algorithms.train writes anything."""
        build(spec, tensorboard_log=None).env.close()

    def run(self, spec: RunSpec, log_dir: str, options: RunOptions) -> dict[str, Any]:
        return train(spec, log_dir, options)


ARM = SB3Arm()
