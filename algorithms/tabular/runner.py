"""Trains a tabular agent episode by episode until the convergence criterion or the episode cap.

The criterion (algorithms/common/convergence.py) reads the env contract's evaluation-only
`first_decision_optimal`; an env without it trains for `max_episodes` and reports its return (and
success rate, from `is_success`). An agent that takes a `featurizer` (RUDDER) gets the env's
own `credit_featurizer()`, else `SpaceFeaturizer` on the flat spaces the agent sees.

Any env with Discrete actions and a discrete observation space runs: the agent sees each
observation flattened into a new int64 vector (`TabularObservations`: a copy, so an env that
rewrites the array it returned cannot make every component look static) and actions numbered
from 0 (a Discrete space's `start` is added back for the env). A float Box observation, a
non-Discrete action space, or an agent that cannot take the env's actions (tabular VCBM wants
exactly two) is refused in `resolve` with one line, before the log dir exists.

`--credit RULE` (td and mc: the agents with a credit slot, algorithms/tabular/credit.py) builds the
rule on the agent's spaces and hands it to the agent, which learns from the rule's return-equivalent
rewards; its arguments go under `credit_kwargs`, keyed by rule name. A rule the tabular episode cannot
feed, or `--credit` with an agent that has its own credit (vcbm, rudder), is refused in `resolve`.
"""

from __future__ import annotations

import argparse
import inspect
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
from gymnasium import spaces
from gymnasium.envs.registration import load_env_creator
from tqdm.auto import tqdm

from algorithms.common.config import as_plain_dict, build_dataclasses, log_env_to_run_dir, make_env
from algorithms.common.convergence import ConvergenceTracker, EpisodeOutcomes, EpisodeRunConfig
from algorithms.common.errors import VcbmGymError
from algorithms.common.run_context import RunContext
from algorithms.common.scalar_writer import ScalarWriter
from algorithms.common.validation import AT_LEAST_ONE
from algorithms.registry import get_algo, load_object
from algorithms.tabular import credit as credit_slot
from algorithms.tabular.base import TabularAgent
from algorithms.tabular.observations import TabularObservations, UntabulableSpace
from vcbm_gym.credit.features import SpaceFeaturizer


@dataclass
class TabularRunConfig(EpisodeRunConfig):
    RANGES = {"log_interval": AT_LEAST_ONE}

    log_interval: int = 1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`--credit RULE`, for the agents with a credit slot."""
    credit_slot.add_arguments(parser)


def flag_hyperparams(args: argparse.Namespace) -> dict[str, Any]:
    """The runner's flags as hyperparameters, so that the resolved config holds them."""
    return credit_slot.flag_hyperparams(args)


def _classes(algo: str) -> tuple[type[TabularAgent], list[type]]:
    """The agent class and the config dataclasses its hyperparameters fill (the run's, the agent's, the credit slot's)."""
    agent_cls = load_object(get_algo(algo).target)
    slot = [credit_slot.CreditSlotConfig] if credit_slot.has_credit_slot(agent_cls) else []
    return agent_cls, [TabularRunConfig, agent_cls.config_class, *slot]


def _configs(algo: str, mapping: Mapping[str, Any]) -> tuple[type[TabularAgent], list[Any]]:
    agent_cls, classes = _classes(algo)
    if credit_slot.CreditSlotConfig not in classes:
        given = [key for key in ("credit", "credit_kwargs") if key in mapping]
        if given:
            raise VcbmGymError(
                f"algo {algo!r} has no credit slot (its credit assignment is its own), got {given[0]}; "
                "expected --credit with td or mc"
            )
    return agent_cls, build_dataclasses(mapping, classes, owner=f"algo {algo!r}")


def tabular_spaces(algo: str, env_id: str, env: Any, agent_cls: type[TabularAgent], agent_cfg: Any):
    """(observations, agent's action space) for `env`, or one VcbmGymError line saying why not."""
    try:
        observations = TabularObservations(env.observation_space)
    except UntabulableSpace as exc:
        raise VcbmGymError(
            f"algo {algo!r} keys tables on integer observations; env {env_id!r} observes {exc}: "
            "expected Discrete, MultiDiscrete, MultiBinary, an integer Box, or a Tuple/Dict of them"
        ) from None
    actions = env.action_space
    agent_actions = spaces.Discrete(int(actions.n)) if isinstance(actions, spaces.Discrete) else actions
    why = agent_cls.unsupported(observations.space, agent_actions, agent_cfg)
    if why is not None:
        raise VcbmGymError(f"algo {algo!r} cannot run env {env_id!r} (actions {actions}): {why}")
    return observations, agent_actions


