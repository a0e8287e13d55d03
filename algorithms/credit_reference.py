"""Replay-defined credit, the reference (issue 34, item 2; SPEC.md Sec. 9; docs/papers/replay_credit.md).

    python -m algorithms.credit_reference [--env WatchRepair-v0,umbrella_length/9] [--policy uniform|scripted]
        [--rules broadcast,loo,...] [--seeds 3] [--episodes 32] [--train-episodes 512] [--batch-episodes 64]
        [--k 64] [--decision-step auto] [--independent-branches] [--seed 0]
        [--out benchmarks/results/credit_reference_{env}.json]

For each seed, episodes of a behaviour policy pi are played; before every step t the env is snapshotted
(envs/snapshot.py). From each snapshot s_t, for every action a of the (Discrete) action space, K continuations
are restored with a fresh outcome seed each (`restore(env, state, outcome_seed)`), take a first, then follow pi to
the episode's end. Their returns from t (the undiscounted sum of the rewards of steps t, t + 1, ... up to the
episode's termination or truncation) estimate

    Q(s_t, a) = mean_k G_k(a),   V(s_t) = sum_a pi(a | s_t) Q(s_t, a),   reference credit_t = Q(s_t, a_t) - V(s_t)

for the action a_t the episode took. Standard errors come from the per-continuation contrasts
d_k = G_k(a_t) - sum_a pi(a | s_t) G_k(a) (SE = std(d_k, ddof=1) / sqrt(K)), which are i.i.d. over k whether or
not the branches share random numbers. By default continuation k of every action shares its outcome seed and the
policy's random stream (common random numbers): where an action changes nothing (WatchRepair after its first step)
every branch replays the same future and the reference is exactly 0 rather than noise; `--independent-branches`
gives each (a, k) its own seeds.

Every credit rule that can score Gymnasium episodes (its batch needs met by observations, actions and groups,
no env info keys) is built per seed with `make_rule`, fed `--train-episodes` episodes of pi in batches of
`--batch-episodes` in the arms' call order (`assign_credit`: credit, then observe), and then gives its per-step
credit (`credit_of`) on the scored episodes, which it never observed, as one batch. Each scored episode's credit
vector over its steps is compared with the reference vector by CASI's `fidelity_metrics` (sign agreement over all
steps and over the steps with non-zero reference, Spearman, whether the rule's top step is a reference top step,
cosine; uncentred: a step's credit is relative to the policy's average at that step, not to the episode's other
steps) and, where the env declares its decision step, by leakage (the episode's share of |credit| after it,
credit_leakage's measure). The table gives the mean over scored episodes (pooled over seeds) and, for cosine, the
median (CASI's primary metric), each with a 95% percentile bootstrap CI (algorithms/experiment/stats.py).

Policies: `uniform` (pi(a) = 1 / n), `scripted` (the env's optimal first action, from its reset info
`optimal_first_action`, with probability 1, then uniform; WatchRepair offers it, the bsuite adapter does not). The
tabular arm has no checkpoint loader, so a trained policy is not offered.

Budget: a default run (WatchRepair-v0 and umbrella_length/9; 3 seeds x 32 scored episodes, K = 64, 512 training
episodes per seed, every rule that fits) is sized to about 4 minutes on one core, from measured costs: the reference
takes 0.026 s per scored episode and continuation on WatchRepair (50 steps x 2 actions) and 0.0075 s on
umbrella_length/9, i.e. ~160 s and ~46 s; the rules' training on 512 episodes takes ~1 s per seed (RUDDER's LSTM
starts after 256 of them). Cost grows linearly in seeds x episodes x K. K buys precision at the decision, episodes
buy the CI over episodes: at K = 64 the WatchRepair first decision's SE is ~0.7 (sd ~5.5 per contrast) against true
credits of +-0.75 (brands 0, 3) and +-1.75 (brands 1, 2) under the uniform policy.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

import vcbm_gym  # noqa: F401  (registers the envs)
from algorithms.common import cli, provenance
from algorithms.common.credit_slot import assign_credit, credit_of
from algorithms.common.errors import VcbmGymError
from algorithms.credit_fidelity import fidelity_metrics
from algorithms.experiment.stats import aggregate_estimates, bootstrap_description
from algorithms.sb3.callbacks import group_ids_for
from envs.snapshot import restore, snapshot, snapshot_problem
from vcbm_gym.credit.base import EpisodeBatch, unmet_rule_needs
from vcbm_gym.credit.registry import RULES, make_rule

PROG = "python -m algorithms.credit_reference"
DEFAULT_ENVS = ("WatchRepair-v0", "umbrella_length/9")
DEFAULT_OUT = str(Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "credit_reference_{env}.json")
POLICIES = ("uniform", "scripted")
# Constructor arguments per rule: baselines that need no critic (there is none here); shared with credit_leakage.
RULE_KWARGS: dict[str, dict[str, Any]] = {"broadcast": {"baseline": "batch_mean"}, "vcbm_bookmark": {"baseline": "batch_mean"}}
BATCH_PROVIDES = frozenset({"observations", "actions", "group_ids", "step_turn"})  # what `episode_batch` fills
METRICS = ("sign_all", "sign_nz", "spearman", "top_action", "cosine", "leakage")
ZERO = 1e-12

Episode = tuple[np.ndarray, np.ndarray, np.ndarray]  # (observations, actions, rewards) of one episode


def episode_batch(episodes: list[Episode]) -> EpisodeBatch:
    """Pad episodes to a prefix-masked batch; padding repeats each episode's last observation and action (valid in
    any space). Groups: episodes with the same first observation (credit_group_by: initial_obs)."""
    horizon = max(len(r) for _, _, r in episodes)
    mask = np.array([[t < len(r) for t in range(horizon)] for _, _, r in episodes])

    def pad(values: np.ndarray) -> np.ndarray:
        return np.concatenate([values, np.repeat(values[-1:], horizon - len(values), axis=0)])

    observations = np.stack([pad(o) for o, _, _ in episodes])
    actions = np.stack([pad(a) for _, a, _ in episodes])
    rewards = np.stack([np.concatenate([r, np.zeros(horizon - len(r))]) for _, _, r in episodes])
    return EpisodeBatch(
        rewards, mask, group_ids_for(observations[:, 0], "initial_obs"), observations=observations, actions=actions
    )


def leakage_sums(credit: np.ndarray, decision_step: int) -> tuple[float, float]:
    """(sum of |credit| after `decision_step`, sum of |credit|) over the last axis (steps) and any others."""
    magnitude = np.abs(np.asarray(credit, float))
    return float(magnitude[..., decision_step + 1 :].sum()), float(magnitude.sum())


@dataclass(frozen=True)
class BehaviourPolicy:
    """pi(a | s_t) of a behaviour policy that needs only the step index and the episode's reset info."""

    name: str
    n_actions: int

    def probabilities(self, t: int, reset_info: dict[str, Any]) -> np.ndarray:
        if self.name == "scripted" and t == 0:
            return np.eye(self.n_actions)[int(reset_info["optimal_first_action"])]
        return np.full(self.n_actions, 1.0 / self.n_actions)

    def sample(self, t: int, reset_info: dict[str, Any], rng: np.random.Generator) -> int:
        cumulative = np.cumsum(self.probabilities(t, reset_info))
        # side="right" never picks an action of probability 0; the clip guards cumsum's rounding below 1
        return int(min(np.searchsorted(cumulative, rng.random() * cumulative[-1], side="right"), self.n_actions - 1))


