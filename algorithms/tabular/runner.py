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

`ARM` (`TabularArm`, an algorithms.common.spec.Arm) is what algorithms.train drives: `resolve` builds the
run's typed config (`TabularConfig`) once into the RunSpec, and `run` trains from it.
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

from algorithms.common.config import as_plain_dict, build_dataclasses, load_object, log_env_to_run_dir, make_env
from algorithms.common.convergence import ConvergenceTracker, EpisodeOutcomes, EpisodeRunConfig
from algorithms.common.credit_slot import CreditSlot, add_credit_argument, credit_flag
from algorithms.common.errors import VcbmGymError
from algorithms.common.scalar_writer import ScalarWriter
from algorithms.common.spec import EPISODES, Arm, RunOptions, RunSpec
from algorithms.common.validation import AT_LEAST_ONE
from algorithms.tabular import credit as tabular_credit
from algorithms.tabular.base import TabularAgent
from algorithms.tabular.observations import TabularObservations, UntabulableSpace
from vcbm_gym.credit.base import REWARDS
from vcbm_gym.credit.features import SpaceFeaturizer

# The arm's agents, algo -> "module:Class"; td and mc have a credit slot (a `credit` constructor argument).
AGENTS = {
    "vcbm": "algorithms.tabular.vcbm:VCBMAgent",
    "vcbm-plus": "algorithms.tabular.vcbm:VCBMPlusAgent",
    "rudder": "algorithms.tabular.rudder:RudderAgent",
    "mc": "algorithms.tabular.mc:MonteCarloAgent",
    "td": "algorithms.tabular.q_learning:QLearningAgent",
}


def agent_class(algo: str) -> type[TabularAgent]:
    return load_object(AGENTS[algo])


def has_credit_slot(agent_cls: type) -> bool:
    """Agents that learn from a rule's rewards take a `credit` constructor argument (td, mc)."""
    return "credit" in inspect.signature(agent_cls).parameters


@dataclass
class TabularRunConfig(EpisodeRunConfig):
    RANGES = {"log_interval": AT_LEAST_ONE}

    log_interval: int = 1


@dataclass(frozen=True)
class TabularConfig:
    """A tabular run's typed configs (RunSpec.config), built once by `TabularArm.resolve` from the mapping."""

    agent_cls: type[TabularAgent]
    run: TabularRunConfig
    agent: Any  # an instance of agent_cls.config_class
    credit: CreditSlot | None  # None: the agent has no credit slot (vcbm, rudder)

    def hyperparams(self) -> dict[str, Any]:
        """The plain values config.yml records and the config hash identifies."""
        return as_plain_dict(self.run, self.agent, *([] if self.credit is None else [self.credit]))


def tabular_config(algo: str, mapping: Mapping[str, Any]) -> TabularConfig:
    """The run's, the agent's and the credit slot's dataclasses filled from `mapping` (one line at a bad key or value)."""
    agent_cls = agent_class(algo)
    has_slot = has_credit_slot(agent_cls)
    if not has_slot:
        given = [key for key in ("credit", "credit_kwargs") if key in mapping]
        if given:
            raise VcbmGymError(
                f"algo {algo!r} has no credit slot (its credit assignment is its own), got {given[0]}; "
                "expected --credit with td or mc"
            )
    classes = [TabularRunConfig, agent_cls.config_class, *([CreditSlot] if has_slot else [])]
    run_cfg, agent_cfg, *slot = build_dataclasses(mapping, classes, owner=f"algo {algo!r}")
    if slot:
        slot[0].check(ARM.credit_fit(algo))
    return TabularConfig(agent_cls, run_cfg, agent_cfg, slot[0] if slot else None)


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


@dataclass
class TabularRun:
    """What one run trains: the env (its observations flattened, its actions from 0) and the agent."""

    env: gym.Env
    flatten: Any  # env observation -> the agent's int vector
    action_start: int  # added back to the agent's action for the env (a Discrete space's `start`)
    agent: TabularAgent


def build_run(spec: RunSpec, log_dir: str) -> TabularRun:
    """The env and the agent (with its featurizer or credit rule) of `spec`; the env is closed if building fails."""
    config = spec.config
    # The passive env checker only inspects the first reset and step; the env tests run the full checkers.
    env = make_env(spec.env, tabular_env_kwargs(spec.env, config.run.env_kwargs), disable_env_checker=True)
    try:
        log_env_to_run_dir(env, log_dir, config.run.env_kwargs)
        observations, agent_actions = tabular_spaces(spec.algo, spec.env, env, config.agent_cls, config.agent)
        names = tuple(getattr(env.unwrapped, "component_names", ()) or ())
        names = names if len(names) == observations.n_components else observations.names
        extra = {}
        if "featurizer" in inspect.signature(config.agent_cls).parameters:
            own = getattr(env.unwrapped, "credit_featurizer", None)
            extra["featurizer"] = own() if callable(own) else SpaceFeaturizer(observations.space, agent_actions)
        if config.credit is not None:
            view = tabular_credit.AgentSpacesView(env, observations.space, agent_actions)
            extra["credit"] = config.credit.build(ARM.credit_fit(spec.algo), env=view, seed=spec.seed)
        agent = config.agent_cls(observations.space, agent_actions, config.agent, spec.seed, component_names=names, **extra)
    except BaseException:
        env.close()
        raise
    return TabularRun(env, observations.flatten, int(env.action_space.start), agent)