def tabular_env_kwargs(env_id: str, env_kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """`env_kwargs`, plus `integer_observations=True` for an env whose constructor offers that integer view
    of its observations (the env contract's tabular view; bsuite's envs) and the user did not set it."""
    kwargs = dict(env_kwargs)
    try:
        creator = load_env_creator(gym.spec(env_id.rpartition(":")[2]).entry_point)
        offers_view = "integer_observations" in inspect.signature(creator).parameters
    except (gym.error.Error, TypeError, ValueError, ImportError, AttributeError):
        offers_view = False  # make_env reports an unknown or broken env in its own words
    if offers_view:
        kwargs.setdefault("integer_observations", True)
    return kwargs


def resolve(algo: str, env_id: str, mapping: dict[str, Any]) -> dict[str, Any]:
    agent_cls, configs = _configs(algo, mapping)
    run_cfg, agent_cfg = configs[:2]
    # bad env_kwargs, spaces the agent cannot take and a rule that cannot run fail here, before the log dir exists
    env = make_env(env_id, tabular_env_kwargs(env_id, run_cfg.env_kwargs), disable_env_checker=True)
    try:
        observations, agent_actions = tabular_spaces(algo, env_id, env, agent_cls, agent_cfg)
        if len(configs) > 2:
            view = credit_slot.AgentSpacesView(env, observations.space, agent_actions)
            credit_slot.build_rule(configs[2], view, seed=0)
    finally:
        env.close()
    return as_plain_dict(*configs)


def run(ctx: RunContext) -> dict[str, Any]:
    agent_cls, configs = _configs(ctx.algo, ctx.hyperparams)
    run_cfg, agent_cfg = configs[:2]
    # The passive env checker only inspects the first reset and step; the env tests run the full checkers.
    env = make_env(ctx.env_id, tabular_env_kwargs(ctx.env_id, run_cfg.env_kwargs), disable_env_checker=True)
    log_env_to_run_dir(env, ctx.log_dir, run_cfg.env_kwargs)
    observations, agent_actions = tabular_spaces(ctx.algo, ctx.env_id, env, agent_cls, agent_cfg)
    flatten, action_start = observations.flatten, int(env.action_space.start)
    names = tuple(getattr(env.unwrapped, "component_names", ()) or ())
    names = names if len(names) == observations.n_components else observations.names
    extra = {}
    if "featurizer" in inspect.signature(agent_cls).parameters:
        own = getattr(env.unwrapped, "credit_featurizer", None)
        extra["featurizer"] = own() if callable(own) else SpaceFeaturizer(observations.space, agent_actions)
    if len(configs) > 2:
        view = credit_slot.AgentSpacesView(env, observations.space, agent_actions)
        extra["credit"] = credit_slot.build_rule(configs[2], view, seed=ctx.seed)
    agent = agent_cls(observations.space, agent_actions, agent_cfg, ctx.seed, component_names=names, **extra)
    outcomes = EpisodeOutcomes(ConvergenceTracker(run_cfg.convergence_window, run_cfg.convergence_threshold), repr(ctx.env_id))
    writer = ScalarWriter(ctx.log_dir)
    start = time.perf_counter()
    bar = tqdm(total=run_cfg.max_episodes, desc=f"{ctx.algo} seed {ctx.seed}", unit="ep", disable=not ctx.progress)
    obs, info = env.reset(seed=ctx.seed)
    obs = flatten(obs)
    act, step, observe = agent.act, env.step, agent.observe  # looked up once: the inner loop runs ~60k times a run
    try:
        for episode in range(1, run_cfg.max_episodes + 1):
            if episode > 1:
                obs, info = env.reset()
                obs = flatten(obs)
            episode_return, done = 0.0, False
            while not done:
                action = act(obs)
                next_obs, reward, terminated, truncated, info = step(action + action_start if action_start else action)
                next_obs = flatten(next_obs)
                done = terminated or truncated
                reward = float(reward)
                observe(obs, action, reward, next_obs, done)
                episode_return += reward
                obs = next_obs
            scalars = agent.end_episode()
            just_converged = outcomes.update(info, episode_return)
            if ctx.report is not None:
                ctx.report(episode, outcomes.progress(episode_return))
            if episode % run_cfg.log_interval == 0 or just_converged:
                moving = {f"train/{k}": v for k, v in outcomes.scalars().items() if k != "mean_return"}
                writer.add_scalars(episode, {**moving, "train/episode_return": episode_return, **scalars})
            bar.update(1)
            if episode % 50 == 0 and outcomes.has_criterion:
                bar.set_postfix(correct=f"{outcomes.tracker.rate:.3f}")
            if just_converged and run_cfg.stop_at_convergence:
                break
    finally:
        bar.close()
        writer.close()
        env.close()
    return {**outcomes.summary(), "train_time_s": time.perf_counter() - start, **agent.summary()}


def _arm():
    import sys

    from algorithms.common.module_arm import EPISODES, ModuleArm

    return ModuleArm(
        sys.modules[__name__],
        name="tabular",
        budget_key="max_episodes",
        budget_flag="--max-episodes",
        budget_unit="episodes",
        objective=EPISODES,
        metric_tags={"correct": "train/correct_moving_average", "return": "train/episode_return"},
        reports_convergence=True,
        batch_provides=credit_slot.TABULAR_BATCH_PROVIDES,
    )


ARM = _arm()