def finish_return(
    env: gym.Env, policy: BehaviourPolicy, t: int, action: int, reset_info: dict, rng: np.random.Generator
) -> float:
    """The undiscounted return from step t of the env as it stands: `action` first, then pi to the episode's end."""
    total, done = 0.0, False
    while not done:
        _, reward, terminated, truncated, _ = env.step(action)
        total += float(reward)
        done = terminated or truncated
        t += 1
        action = policy.sample(t, reset_info, rng)
    return total


def replay_returns(
    env: gym.Env,
    state: Any,
    policy: BehaviourPolicy,
    t: int,
    reset_info: dict[str, Any],
    k: int,
    seeds: np.random.SeedSequence,
    common: bool = True,
) -> np.ndarray:
    """(n_actions, k) returns from step t of continuations restored from `state` with a forced first action.
    `common`: continuation j of every action shares its outcome seed and policy stream (module docstring)."""
    draws = seeds.generate_state(2 * k * (1 if common else policy.n_actions), dtype=np.uint32).reshape(-1, k, 2)
    returns = np.empty((policy.n_actions, k))
    for action in range(policy.n_actions):
        outcome_seeds, policy_seeds = draws[0 if common else action].T
        for j in range(k):
            restore(env, state, outcome_seed=int(outcome_seeds[j]))
            returns[action, j] = finish_return(env, policy, t, action, reset_info, np.random.default_rng(int(policy_seeds[j])))
    return returns


