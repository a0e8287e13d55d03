"""Trains a tabular agent episode by episode until the convergence criterion or the episode cap.

The criterion (algorithms/common/convergence.py) reads the env contract's evaluation-only
`first_decision_optimal`; an env without it trains for `max_episodes` and reports its return (and
success rate, from `is_success`). An agent that takes a `featurizer` (RUDDER) gets the env's
(vcbm_gym.contract.episode_featurizer).
"""

from __future__ import annotations

import argparse
import inspect
import time
from dataclasses import dataclass
from typing import Any

from tqdm.auto import tqdm

from algorithms.common.config import as_plain_dict, build_dataclasses, make_env
from algorithms.common.convergence import ConvergenceTracker, EpisodeOutcomes, EpisodeRunConfig
from algorithms.common.run_context import RunContext
from algorithms.common.scalar_writer import ScalarWriter
from algorithms.common.validation import AT_LEAST_ONE
from algorithms.registry import get_algo, load_object
from algorithms.tabular.base import TabularAgent
from vcbm_gym.contract import episode_featurizer


@dataclass
class TabularRunConfig(EpisodeRunConfig):
    RANGES = {"log_interval": AT_LEAST_ONE}

    log_interval: int = 1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Tabular agents need no flags beyond the common ones."""


def _classes(algo: str) -> tuple[type[TabularAgent], type]:
    agent_cls = load_object(get_algo(algo).target)
    return agent_cls, agent_cls.config_class


def resolve(algo: str, env_id: str, mapping: dict[str, Any]) -> dict[str, Any]:
    agent_cls, config_cls = _classes(algo)
    run_cfg, agent_cfg = build_dataclasses(mapping, [TabularRunConfig, config_cls], owner=f"algo {algo!r}")
    make_env(env_id, run_cfg.env_kwargs, disable_env_checker=True).close()  # bad env_kwargs fail before the log dir exists
    return as_plain_dict(run_cfg, agent_cfg)


def run(ctx: RunContext) -> dict[str, Any]:
    agent_cls, config_cls = _classes(ctx.algo)
    run_cfg, agent_cfg = build_dataclasses(ctx.hyperparams, [TabularRunConfig, config_cls], owner=f"algo {ctx.algo!r}")
    # The passive env checker only inspects the first reset and step; the env tests run the full checkers.
    env = make_env(ctx.env_id, run_cfg.env_kwargs, disable_env_checker=True)
    names = tuple(getattr(env.unwrapped, "component_names", ()) or ()) or None
    extra = {"featurizer": episode_featurizer(env)} if "featurizer" in inspect.signature(agent_cls).parameters else {}
    agent = agent_cls(env.observation_space, env.action_space, agent_cfg, ctx.seed, component_names=names, **extra)
    outcomes = EpisodeOutcomes(ConvergenceTracker(run_cfg.convergence_window, run_cfg.convergence_threshold), repr(ctx.env_id))
    writer = ScalarWriter(ctx.log_dir)
    start = time.perf_counter()
    bar = tqdm(total=run_cfg.max_episodes, desc=f"{ctx.algo} seed {ctx.seed}", unit="ep", disable=not ctx.progress)
    obs, info = env.reset(seed=ctx.seed)
    act, step, observe = agent.act, env.step, agent.observe  # looked up once: the inner loop runs ~60k times a run
    try:
        for episode in range(1, run_cfg.max_episodes + 1):
            if episode > 1:
                obs, info = env.reset()
            episode_return, done = 0.0, False
            while not done:
                action = act(obs)
                next_obs, reward, terminated, truncated, info = step(action)
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