def play_episode(run: TabularRun, obs: Any) -> tuple[float, dict[str, Any]]:
    """One episode from the flattened first observation `obs`: the agent acts and learns; (return, last info)."""
    act, step, observe, flatten, start = run.agent.act, run.env.step, run.agent.observe, run.flatten, run.action_start
    episode_return, done, info = 0.0, False, {}
    while not done:  # looked up once above: this loop runs ~60k times a run
        action = act(obs)
        next_obs, reward, terminated, truncated, info = step(action + start if start else action)
        next_obs = flatten(next_obs)
        done = terminated or truncated
        reward = float(reward)
        observe(obs, action, reward, next_obs, done)
        episode_return += reward
        obs = next_obs
    return episode_return, info


def train(spec: RunSpec, log_dir: str, options: RunOptions) -> dict[str, Any]:
    """Train episode by episode until the criterion (when the run stops at it) or the episode cap; the summary's entries."""
    run_cfg = spec.config.run
    run = build_run(spec, log_dir)
    outcomes = EpisodeOutcomes(ConvergenceTracker(run_cfg.convergence_window, run_cfg.convergence_threshold), repr(spec.env))
    writer = ScalarWriter(log_dir)
    start = time.perf_counter()
    bar = tqdm(total=run_cfg.max_episodes, desc=f"{spec.algo} seed {spec.seed}", unit="ep", disable=not options.progress)
    try:
        for episode in range(1, run_cfg.max_episodes + 1):
            obs, _ = run.env.reset(seed=spec.seed) if episode == 1 else run.env.reset()
            episode_return, info = play_episode(run, run.flatten(obs))
            scalars = run.agent.end_episode()
            just_converged = outcomes.update(info, episode_return)
            if options.report is not None:
                options.report(episode, outcomes.progress(episode_return))
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
        run.env.close()
    return {**outcomes.summary(), "train_time_s": time.perf_counter() - start, **run.agent.summary()}


class TabularArm(Arm):
    """The tabular agents (vcbm, vcbm-plus, rudder, mc, td); td and mc have a credit slot (`--credit RULE`)."""

    name = "tabular"
    budget_key = "max_episodes"
    budget_flag = "--max-episodes"
    budget_unit = "episodes"
    objective = EPISODES
    metric_tags = {"correct": "train/correct_moving_average", "return": "train/episode_return"}
    reports_convergence = True
    batch_provides = tabular_credit.TABULAR_BATCH_PROVIDES
    info_provides = tabular_credit.TABULAR_INFO_PROVIDES

    def consumes(self, algo: str | None = None) -> frozenset[str]:
        """td and mc learn from a rule's rewards (their targets read them in place of the env's); the other
        agents keep their own credit."""
        if algo is not None and not has_credit_slot(agent_class(algo)):
            return frozenset()
        return frozenset({REWARDS})

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """`--credit RULE`, for the agents with a credit slot."""
        add_credit_argument(parser, self)

    def flag_hyperparams(self, args: argparse.Namespace) -> dict[str, Any]:
        return credit_flag(args)

    def resolve(self, algo: str, env: str, seed: int, mapping: Mapping[str, Any]) -> RunSpec:
        """The configs, checked; bad env_kwargs, spaces the agent cannot take and a rule that cannot run (its
        arguments, its needs) fail here, before the log dir exists: the env and the rule are built once, dry."""
        config = tabular_config(algo, mapping)
        probe = make_env(env, tabular_env_kwargs(env, config.run.env_kwargs), disable_env_checker=True)
        try:
            observations, agent_actions = tabular_spaces(algo, env, probe, config.agent_cls, config.agent)
            if config.credit is not None:  # built dry: a bad rule argument is one line before the log dir exists
                view = tabular_credit.AgentSpacesView(probe, observations.space, agent_actions)
                config.credit.build(self.credit_fit(algo), env=view, seed=seed)
        finally:
            probe.close()
        return RunSpec(algo, env, seed, config.hyperparams(), config)

    def run(self, spec: RunSpec, log_dir: str, options: RunOptions) -> dict[str, Any]:
        return train(spec, log_dir, options)


ARM = TabularArm()
