"""`python -m algorithms.train --algo ALGO --env ENV_ID [...]`: train one run, log it, summarise it.

Every run writes into its log dir: TensorBoard events, `config.yml` (the fully resolved
hyperparameters and command line) and `summary.json`. Hyperparameters come from
`zoo_configs/<algo>.yml[env_id]`, then `--config FILE`, then `--hyperparams key=value ...`.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import gymnasium as gym
import yaml

import vcbm_gym
from algorithms.common.config import parse_overrides, user_config, zoo_hyperparams
from algorithms.common.errors import VcbmGymError
from algorithms.common.run_context import RunContext
from algorithms.registry import ALGOS, get_algo


class _Parser(argparse.ArgumentParser):
    """Bad command lines become one VcbmGymError line instead of argparse's usage dump."""

    def error(self, message: str):  # type: ignore[override]
        raise VcbmGymError(message)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m algorithms.train", description=__doc__.splitlines()[0])
    parser.add_argument("--algo", required=True, help=f"one of: {', '.join(ALGOS)}")
    parser.add_argument("--env", default="WatchRepair-v0", help=f"a registered env id, e.g. {', '.join(vcbm_gym.ENV_IDS)}")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--log-dir", default=None, help="default: runs/<algo>/<env>/seed<seed>")
    parser.add_argument("--config", default=None, help="YAML file of hyperparameters (flat, or keyed by env id)")
    parser.add_argument("--hyperparams", nargs="*", default=[], metavar="KEY=VALUE")
    parser.add_argument("--max-episodes", type=int, default=None, help="episode cap (tabular and SB3 runs)")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    return parser


def check_env_id(env_id: str) -> None:
    if env_id not in gym.registry:
        ours = ", ".join(vcbm_gym.ENV_IDS)
        raise VcbmGymError(f"unknown env id {env_id!r}; expected a registered Gymnasium id such as: {ours}")


def run(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Parse a command line, train, and return the summary (also written to summary.json)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    known, _ = parser.parse_known_args(argv)
    spec = get_algo(known.algo)
    runner = importlib.import_module(spec.runner)
    runner.add_arguments(parser)
    args = parser.parse_args(argv)
    check_env_id(args.env)

    mapping = zoo_hyperparams(args.algo, args.env)
    if args.config:
        mapping.update(user_config(args.config, args.env, gym.registry.keys()))
    mapping.update(parse_overrides(args.hyperparams))
    if args.max_episodes is not None:
        mapping["max_episodes"] = args.max_episodes
    hyperparams = runner.resolve(args.algo, args.env, mapping)

    log_dir = Path(args.log_dir or Path("runs") / args.algo / args.env / f"seed{args.seed}")
    log_dir.mkdir(parents=True, exist_ok=True)
    resolved = {
        "algo": args.algo,
        "env": args.env,
        "seed": args.seed,
        "hyperparams": hyperparams,
        "command_line": {k: v for k, v in vars(args).items()},
    }
    (log_dir / "config.yml").write_text(yaml.safe_dump(resolved, sort_keys=False))

    start = time.perf_counter()
    ctx = RunContext(args.algo, args.env, args.seed, str(log_dir), hyperparams, args, progress=not args.no_progress)
    result = runner.run(ctx)
    summary = {"algo": args.algo, "env": args.env, "seed": args.seed, **result}
    summary["wall_time_s"] = time.perf_counter() - start
    summary["log_dir"] = str(log_dir)
    (log_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    return summary


def main(argv: Sequence[str] | None = None) -> int:
    try:
        summary = run(argv)
    except VcbmGymError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    skip = {"algo", "env", "seed", "log_dir"}
    brief = {k: v for k, v in summary.items() if k not in skip and (k == "roles" or isinstance(v, (bool, int, float, str, type(None))))}
    print(json.dumps(brief))
    print(f"TensorBoard logs: {summary['log_dir']}  (view with: tensorboard --logdir {summary['log_dir']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