def replay_estimates(returns: np.ndarray, probabilities: np.ndarray) -> dict[str, np.ndarray | float]:
    """Q(s, a), V(s) and the credit Q(s, a) - V(s) of every action, with standard errors, from (n, K) returns."""
    k = returns.shape[1]
    values = probabilities @ returns  # (K,): per continuation, V's contrast partner
    contrasts = returns - values[None, :]  # d_k(a) = G_k(a) - sum_b pi(b) G_k(b)
    q = returns.mean(axis=1)
    return {
        "q": q,
        "q_se": returns.std(axis=1, ddof=1) / np.sqrt(k),
        "v": float(probabilities @ q),
        "v_se": float(values.std(ddof=1) / np.sqrt(k)),
        "credit": q - probabilities @ q,
        "credit_se": contrasts.std(axis=1, ddof=1) / np.sqrt(k),
    }


@dataclass
class ReplayedEpisode:
    """One scored episode: what a rule sees (observations, actions, rewards) and the reference at each step."""

    observations: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    credit: np.ndarray  # (T,) Q(s_t, a_t) - V(s_t)
    credit_se: np.ndarray
    q: np.ndarray  # (T, n)
    v: np.ndarray  # (T,)
    decision_step: int | None

    def as_episode(self) -> Episode:
        return self.observations, self.actions, self.rewards


def play(env: gym.Env, policy: BehaviourPolicy, reset_seed: int, rng: np.random.Generator, keep_states: bool) -> dict[str, Any]:
    """One episode of pi: observations, actions, rewards, its reset info, its infos and (optionally) a snapshot
    taken before every step."""
    obs, reset_info = env.reset(seed=reset_seed)
    observations, actions, rewards, infos, states, done = [], [], [], [], [], False
    while not done:
        if keep_states:
            states.append(snapshot(env))
        action = policy.sample(len(actions), reset_info, rng)
        observations.append(np.asarray(obs))
        actions.append(action)
        obs, reward, terminated, truncated, info = env.step(action)
        rewards.append(float(reward))
        infos.append(info)
        done = terminated or truncated
    return {
        "episode": (np.stack(observations), np.asarray(actions), np.asarray(rewards)),
        "reset_info": reset_info,
        "infos": infos,
        "states": states,
    }


def declared_decision_step(infos: list[dict[str, Any]]) -> int | None:
    """The step the env says decides the return: the first flagged `is_decision_turn`, else step 0 where the env
    reports `first_decision_optimal` (the first action decides), else None."""
    for t, info in enumerate(infos):
        if info.get("is_decision_turn"):
            return t
    return 0 if "first_decision_optimal" in infos[-1] else None


