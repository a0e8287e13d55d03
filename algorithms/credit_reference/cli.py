"""`python -m algorithms.credit_reference`: the command line, checked before any env runs or any file is written,
the envs it branches over, and one JSON file and markdown table per env."""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import yaml

import algorithms.credit_reference
import vcbm_gym  # noqa: F401  (registers the envs)
from algorithms.common import cli, provenance
from algorithms.common.errors import VcbmGymError
from algorithms.credit_reference.replay import (
    ACTIONS,
    ALTERNATIVES,
    AUTO_EPISODES,
    AUTO_GROUP_SIZE,
    BATCH_PROVIDES,
    END_INFO_FIELDS,
    RULE_KWARGS,
    SLOT_BATCH_PROVIDES,
    SLOTS,
    TEXT_BATCH_PROVIDES,
    TURN_INFO_FIELDS,
    BehaviourPolicy,
    Branching,
    ReplayedEpisode,
    play,
    play_slots,
)
from algorithms.credit_reference.report import markdown_table
from algorithms.credit_reference.scoring import SET_RULES, reference_summary, rule_misfit, run_seed, summarise
from algorithms.experiment.publish import RESULTS_DIR
from algorithms.experiment.stats import bootstrap_description
from envs.snapshot import snapshot_problem
from vcbm_gym.credit.registry import HOW_TO_REGISTER, is_rule, rule_names

PROG = "python -m algorithms.credit_reference"
DEFAULT_ENVS = ("WatchRepair-v0", "umbrella_length/9")
DEFAULT_OUT = str(RESULTS_DIR / "credit_reference_{env}.json")
POLICIES = ("uniform", "scripted")


