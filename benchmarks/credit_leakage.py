"""Credit leakage: the share of |advantage| each credit rule puts on steps after the decision.

    python benchmarks/credit_leakage.py [--env WatchRepair-v0] [--rules broadcast,rudder,...]
        [--seeds 5] [--episodes 2048] [--batch-episodes 64] [--decision-step 0]
        [--out benchmarks/results/credit_leakage.json]

On a task whose true credit is known (WatchRepair: only the first action changes anything, so only
the first step's advantage is non-zero in expectation; bsuite's umbrella_length likewise), a rule
that assigns credit well puts its |advantage| on the decision step. For each seed, episodes of a
fixed behaviour policy (uniform random actions) stream through every rule in batches of
`--batch-episodes`, as a PPO rollout would feed it, in the arms' call order (the batch's `advantages` from the
rule's state after every earlier batch, then `observe`); the leakage of
the seed is

    sum over the second half of the batches of sum_{t > decision} |A_t|  /  the same sum over all t,

the first half being the learning rules' warm-up (RUDDER's LSTM starts after 256 episodes,
vcbm_bookmark's roles after 2,000 transitions). The table reports the mean over seeds with a 95%
bootstrap CI (scipy.stats.bootstrap, percentile method, over the seeds). 0 is perfect credit; a
rule that gives every step of an episode the same advantage leaks (T - 1) / T (0.98 on
WatchRepair's 50 steps). Groups (loo, grpo): episodes with the same first observation (on
WatchRepair: the same brand), as `credit_group_by: initial_obs` does for SB3.

`--env` takes any Gymnasium id, also `module:EnvId`; an env that cannot be made here (e.g. the
bsuite adapter's umbrella_length while it is not installed) is skipped with one line and exit 0.
A rule that refuses the env (vcbm_bookmark outside factored discrete states) is reported as such.
A `--decision-step` outside an episode of the env is refused with one line before any rule runs.
The JSON (written atomically, strict: an undefined share is null, see algorithms/common/cli.py) holds
every seed's share, the means and CIs, and the settings.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import yaml
from scipy import stats

import vcbm_gym  # noqa: F401  (registers WatchRepair-v0)
from algorithms.common import provenance
from algorithms.common.cli import ArgumentParser, atomic_write_json, check_int, check_output_dir, main, output_dir
from algorithms.common.errors import VcbmGymError
from algorithms.credit_reference.cli import rule_list
from algorithms.credit_reference.replay import BATCH_PROVIDES, RULE_KWARGS, episode_batch
from algorithms.credit_reference.scoring import leakage_sums
from vcbm_gym.credit.base import EpisodeBatch, unmet_needs
from vcbm_gym.credit.registry import RuleLookupError, make_rule

DEFAULT_RULES = ("broadcast", "loo", "grpo", "ircr", "rudder", "rrd", "vcbm_bookmark")
# RULE_KWARGS (baselines that need no critic), BATCH_PROVIDES and `episode_batch` are shared with the replay
# reference (algorithms/credit_reference/), which scores the same rules on the same kind of episodes.
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "credit_leakage.json"


def collect_episodes(env: gym.Env, n_episodes: int, seed: int) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """(observations, actions, rewards) of `n_episodes` episodes under uniform random actions."""
    env.action_space.seed(seed)
    episodes = []
    for k in range(n_episodes):
        obs, _ = env.reset(seed=seed * 1_000_003 + k)
        observations, actions, rewards, done = [], [], [], False
        while not done:
            action = env.action_space.sample()
            observations.append(np.asarray(obs))
            actions.append(np.asarray(action))
            obs, reward, terminated, truncated, _ = env.step(action)
            rewards.append(float(reward))
            done = terminated or truncated
        episodes.append((np.stack(observations), np.stack(actions), np.asarray(rewards)))
    return episodes


def leakage_of_seed(rule_name: str, env: gym.Env, batches: list[EpisodeBatch], decision_step: int) -> float:
    """The share of |A| after `decision_step` over the second half of the batches, for a fresh rule."""
    rule = make_rule(rule_name, env=env, **RULE_KWARGS.get(rule_name, {}))
    after = total = 0.0
    for index, batch in enumerate(batches):
        # the arms' order (assign_credit): the batch's credit from the rule's state after the earlier batches, then the
        # rule learns from it; |advantages| for every rule (a reward rule's `advantages` are its rewards)
        credit = rule.advantages(batch)
        rule.observe(batch)
        if index >= len(batches) // 2:
            batch_after, batch_total = leakage_sums(credit, decision_step)
            after += batch_after
            total += batch_total
    return after / total if total > 0 else float("nan")


def bootstrap_ci(values: np.ndarray, seed: int = 0) -> tuple[float, float]:
    """95% percentile-bootstrap CI of the mean over seeds; a point when every seed agrees."""
    values = values[np.isfinite(values)]
    if len(values) == 0:
        return float("nan"), float("nan")
    if len(values) < 2 or np.ptp(values) == 0:
        return float(values.mean()), float(values.mean())
    result = stats.bootstrap((values,), np.mean, confidence_level=0.95, method="percentile", n_resamples=9999, random_state=seed)
    return float(result.confidence_interval.low), float(result.confidence_interval.high)


def markdown_table(env_id: str, rows: dict[str, dict[str, Any]], seeds: int) -> str:
    lines = [
        f"Credit leakage on {env_id}: share of |advantage| after the decision step (0 = all credit on the decision; "
        f"mean over {seeds} seeds, 95% bootstrap CI)",
        "",
        "| Rule | Leakage | 95% CI | Seconds per seed |",
        "| --- | --- | --- | --- |",
    ]
    for name, row in rows.items():
        if "refused" in row:
            lines.append(f"| `{name}` | n/a (refused, see the JSON) | | |")
        elif row["mean"] is None or not np.isfinite(row["mean"]):  # null: read back from strict JSON
            lines.append(f"| `{name}` | n/a (every advantage 0: no credit to place) | | {row['seconds_per_seed']:.1f} |")
        else:
            lines.append(
                f"| `{name}` | {row['mean']:.3f} | [{row['ci_low']:.3f}, {row['ci_high']:.3f}] | {row['seconds_per_seed']:.1f} |"
            )
    return "\n".join(lines)


def parse(argv: list[str]) -> argparse.Namespace:
    parser = ArgumentParser(prog="benchmarks/credit_leakage.py", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--env", default="WatchRepair-v0", help="Gymnasium id (or module:EnvId) of a task with a known decision step"
    )
    parser.add_argument(
        "--rules", default=",".join(DEFAULT_RULES), help="comma-separated credit rules (built-in, registered or installed)"
    )
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--episodes", type=int, default=2048, help="episodes per seed")
    parser.add_argument("--batch-episodes", type=int, default=64, help="episodes per batch (a PPO rollout)")
    parser.add_argument("--decision-step", type=int, default=0, help="the step whose action decides the outcome")
    parser.add_argument("--env-kwargs", default="{}", help="YAML mapping of env constructor arguments")
    parser.add_argument("--out", default=str(DEFAULT_OUT), help="JSON output file")
    args = parser.parse_args(argv)
    try:
        args.env_kwargs = yaml.safe_load(args.env_kwargs)
    except yaml.YAMLError:
        args.env_kwargs = None
    if not isinstance(args.env_kwargs, dict):
        raise VcbmGymError(f"--env-kwargs {argv[argv.index('--env-kwargs') + 1]!r}: expected a YAML mapping")
    args.rules = rule_list(args.rules)
    check_int(args.seeds, "--seeds", 2, 1000)
    check_int(args.batch_episodes, "--batch-episodes", 1)
    check_int(args.episodes, "--episodes", 2 * args.batch_episodes)
    check_int(args.decision_step, "--decision-step", 0)
    out = Path(args.out)
    if out.is_dir():
        raise VcbmGymError(f"--out {args.out!r} is a directory: expected a JSON file path")
    check_output_dir(out.parent, "--out's folder")
    return args


def check_decision_step(decision_step: int, env_id: str, episodes: list[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> None:
    """A decision after an episode's last step would leave every advantage "before" it: a perfect 0 that means nothing."""
    shortest = min(len(rewards) for _, _, rewards in episodes)
    if decision_step >= shortest:
        raise VcbmGymError(
            f"--decision-step {decision_step}: expected a step inside every episode of {env_id}, 0 to {shortest - 1} "
            f"(its shortest episode has {shortest} steps)"
        )