def replay_episode(
    env: gym.Env, policy: BehaviourPolicy, reset_seed: int, seeds: np.random.SeedSequence, k: int, common: bool, decision: Any
) -> ReplayedEpisode:
    """Play one episode of pi and estimate the reference credit at every one of its steps."""
    play_seed, branch_seed = seeds.spawn(2)
    played = play(env, policy, reset_seed, np.random.default_rng(play_seed), keep_states=True)
    observations, actions, rewards = played["episode"]
    step_seeds = branch_seed.spawn(len(actions))
    rows = []
    for t, (state, step_seed) in enumerate(zip(played["states"], step_seeds)):
        probabilities = policy.probabilities(t, played["reset_info"])
        returns = replay_returns(env, state, policy, t, played["reset_info"], k, step_seed, common)
        rows.append(replay_estimates(returns, probabilities))
    taken = np.arange(len(actions)), actions
    return ReplayedEpisode(
        observations,
        actions,
        rewards,
        credit=np.stack([row["credit"] for row in rows])[taken],
        credit_se=np.stack([row["credit_se"] for row in rows])[taken],
        q=np.stack([row["q"] for row in rows]),
        v=np.array([row["v"] for row in rows]),
        decision_step=declared_decision_step(played["infos"]) if decision == "auto" else decision,
    )


def episode_scores(credit: np.ndarray, reference: np.ndarray, decision_step: int | None) -> dict[str, float]:
    """CASI's fidelity metrics of one episode's step credit against the reference, and its leakage share."""
    scores = fidelity_metrics(np.asarray(credit, float), np.asarray(reference, float))
    after, total = leakage_sums(credit, decision_step) if decision_step is not None else (np.nan, 0.0)
    scores["leakage"] = after / total if total > ZERO else float("nan")
    return scores


def summarise(per_episode: list[dict[str, float]]) -> dict[str, Any]:
    """Mean (median for cosine) of each metric over episodes with a bootstrap 95% CI; NaNs (undefined) left out."""
    summary: dict[str, Any] = {}
    for metric in METRICS:
        values = np.array([row[metric] for row in per_episode], float)
        values = values[np.isfinite(values)]
        statistic = "median" if metric == "cosine" else "mean"
        estimate = aggregate_estimates(values)[statistic] if len(values) else {"estimate": None, "ci_low": None, "ci_high": None}
        summary[metric] = {**estimate, "statistic": statistic, "n_defined": int(len(values))}
    return summary


def rule_misfit(name: str, env: gym.Env) -> str | None:
    """Why rule `name` cannot score Gymnasium episodes of `env` (one line), or None."""
    try:
        missing = unmet_rule_needs(make_rule(name, env=env, **RULE_KWARGS.get(name, {})), BATCH_PROVIDES, ())
    except (TypeError, ValueError) as exc:
        return str(exc)
    return f"needs {', '.join(missing)}, which episodes of a Gymnasium env do not have" if missing else None


def rule_credit(name: str, env: gym.Env, training: list[Episode], batch_episodes: int, scored: list[Episode]) -> np.ndarray:
    """(B, T) a fresh rule's credit on the scored episodes after it has learned from the training episodes."""
    rule = make_rule(name, env=env, **RULE_KWARGS.get(name, {}))
    for start in range(0, len(training) - batch_episodes + 1, batch_episodes):
        assign_credit(rule, episode_batch(training[start : start + batch_episodes]))
    return credit_of(rule, episode_batch(scored))