def env_slug(env_id: str) -> str:
    """A file-name form of an env id (umbrella_length/9 -> umbrella_length_9)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", env_id).strip("_")


def branching_kind(env: gym.Env) -> str | None:
    """How the reference branches over `env` (`Branching`), or None: no finite alternatives."""
    space = env.action_space
    if isinstance(space, gym.spaces.Discrete):
        return ACTIONS
    if hasattr(env.unwrapped, "turn_alternatives"):
        return ALTERNATIVES
    if isinstance(space, gym.spaces.MultiDiscrete) and np.asarray(space.nvec).ndim == 1:
        return SLOTS
    return None


def space_text(space: gym.Space) -> str:
    """A space on one line (a Text space's charset holds whitespace)."""
    return f"Text(max_length={space.max_length})" if isinstance(space, gym.spaces.Text) else " ".join(str(space).split())


def make_env(env_id: str, env_kwargs: dict[str, Any] | None = None) -> gym.Env | None:
    """The env (`gym.make(env_id, **env_kwargs)`), or None (with one line) where an optional package it needs is
    missing; one line for an env that cannot be branched over."""
    try:
        env = gym.make(env_id, **(env_kwargs or {}))
    except ModuleNotFoundError as exc:  # the bsuite adapter without bsuite: not this command's failure
        print(f"skip: env {env_id!r} needs a package that is not installed ({exc})", file=sys.stderr)
        return None
    except Exception as exc:  # noqa: BLE001  (gym.make's errors have no common class)
        raise VcbmGymError(f"--env {env_id!r}: cannot be made ({type(exc).__name__}: {exc})") from None
    if branching_kind(env) is None:
        raise VcbmGymError(
            f"--env {env_id!r}: action space {space_text(env.action_space)} has no finite alternatives to branch over: expected "
            "Discrete, an env that lists its turns' alternatives (turn_alternatives(), vcbm_gym/contract.py) or a "
            "one-step MultiDiscrete set action"
        )
    if isinstance(env.action_space, gym.spaces.Discrete) and int(env.action_space.start) != 0:
        raise VcbmGymError(f"--env {env_id!r}: action space {env.action_space} does not start at 0")  # rules read 0..n-1
    problem = snapshot_problem(env)
    if problem is not None:
        raise VcbmGymError(f"--env {env_id!r}: cannot be replayed: {problem}")
    return env


def probe_branching(env: gym.Env, env_id: str) -> Branching:
    """`env`'s Branching, from one episode of the uniform policy: the info keys it reports (per turn: on every step;
    a set action's: on its step), and the batch fields they fill."""
    kind = branching_kind(env)
    uniform, rng = BehaviourPolicy("uniform"), np.random.default_rng(0)
    if kind == SLOTS:
        infos = [play_slots(env, uniform, 0, rng)["played"].infos[-1]]
        if "set_value" not in infos[0]:
            raise VcbmGymError(
                f"--env {env_id!r}: a set action's reference needs info['set_value'] (the set's exact expected value), "
                "which the env does not report"
            )
    else:
        infos = play(env, uniform, 0, rng, keep_states=False)["played"].infos
    every, last = set.intersection(*(set(info) for info in infos)), set(infos[-1])
    provides = {ACTIONS: BATCH_PROVIDES, ALTERNATIVES: TEXT_BATCH_PROVIDES, SLOTS: SLOT_BATCH_PROVIDES}[kind]
    if kind != SLOTS:  # a slot is no turn of its own
        provides |= {fill for key, fill in TURN_INFO_FIELDS.items() if key in every}
    provides |= {fill for key, fill in END_INFO_FIELDS.items() if key in last}
    return Branching(kind, frozenset(provides), frozenset(every | last))


def check_setting(env: gym.Env, env_id: str, args: argparse.Namespace) -> tuple[BehaviourPolicy, Branching]:
    """The behaviour policy and Branching for `env`; one line for a policy or option the env cannot take."""
    fit = probe_branching(env, env_id)
    if args.policy == "scripted":
        if fit.kind == ACTIONS and "optimal_first_action" not in env.reset(seed=0)[1]:
            raise VcbmGymError(
                f"--policy scripted: env {env_id!r} does not report optimal_first_action in its reset info; use --policy uniform"
            )
        if fit.kind == ALTERNATIVES and not hasattr(env.unwrapped, "optimal_alternative"):
            raise VcbmGymError(
                f"--policy scripted: env {env_id!r} names no optimal alternative (optimal_alternative(), "
                "vcbm_gym/contract.py); use --policy uniform"
            )
        if fit.kind == SLOTS:
            raise VcbmGymError(
                f"--policy scripted: env {env_id!r} is a set action that names no optimal set; use --policy uniform"
            )
    if fit.kind == SLOTS and args.decision_step != "auto":
        raise VcbmGymError(
            f"--decision-step {args.decision_step}: env {env_id!r} is scored per slot of one set action, which has no "
            "decision step; leave it at 'auto'"
        )
    if fit.kind == SLOTS and args.independent_branches:
        raise VcbmGymError(
            f"--independent-branches: env {env_id!r}'s set reference is exact (no continuations to share random numbers)"
        )
    size = args.group_size if args.group_size != "auto" else (1 if fit.kind == ACTIONS else AUTO_GROUP_SIZE)
    episodes = args.episodes if args.episodes != "auto" else AUTO_EPISODES[fit.kind]
    return BehaviourPolicy(args.policy), replace(fit, group_size=size, episodes=episodes)


def parse(argv: list[str]) -> argparse.Namespace:
    parser = cli.ArgumentParser(prog=PROG, description=algorithms.credit_reference.__doc__.split("\n\n")[0])
    parser.add_argument("--env", default=",".join(DEFAULT_ENVS), help="comma-separated Gymnasium ids (Discrete actions)")
    parser.add_argument("--policy", default="uniform", choices=POLICIES, help="behaviour policy (module docstring)")
    parser.add_argument(
        "--rules", default=",".join(rule_names()), help="comma-separated credit rules; those that cannot score are listed"
    )
    parser.add_argument("--seeds", type=int, default=3, help="independent repeats: training and scored episodes, rules")
    parser.add_argument(
        "--episodes",
        default="auto",
        help=f"scored episodes per seed (the reference at every step); 'auto': {AUTO_EPISODES[ACTIONS]} on a Discrete env, "
        f"{AUTO_EPISODES[ALTERNATIVES]} on a text env, {AUTO_EPISODES[SLOTS]} sets on a set action (module docstring)",
    )
    parser.add_argument("--train-episodes", type=int, default=512, help="episodes each rule learns from first, per seed")
    parser.add_argument("--batch-episodes", type=int, default=64, help="episodes per training batch (a PPO rollout)")
    parser.add_argument("--k", type=int, default=64, help="continuations per action and step")
    parser.add_argument(
        "--group-size",
        default="auto",
        help="rollouts per task (reset seed) for loo/grpo-style groups; 'auto': 1 on Discrete envs (groups by initial "
        f"observation), {AUTO_GROUP_SIZE} on text and set envs (the LLM arm's rollouts per task)",
    )
    parser.add_argument("--decision-step", default="auto", help="'auto' (what the env declares) or a step index")
    parser.add_argument("--independent-branches", action="store_true", help="no common random numbers across actions")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--env-kwargs",
        default="{}",
        help="YAML mapping of keyword arguments for every env's gym.make, e.g. '{integer_observations: true}' "
        "(bsuite's integer view, the one the SB3 sweeps and vcbm_bookmark read)",
    )
    parser.add_argument("--out", default=DEFAULT_OUT, help="JSON file; {env} becomes the env id; a .md table beside it")
    args = parser.parse_args(argv)
    return check_args(args)


