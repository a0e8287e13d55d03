"""Policy-gradient estimators scored against the exact gradient on LinearKeyToDoor and WatchRepair (COCOA's measure;
issue 34 item 3).

    python benchmarks/exact_gradient.py [--envs LinearKeyToDoor-v0,WatchRepair-v0] [--lengths 23,63,103]
        [--estimators reinforce,advantage,...]
        [--episodes 1,8,64] [--estimates 128] [--critic-episodes 256] [--seeds 30] [--logit-scale 1.0]
        [--random-layout] [--out benchmarks/results/exact_gradient.json]

Meulemans et al., NeurIPS 2023 (COCOA; arXiv:2306.16803): bias, variance and SNR in dB of each estimator's
gradient against the exact one (vcbm_gym/gradient_estimators.py: `bias_db`, `variance_db`, `snr_db`;
docs/papers/cocoa.md). For each seed and length: a tabular softmax policy, logits ~ N(0, logit_scale^2) per
state and action (the seed's policy: COCOA scores estimators at the policies its runs pass through); its exact
gradient (vcbm_gym.exact_gradient); then for each episode count n, `--estimates` independent estimates, each the
mean of n per-episode gradients (episodes of the exact MDP, `sample_episodes`), and the three scores of that stack.
E g_hat is COCOA's analytic one: the exact gradient for REINFORCE and the advantage estimators (a state baseline
adds no bias), `expected_critic_gradient` for the critics, so bias is exactly -inf dB for an unbiased estimator and
variance is about the estimator, not about the finite stack. A score beyond +-200 dB is shown as -inf / inf
(zero up to rounding: the exact critic at the first state, visited once per episode, has no variance). Learned
critics (`advantage_learned`: V; `q_critic_learned`: Q) are Monte Carlo means fitted per seed on `--critic-episodes`
separate episodes. Two scopes: every state's logits, and the first
state's only (the key decision; COCOA's `policy_var_first_state_only`, its canonical figures' setting; on
WatchRepair the four start states, one per brand, where the repair decision is taken). The table reports the mean
over seeds with a 95% bootstrap CI (algorithms.experiment.stats.aggregate_estimates).

WatchRepair-v0 (default parameters, T = 50): the same per seed, on `watch_repair_mdp` (the policy's state is
(flag, brand, t); the exact J and gradient need only the rewards' means, vcbm_gym/exact_gradient.py), but every
episode comes from the env itself (`env_episodes` on gym.make_vec("WatchRepair-v0"), its numpy vector version,
which plays sub-env i exactly as gym.make("WatchRepair-v0") reset with the same seed), so the estimators' variance
includes the env's Gaussian repair and transport costs and its random counters. Its table is the result's
`watch_repair` entry.

Budget: the defaults (3 lengths, 5 estimators, n in {1, 8, 64}, 128 estimates, i.e. 8,192 episodes per seed and
length, 30 seeds) took 3.0 s for one seed (0.2, 0.8 and 2.0 s at L = 23, 63, 103; --seeds 1, one core shared with
another job, niced), so about 1.5 minutes in all; WatchRepair adds 1.1 s per seed (8,448 env episodes of 50 steps
and the estimators on 404 states; --seeds 2 first), and the whole default run took 160 s (niced, 2 shared cores).
tests/test_exact_gradient.py and tests/test_exact_gradient_watch_repair.py run tiny budgets.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

import vcbm_gym  # noqa: F401  (registers WatchRepair-v0)
from algorithms.common import provenance
from algorithms.common.cli import ArgumentParser, atomic_write_json, check_int, check_output_dir, main, output_dir
from algorithms.common.errors import VcbmGymError
from algorithms.experiment.stats import aggregate_estimates
from envs.key_to_door import LENGTHS, LinearKeyToDoorEnv
from envs.watch_repair import WatchRepairEnv
from vcbm_gym.exact_gradient import (
    TabularMDP,
    env_episodes,
    evaluate_policy,
    exact_policy_gradient,
    expected_critic_gradient,
    key_to_door_mdp,
    sample_episodes,
    softmax_policy,
    watch_repair_mdp,
    watch_repair_state,
)
from vcbm_gym.gradient_estimators import (
    advantage_gradients,
    bias_db,
    fit_action_values,
    fit_state_values,
    q_critic_gradients,
    reinforce_gradients,
    snr_db,
    variance_db,
)

ESTIMATORS = ("reinforce", "advantage", "advantage_learned", "q_critic", "q_critic_learned")
SCORES = ("bias_db", "variance_db", "snr_db")
LIMIT_DB = 200.0  # |dB| beyond this is rounding: the quantity is zero
SCOPES = ("all_states", "first_state")
ENVS = ("LinearKeyToDoor-v0", "WatchRepair-v0")
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "exact_gradient.json"


def per_episode_gradients(name: str, mdp: TabularMDP, logits: np.ndarray, episodes, critic_episodes):
    """(one gradient estimate per episode (N, S, A), its exact expectation (S, A)) of estimator `name`.

    The expectation is COCOA's analytic E g_hat: the exact gradient for the score-function estimators (any state
    baseline leaves it unbiased), `expected_critic_gradient` for a critic given its Q."""
    policy = softmax_policy(logits)
    e, c = episodes, critic_episodes
    _, exact = exact_policy_gradient(mdp, logits)
    values, q_values = evaluate_policy(mdp, policy)
    if name == "reinforce":
        return reinforce_gradients(policy, e.states, e.actions, e.rewards, e.mask), exact
    if name.startswith("advantage"):
        if name == "advantage_learned":
            values = fit_state_values(c.states, c.rewards, c.mask, mdp.n_states)
        return advantage_gradients(policy, e.states, e.actions, e.rewards, e.mask, values), exact
    if name == "q_critic_learned":
        q_values = fit_action_values(c.states, c.actions, c.rewards, c.mask, mdp.n_states, mdp.n_actions)
    return q_critic_gradients(policy, e.states, e.mask, q_values), expected_critic_gradient(mdp, logits, q_values)


def clipped(db: float) -> float:
    """A dB score within +-LIMIT_DB: beyond it the quantity is zero up to floating-point rounding (an exact critic at
    a state every episode visits once has no variance; an unbiased estimator's bias is exactly 0: -inf)."""
    return float(np.clip(db, -LIMIT_DB, LIMIT_DB))


def watch_repair_episodes(mdp: TabularMDP, logits: np.ndarray, n_episodes: int, rng: np.random.Generator):
    """`n_episodes` episodes of WatchRepair-v0 itself (noise included) as rows of `mdp` (`sample_episodes`' form)."""
    env = gym.make_vec("WatchRepair-v0", num_envs=n_episodes, vectorization_mode="vector_entry_point")
    return env_episodes(env, mdp, logits, rng, watch_repair_state)


def scores_of_seed(
    mdp: TabularMDP, args: argparse.Namespace, seed: int, sample=sample_episodes
) -> dict[tuple[str, int, str], dict[str, float]]:
    """{(estimator, n, scope): {score: dB}} for one seed's policy and episodes; sample(mdp, logits, n, rng) draws
    the episodes (the MDP's own by default)."""
    rng = np.random.default_rng(seed)
    logits = args.logit_scale * rng.normal(size=(mdp.n_states, mdp.n_actions))
    _, exact = exact_policy_gradient(mdp, logits)
    n_max = max(args.episodes)
    episodes = sample(mdp, logits, n_max * args.estimates, rng)
    critic_episodes = sample(mdp, logits, args.critic_episodes, rng)
    start = np.flatnonzero(mdp.initial)  # the first decision's states (one, or one per WatchRepair brand)
    out = {}
    for name in args.estimators:
        grads, expected = per_episode_gradients(name, mdp, logits, episodes, critic_episodes)
        for n in args.episodes:
            # estimate i averages episodes i * n_max .. i * n_max + n - 1: every n draws from the same episodes
            stack = grads.reshape(args.estimates, n_max, *grads.shape[1:])[:, :n].mean(axis=1)
            for scope in SCOPES:
                rows = slice(None) if scope == "all_states" else start
                part, g, mean = stack[:, rows], exact[rows], expected[rows]
                out[(name, n, scope)] = {
                    "bias_db": clipped(bias_db(part, g, expected=mean)),
                    "variance_db": clipped(variance_db(part, g, expected=mean)),
                    "snr_db": clipped(snr_db(part, g)),
                }
    return out


def parse(argv: list[str]) -> argparse.Namespace:
    parser = ArgumentParser(prog="benchmarks/exact_gradient.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--envs", default=",".join(ENVS), help=f"comma-separated, from {ENVS}")
    parser.add_argument("--lengths", default="23,63,103", help=f"conveyor lengths, from {LENGTHS}")
    parser.add_argument("--estimators", default=",".join(ESTIMATORS), help=f"comma-separated, from {ESTIMATORS}")
    parser.add_argument("--episodes", default="1,8,64", help="episodes per estimate (COCOA's batch: 8)")
    parser.add_argument("--estimates", type=int, default=128, help="independent estimates per seed and episode count")
    parser.add_argument("--critic-episodes", type=int, default=256, help="episodes the learned V and Q are fitted on")
    parser.add_argument("--seeds", type=int, default=30, help="COCOA: 30")
    parser.add_argument("--logit-scale", type=float, default=1.0, help="the policy's logits ~ N(0, scale^2)")
    parser.add_argument("--random-layout", action="store_true", help="a fresh apple layout per episode")
    parser.add_argument("--out", default=str(DEFAULT_OUT), help="JSON output file")
    args = parser.parse_args(argv)
    args.envs = [name.strip() for name in args.envs.split(",") if name.strip()]
    if not args.envs or (bad := [name for name in args.envs if name not in ENVS]):
        raise VcbmGymError(f"--envs {args.envs}: expected names from {', '.join(ENVS)}")
    args.lengths = _int_list(args.lengths, "--lengths")
    if bad := [length for length in args.lengths if length not in LENGTHS]:
        raise VcbmGymError(f"--lengths: {bad} are not COCOA's conveyor lengths {LENGTHS}")
    args.estimators = [name.strip() for name in args.estimators.split(",") if name.strip()]
    if not args.estimators or (bad := [name for name in args.estimators if name not in ESTIMATORS]):
        raise VcbmGymError(f"--estimators {args.estimators}: expected names from {', '.join(ESTIMATORS)}")
    args.episodes = sorted(set(_int_list(args.episodes, "--episodes")))
    if args.episodes[0] < 1:
        raise VcbmGymError(f"--episodes {args.episodes}: expected counts >= 1")
    check_int(args.estimates, "--estimates", 2)
    check_int(args.critic_episodes, "--critic-episodes", 1)
    check_int(args.seeds, "--seeds", 1, 10_000)
    if not np.isfinite(args.logit_scale) or args.logit_scale < 0:
        raise VcbmGymError(f"--logit-scale {args.logit_scale}: expected a finite number >= 0")
    if Path(args.out).is_dir():
        raise VcbmGymError(f"--out {args.out!r} is a directory: expected a JSON file path")
    check_output_dir(Path(args.out).parent, "--out's folder")
    return args


def _int_list(text: str, option: str) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise VcbmGymError(f"{option} {text!r}: expected comma-separated integers") from None
    if not values:
        raise VcbmGymError(f"{option} {text!r}: expected at least one integer")
    return values


def _cell(entry: dict[str, float | None]) -> str:
    if abs(entry["estimate"]) >= LIMIT_DB:
        return "-inf" if entry["estimate"] < 0 else "inf"
    if entry["ci_low"] is None:
        return f"{entry['estimate']:.1f}"
    return f"{entry['estimate']:.1f} [{entry['ci_low']:.1f}, {entry['ci_high']:.1f}]"


def markdown_table(rows: list[dict[str, Any]], seeds: int, env: str = "LinearKeyToDoor") -> str:
    """One line per row; a first column L (the conveyor's length) where the rows have one."""
    lengths = all("length" in row for row in rows)
    lines = [
        f"Policy-gradient estimators against the exact gradient on {env} (dB; mean over {seeds} seeds, 95% "
        "bootstrap CI; bias and variance: lower is better, SNR: higher is better)",
        "",
        ("| L " if lengths else "") + "| Scope | Estimator | Episodes | Bias dB | Variance dB | SNR dB |",
        ("| --- " if lengths else "") + "| --- | --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        scores = " | ".join(_cell(row[score]) for score in SCORES)
        first = f"| {row['length']} " if lengths else ""
        lines.append(f"{first}| {row['scope']} | `{row['estimator']}` | {row['episodes']} | {scores} |")
    return "\n".join(lines)


def score_rows(mdp: TabularMDP, args: argparse.Namespace, label: dict[str, Any], sample=sample_episodes):
    """(the rows of one MDP: label + {score: mean over seeds with its CI and the per-seed values}, s per seed)."""
    clock = time.perf_counter()
    per_seed = [scores_of_seed(mdp, args, seed, sample) for seed in range(args.seeds)]
    seconds = (time.perf_counter() - clock) / args.seeds
    rows = []
    for key in per_seed[0]:
        name, n, scope = key
        row: dict[str, Any] = {**label, "scope": scope, "estimator": name, "episodes": n}
        for score in SCORES:
            values = [seed_scores[key][score] for seed_scores in per_seed]
            row[score] = {**aggregate_estimates(values)["mean"], "per_seed": values}
        rows.append(row)
    rows.sort(key=lambda row: (SCOPES.index(row["scope"]), args.estimators.index(row["estimator"]), row["episodes"]))
    return rows, seconds


def watch_repair_result(args: argparse.Namespace) -> dict[str, Any]:
    """The WatchRepair-v0 section: its MDP at the env's default parameters, episodes from the env itself."""
    env = WatchRepairEnv()
    mdp = watch_repair_mdp(env)
    rows, seconds = score_rows(mdp, args, {}, watch_repair_episodes)
    print(f"WatchRepair-v0: {seconds:.1f} s per seed", file=sys.stderr)
    return {
        "env": "WatchRepair-v0",
        "params": dataclasses.asdict(env.params),
        "n_states": mdp.n_states,
        "seconds_per_seed": seconds,
        "rows": rows,
        "table": markdown_table(rows, args.seeds, "WatchRepair (T = 50; episodes from the env, noise included)"),
    }


def run(argv: list[str]) -> dict[str, Any]:
    args = parse(argv)
    started = provenance.start()
    rows, seconds = [], {}
    for length in sorted(args.lengths) if "LinearKeyToDoor-v0" in args.envs else []:
        mdp = key_to_door_mdp(LinearKeyToDoorEnv(length=length, random_layout=args.random_layout))
        length_rows, seconds[length] = score_rows(mdp, args, {"length": length})
        print(f"L={length}: {seconds[length]:.1f} s per seed", file=sys.stderr)
        rows += length_rows
    table = markdown_table(rows, args.seeds) if rows else ""
    print(table)
    result = {
        "env": "LinearKeyToDoor-v0",
        "random_layout": args.random_layout,
        "settings": {
            k: getattr(args, k)
            for k in ("envs", "lengths", "estimators", "episodes", "estimates", "critic_episodes", "seeds", "logit_scale")
        },
        "seconds_per_seed": seconds,
        "rows": rows,
        "table": table,
    }
    if "WatchRepair-v0" in args.envs:
        result["watch_repair"] = watch_repair_result(args)
        print(result["watch_repair"]["table"])
    result["run"] = provenance.run_record("python benchmarks/exact_gradient.py", argv, started)
    output_dir(Path(args.out).parent, "--out's folder")
    atomic_write_json(args.out, result)
    return result


if __name__ == "__main__":
    sys.exit(main(run))