def run_seed(env: gym.Env, policy: BehaviourPolicy, args: argparse.Namespace, seed: int, rules: list[str]) -> dict[str, Any]:
    """One seed: training episodes, scored episodes with their reference, and every rule's per-episode scores."""
    root = np.random.SeedSequence([args.seed, seed])
    train_seeds, score_seeds = root.spawn(2)
    rng = np.random.default_rng(train_seeds)
    reset_base = (args.seed * 1_000 + seed) * 1_000_003  # env seeds apart per (run seed, seed)
    training = [play(env, policy, reset_base + i, rng, keep_states=False)["episode"] for i in range(args.train_episodes)]
    started = time.perf_counter()
    replayed = [
        replay_episode(
            env, policy, reset_base + args.train_episodes + i, s, args.k, not args.independent_branches, args.decision_step
        )
        for i, s in enumerate(score_seeds.spawn(args.episodes))
    ]
    reference_seconds = time.perf_counter() - started
    scored = [episode.as_episode() for episode in replayed]
    result: dict[str, Any] = {"reference_seconds": reference_seconds, "episodes": replayed, "rules": {}}
    for name in rules:
        started = time.perf_counter()
        credit = rule_credit(name, env, training, args.batch_episodes, scored)
        result["rules"][name] = {
            "scores": [episode_scores(c[: len(e.credit)], e.credit, e.decision_step) for c, e in zip(credit, replayed)],
            "seconds": time.perf_counter() - started,
        }
    return result


def reference_summary(episodes: list[ReplayedEpisode]) -> dict[str, Any]:
    """The reference's own leakage and precision: does its credit sit on the decision, and how noisy is it."""
    decided = [e for e in episodes if e.decision_step is not None]
    shares = [episode_scores(e.credit, e.credit, e.decision_step) for e in decided]
    at_decision = [e.credit[e.decision_step] / e.credit_se[e.decision_step] for e in decided if e.credit_se[e.decision_step] > 0]
    return {
        "leakage": summarise(shares)["leakage"] if shares else None,
        "mean_credit_se": float(np.mean(np.concatenate([e.credit_se for e in episodes]))),
        "mean_abs_z_at_decision": float(np.mean(np.abs(at_decision))) if at_decision else None,
        "steps": int(sum(len(e.credit) for e in episodes)),
    }