def rule_list(text: str) -> list[str]:
    """`--rules`: comma-separated names, each a built-in, registered or installed credit rule."""
    rules = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in rules if not is_rule(name)]
    if not rules or unknown:
        raise VcbmGymError(
            f"--rules {text!r}: unknown {unknown or 'empty'}; expected names from: {', '.join(rule_names())} ({HOW_TO_REGISTER})"
        )
    return rules


def auto_or_int(value: str, option: str, lo: int, hi: int | None = None) -> str | int:
    """An option that is 'auto' or an integer in [lo, hi]."""
    if value == "auto":
        return value
    try:
        return cli.check_int(int(value), option, lo, hi)
    except ValueError:
        raise VcbmGymError(f"{option} {value!r}: expected 'auto' or an integer >= {lo}") from None


def check_args(args: argparse.Namespace) -> argparse.Namespace:
    """Every bad value is one line here, before any env runs or any file is written."""
    args.envs = [name.strip() for name in args.env.split(",") if name.strip()]
    if not args.envs:
        raise VcbmGymError(f"--env {args.env!r}: expected one or more comma-separated Gymnasium ids")
    args.rules = rule_list(args.rules)
    try:
        env_kwargs = yaml.safe_load(args.env_kwargs)
    except yaml.YAMLError:
        env_kwargs = None
    if not isinstance(env_kwargs, dict) or not all(isinstance(key, str) for key in env_kwargs):
        raise VcbmGymError(f"--env-kwargs {args.env_kwargs!r}: expected a YAML mapping of keyword names to values")
    args.env_kwargs = env_kwargs
    cli.check_seed(args.seed)
    cli.check_int(args.seeds, "--seeds", 1, 1000)
    args.episodes = auto_or_int(args.episodes, "--episodes", 2, 1_000_000)
    cli.check_int(args.k, "--k", 2, 1_000_000)  # two continuations at least: a standard error needs them
    cli.check_int(args.batch_episodes, "--batch-episodes", 1)
    cli.check_int(args.train_episodes, "--train-episodes", 0, 10_000_000)
    args.group_size = auto_or_int(args.group_size, "--group-size", 1, 1_000_000)
    args.decision_step = auto_or_int(args.decision_step, "--decision-step", 0)
    if len(args.envs) > 1 and "{env}" not in args.out:
        raise VcbmGymError(f"--out {args.out!r}: with several envs it must contain {{env}} (each env writes its own file)")
    for env_id in args.envs:
        out = Path(args.out.replace("{env}", env_slug(env_id)))
        if out.is_dir() or out.suffix != ".json":
            raise VcbmGymError(f"--out {str(out)!r}: expected a .json file path")
        cli.check_output_dir(out.parent, "--out's folder")
    return args