def run(argv: list[str]) -> dict[str, Any] | None:
    args = parse(argv)
    started = provenance.start()
    try:
        env = gym.make(args.env, **args.env_kwargs)
    except Exception as exc:  # an unregistered id, a missing optional package: not this benchmark's failure
        print(f"skip: env {args.env!r} is not available here ({type(exc).__name__}: {exc})")
        return None
    seeds = list(range(args.seeds))
    batches_of_seed = {}
    for seed in seeds:
        episodes = collect_episodes(env, args.episodes, seed)
        check_decision_step(args.decision_step, args.env, episodes)
        chunks = range(0, len(episodes) - args.batch_episodes + 1, args.batch_episodes)
        batches_of_seed[seed] = [episode_batch(episodes[i : i + args.batch_episodes]) for i in chunks]
    rows: dict[str, dict[str, Any]] = {}
    for name in args.rules:
        try:
            missing = unmet_needs(make_rule(name, env=env, **RULE_KWARGS.get(name, {})).needs(), BATCH_PROVIDES)
            if missing:
                raise ValueError(f"needs {', '.join(missing)}, which episodes of a Gymnasium env do not have")
        except (TypeError, ValueError, RuleLookupError) as exc:
            rows[name] = {"refused": str(exc)}
            print(f"{name}: refused on {args.env} ({exc})", file=sys.stderr)
            continue
        start = time.perf_counter()
        shares = np.array([leakage_of_seed(name, env, batches_of_seed[seed], args.decision_step) for seed in seeds])
        low, high = bootstrap_ci(shares)
        rows[name] = {
            "shares": shares.tolist(),
            "mean": float(np.nanmean(shares)) if np.isfinite(shares).any() else float("nan"),
            "ci_low": low,
            "ci_high": high,
            "seconds_per_seed": (time.perf_counter() - start) / len(seeds),
        }
        print(f"{name}: {rows[name]['mean']:.3f} [{low:.3f}, {high:.3f}]", file=sys.stderr)
    shown = args.env + (f" {args.env_kwargs}" if args.env_kwargs else "")
    table = markdown_table(shown, rows, len(seeds))
    print(table)
    result = {
        "env": args.env,
        "env_kwargs": args.env_kwargs,
        "decision_step": args.decision_step,
        "behaviour_policy": "uniform random",
        "seeds": len(seeds),
        "episodes_per_seed": args.episodes,
        "batch_episodes": args.batch_episodes,
        "measured_batches": "second half",
        "rule_kwargs": {name: RULE_KWARGS.get(name, {}) for name in args.rules},
        "rules": rows,
        "table": table,
        "run": provenance.run_record("python benchmarks/credit_leakage.py", argv, started),
    }
    output_dir(Path(args.out).parent, "--out's folder")
    atomic_write_json(args.out, result)
    return result


if __name__ == "__main__":
    sys.exit(main(run))