def markdown_table(result: dict[str, Any]) -> str:
    """One row per rule: fidelity to the replay reference and leakage, estimates with 95% bootstrap CIs."""
    s = result["settings"]
    reference = result["reference"]
    leak = reference["leakage"]
    lines = [
        f"Replay-reference fidelity on {result['env']}: behaviour policy {s['policy']}, {s['seeds']} seeds x "
        f"{s['episodes']} scored episodes, K = {s['k']} continuations per action and step "
        f"({'common random numbers' if s['common_random_numbers'] else 'independent branches'}), rules trained on "
        f"{s['train_episodes']} episodes per seed; mean over episodes (cosine: median), 95% bootstrap CI.",
        f"The reference's mean standard error per step: {reference['mean_credit_se']:.3g}; its own leakage: "
        + ("n/a (no decision step)" if not leak or leak["estimate"] is None else f"{leak['estimate']:.3f}")
        + ".",
        "",
        "| Rule | Sign all | Sign nz | Spearman | Top step | Median cosine | Leakage | Seconds per seed |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for name, row in result["rules"].items():
        if "refused" in row:
            lines.append(f"| `{name}` | refused: {row['refused']} | | | | | | |")
            continue
        cells = [_cell(row["summary"][metric]) for metric in METRICS]
        lines.append(f"| `{name}` | " + " | ".join(cells) + f" | {row['seconds_per_seed']:.1f} |")
    return "\n".join(lines)


def _cell(estimate: dict[str, Any]) -> str:
    if estimate["estimate"] is None:
        return "n/a"
    if estimate["ci_low"] is None:
        return f"{estimate['estimate']:.3f}"
    return f"{estimate['estimate']:.3f} [{estimate['ci_low']:.3f}, {estimate['ci_high']:.3f}]"


def env_slug(env_id: str) -> str:
    """A file-name form of an env id (umbrella_length/9 -> umbrella_length_9)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", env_id).strip("_")


def make_env(env_id: str) -> gym.Env | None:
    """The env, or None (with one line) where an optional package it needs is missing; one line for an env that
    cannot be branched over."""
    try:
        env = gym.make(env_id)
    except ModuleNotFoundError as exc:  # the bsuite adapter without bsuite: not this command's failure
        print(f"skip: env {env_id!r} needs a package that is not installed ({exc})", file=sys.stderr)
        return None
    except Exception as exc:  # noqa: BLE001  (gym.make's errors have no common class)
        raise VcbmGymError(f"--env {env_id!r}: cannot be made ({type(exc).__name__}: {exc})") from None
    if not isinstance(env.action_space, gym.spaces.Discrete):
        raise VcbmGymError(
            f"--env {env_id!r}: action space {env.action_space} is not Discrete: the reference branches over every action"
        )
    if int(env.action_space.start) != 0:  # the reference indexes actions 0..n-1, as rules read them
        raise VcbmGymError(f"--env {env_id!r}: action space {env.action_space} does not start at 0")
    problem = snapshot_problem(env)
    if problem is not None:
        raise VcbmGymError(f"--env {env_id!r}: cannot be replayed: {problem}")
    return env


def check_policy(env: gym.Env, env_id: str, policy: str) -> BehaviourPolicy:
    behaviour = BehaviourPolicy(policy, int(env.action_space.n))
    if policy == "scripted" and "optimal_first_action" not in env.reset(seed=0)[1]:
        raise VcbmGymError(
            f"--policy scripted: env {env_id!r} does not report optimal_first_action in its reset info; use --policy uniform"
        )
    return behaviour


def parse(argv: list[str]) -> argparse.Namespace:
    parser = cli.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default=",".join(DEFAULT_ENVS), help="comma-separated Gymnasium ids (Discrete actions)")
    parser.add_argument("--policy", default="uniform", choices=POLICIES, help="behaviour policy (module docstring)")
    parser.add_argument(
        "--rules", default=",".join(RULES), help="comma-separated credit rules; those that cannot score are listed"
    )
    parser.add_argument("--seeds", type=int, default=3, help="independent repeats: training and scored episodes, rules")
    parser.add_argument("--episodes", type=int, default=32, help="scored episodes per seed (the reference at every step)")
    parser.add_argument("--train-episodes", type=int, default=512, help="episodes each rule learns from first, per seed")
    parser.add_argument("--batch-episodes", type=int, default=64, help="episodes per training batch (a PPO rollout)")
    parser.add_argument("--k", type=int, default=64, help="continuations per action and step")
    parser.add_argument("--decision-step", default="auto", help="'auto' (what the env declares) or a step index")
    parser.add_argument("--independent-branches", action="store_true", help="no common random numbers across actions")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=DEFAULT_OUT, help="JSON file; {env} becomes the env id; a .md table beside it")
    args = parser.parse_args(argv)
    return check_args(args)


def check_args(args: argparse.Namespace) -> argparse.Namespace:
    """Every bad value is one line here, before any env runs or any file is written."""
    args.envs = [name.strip() for name in args.env.split(",") if name.strip()]
    if not args.envs:
        raise VcbmGymError(f"--env {args.env!r}: expected one or more comma-separated Gymnasium ids")
    rules = [name.strip() for name in args.rules.split(",") if name.strip()]
    unknown = [name for name in rules if name not in RULES]
    if not rules or unknown:
        raise VcbmGymError(f"--rules {args.rules!r}: unknown {unknown or 'empty'}; expected names from: {', '.join(RULES)}")
    args.rules = rules
    cli.check_seed(args.seed)
    cli.check_int(args.seeds, "--seeds", 1, 1000)
    cli.check_int(args.episodes, "--episodes", 2, 1_000_000)
    cli.check_int(args.k, "--k", 2, 1_000_000)  # two continuations at least: a standard error needs them
    cli.check_int(args.batch_episodes, "--batch-episodes", 1)
    cli.check_int(args.train_episodes, "--train-episodes", 0, 10_000_000)
    if args.decision_step != "auto":
        try:
            args.decision_step = cli.check_int(int(args.decision_step), "--decision-step", 0)
        except ValueError:
            raise VcbmGymError(f"--decision-step {args.decision_step!r}: expected 'auto' or an integer >= 0") from None
    if len(args.envs) > 1 and "{env}" not in args.out:
        raise VcbmGymError(f"--out {args.out!r}: with several envs it must contain {{env}} (each env writes its own file)")
    for env_id in args.envs:
        out = Path(args.out.replace("{env}", env_slug(env_id)))
        if out.is_dir() or out.suffix != ".json":
            raise VcbmGymError(f"--out {str(out)!r}: expected a .json file path")
        cli.check_output_dir(out.parent, "--out's folder")
    return args


def run_env(env_id: str, env: gym.Env, args: argparse.Namespace, argv: list[str], started: provenance.Start) -> dict[str, Any]:
    """Every seed on one env, the summary per rule, and the env's JSON and markdown table (written atomically)."""
    policy = check_policy(env, env_id, args.policy)
    fitting = [name for name in args.rules if rule_misfit(name, env) is None]
    seeds = [run_seed(env, policy, args, seed, fitting) for seed in range(args.seeds)]
    episodes = [episode for seed in seeds for episode in seed["episodes"]]
    shortest = min(len(e.credit) for e in episodes)
    if any(e.decision_step is not None and e.decision_step >= len(e.credit) for e in episodes):
        raise VcbmGymError(f"--decision-step {args.decision_step}: expected a step inside every episode (shortest: {shortest})")
    rules: dict[str, Any] = {}
    for name in args.rules:
        if name not in fitting:
            rules[name] = {"refused": rule_misfit(name, env)}
            continue
        per_episode = [score for seed in seeds for score in seed["rules"][name]["scores"]]
        rules[name] = {
            "summary": summarise(per_episode),
            "per_episode": per_episode,
            "seconds_per_seed": float(np.mean([seed["rules"][name]["seconds"] for seed in seeds])),
        }
    result = {
        "env": env_id,
        "settings": {
            "policy": args.policy,
            "seeds": args.seeds,
            "seed": args.seed,
            "episodes": args.episodes,
            "train_episodes": args.train_episodes,
            "batch_episodes": args.batch_episodes,
            "k": args.k,
            "common_random_numbers": not args.independent_branches,
            "decision_step": args.decision_step,
            "return": "undiscounted sum of rewards from step t to the episode's end (termination or truncation)",
        },
        "rule_kwargs": {name: RULE_KWARGS.get(name, {}) for name in args.rules},
        "reference": {
            **reference_summary(episodes),
            "seconds_per_seed": float(np.mean([seed["reference_seconds"] for seed in seeds])),
        },
        "reference_episodes": [
            {
                "credit": e.credit,
                "credit_se": e.credit_se,
                "q": e.q,
                "v": e.v,
                "actions": e.actions,
                "decision_step": e.decision_step,
            }
            for e in episodes
        ],
        "rules": rules,
        "bootstrap": bootstrap_description(),
    }
    result["table"] = markdown_table(result)
    result["run"] = provenance.run_record(PROG, argv, started)
    out = Path(args.out.replace("{env}", env_slug(env_id)))
    cli.output_dir(out.parent, "--out's folder")
    cli.atomic_write_json(out, _plain(result))
    cli.atomic_write_text(out.with_suffix(".md"), result["table"] + "\n")
    print(result["table"])
    return result


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
    envs = {env_id: make_env(env_id) for env_id in args.envs}  # every env checked before any runs
    for env_id, env in envs.items():
        if env is not None:
            check_policy(env, env_id, args.policy)
    return [run_env(env_id, env, args, argv, started) for env_id, env in envs.items() if env is not None]


def main(argv: list[str] | None = None) -> int:
    return cli.main(run, argv)


if __name__ == "__main__":
    sys.exit(main())