def run_env(
    env_id: str,
    env: gym.Env,
    setting: tuple[BehaviourPolicy, Branching],
    args: argparse.Namespace,
    argv: list[str],
    started: provenance.Start,
) -> dict[str, Any]:
    """Every seed on one env, the summary per rule, and the env's JSON and markdown table (written atomically)."""
    policy, fit = setting
    names = [*args.rules, *(SET_RULES if fit.kind == SLOTS else ())]
    misfits = {name: rule_misfit(name, env, fit) for name in names}
    fitting = [name for name in names if misfits[name] is None]
    seeds = [run_seed(env, policy, args, seed, fitting, fit) for seed in range(args.seeds)]
    episodes = [episode for seed in seeds for episode in seed["episodes"]]
    # the bootstrap's unit: a task (seed, group) where rollouts of one task share it, else the episode
    tasks = (
        [i * 1_000_000 + e.played.task for i, seed in enumerate(seeds) for e in seed["episodes"]] if fit.group_size > 1 else None
    )
    shortest = min(len(e.credit) for e in episodes)
    if any(e.decision_step is not None and e.decision_step >= len(e.credit) for e in episodes):
        raise VcbmGymError(f"--decision-step {args.decision_step}: expected a step inside every episode (shortest: {shortest})")
    rules: dict[str, Any] = {}
    for name in names:
        if misfits[name] is not None:
            rules[name] = {"refused": misfits[name]}
            continue
        per_episode = [score for seed in seeds for score in seed["rules"][name]["scores"]]
        rules[name] = {
            "summary": summarise(per_episode, tasks),
            "per_episode": columns(per_episode),
            "seconds_per_seed": float(np.mean([seed["rules"][name]["seconds"] for seed in seeds])),
        }
        if fit.kind == SLOTS:
            centred = [score for seed in seeds for score in seed["rules"][name]["centred"]]
            rules[name]["summary_centred"] = summarise(centred, tasks)
    result = {
        "env": env_id,
        "settings": {
            "policy": args.policy,
            "env_kwargs": args.env_kwargs,
            "seeds": args.seeds,
            "seed": args.seed,
            "episodes": fit.episodes,
            "train_episodes": args.train_episodes,
            "batch_episodes": args.batch_episodes,
            "k": args.k if fit.kind != SLOTS else None,
            "common_random_numbers": not args.independent_branches,
            "decision_step": args.decision_step,
            "branching": fit.kind,
            "group_size": fit.group_size,
            "groups": "episodes with the same initial observation"
            if fit.group_size == 1
            else "rollouts of one task (reset seed)",
            "return": (
                "the set's exact expected value info['set_value'] (the reward is the snapshot evaluator's)"
                if fit.kind == SLOTS
                else "undiscounted sum of rewards from step t to the episode's end (termination or truncation)"
            ),
        },
        "batch_provides": sorted(fit.batch_provides),
        "info_provides": sorted(fit.info_provides),
        "rule_kwargs": {name: RULE_KWARGS.get(name, {}) for name in names},
        "reference": {
            **reference_summary(episodes),
            "seconds_per_seed": float(np.mean([seed["reference_seconds"] for seed in seeds])),
        },
        "reference_episodes": [reference_record(e, fit.kind) for e in episodes],
        "rules": rules,
        "bootstrap": {
            **bootstrap_description(),
            "unit": "the task: whole groups of rollouts of one task resampled (cluster bootstrap, task_estimate)"
            if tasks is not None
            else "the scored episode",
        },
    }
    result["table"] = markdown_table(result)
    result["run"] = provenance.run_record(PROG, argv, started)
    out = Path(args.out.replace("{env}", env_slug(env_id)))
    cli.output_dir(out.parent, "--out's folder")
    cli.atomic_write_json(out, _plain(result), indent=None)  # one line: per-episode numbers would be 3 MB indented
    cli.atomic_write_text(out.with_suffix(".md"), result["table"] + "\n")
    print(result["table"])
    return result


def reference_record(episode: ReplayedEpisode, kind: str) -> dict[str, Any]:
    """One scored episode's reference for the JSON; a set's without its standard errors (0: exact) and decision step
    (none)."""
    record = {"credit": episode.credit, "credit_se": episode.credit_se, "q": episode.q, "v": episode.v}
    record.update(actions=episode.actions, decision_step=episode.decision_step)
    if kind == SLOTS:
        del record["credit_se"], record["decision_step"]
    return record


def columns(rows: list[dict[str, float]]) -> dict[str, list[float]]:
    """Per-episode score rows as one list per metric (in the rows' order): the JSON names each metric once."""
    return {metric: [row.get(metric) for row in rows] for metric in dict.fromkeys(key for row in rows for key in row)}


def _plain(value: Any) -> Any:
    """numpy arrays and scalars as lists and Python numbers, for the JSON."""
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value


def run(argv: list[str]) -> list[dict[str, Any]]:
    args = parse(argv)
    started = provenance.start()
    envs = {env_id: make_env(env_id, args.env_kwargs) for env_id in args.envs}  # every env checked before any runs
    settings = {env_id: check_setting(env, env_id, args) for env_id, env in envs.items() if env is not None}
    return [run_env(env_id, envs[env_id], setting, args, argv, started) for env_id, setting in settings.items()]


def main(argv: list[str] | None = None) -> int:
    return cli.main(run, argv)
