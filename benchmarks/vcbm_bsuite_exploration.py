"""Tabular VCBM's exploration budget on bsuite's umbrella experiments: bsuite's score per seed for each
(warm-up transitions, forced visits) pair, with the per-setting average regret bsuite's score thresholds at 0.5.

bsuite scores the whole run's regret, so exploration is paid for in the score. The paper's exploration (2,000
warm-up transitions, 60 forced visits per action and key) fits its own WatchRepair runs of thousands of 51-step
episodes, not bsuite's short protocol (1,000 episodes of 1-20 steps). This is how the zoo's bsuite entry for VCBM was
chosen (docs/notes/2026-12-05-vcbm-bsuite-exploration-budget.md), on seeds no scored run uses.

    python benchmarks/vcbm_bsuite_exploration.py --experiment umbrella_length --settings 0 2 5 9 \\
        --seeds 100 6 --grid 2000:60 100:8 --out docs/notes/2026-12-05-vcbm-bsuite-exploration-budget/umbrella_length.json
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import io
import itertools
import sys
import tempfile
from pathlib import Path

from algorithms import bsuite_score, train
from algorithms.common import cli
from algorithms.common.errors import VcbmGymError
from algorithms.experiment import suite

SHORT_EPISODES = 1_000  # the short protocol's budget per setting


def pair(text: str) -> tuple[int, int]:
    warmup, _, forced = text.partition(":")
    if not (warmup.isdigit() and forced.isdigit()):
        raise argparse.ArgumentTypeError(f"{text!r}: expected WARMUP:FORCED, two non-negative integers, e.g. 100:8")
    return int(warmup), int(forced)


def average_regret(log_dir: Path) -> float:
    """bsuite's umbrella measure of one run: total regret at the last logged episode per episode."""
    (log,) = log_dir.glob("*.csv")
    with log.open() as f:
        *_, last = csv.DictReader(f)
    return float(last["total_regret"]) / int(last["episode"])


def run_one(experiment: str, setting: int, seed: int, warmup: int, forced: int, episodes: int, where: Path) -> Path:
    """One VCBM run of `episodes` episodes with bsuite's log (every episode counts: no stop at convergence)."""
    argv = [
        *("--algo", "vcbm", "--env", f"bsuite:{experiment}/{setting}", "--seed", str(seed)),
        *("--max-episodes", str(episodes), "--log-dir", str(where), "--no-progress", "--hyperparams"),
        *("env_kwargs={integer_observations: true}", "stop_at_convergence=false"),
        *(f"warmup_transitions={warmup}", f"forced_visits={forced}"),
    ]
    errors = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(errors):
        failed = train.main(argv) != 0
    if failed:
        last = (errors.getvalue().strip().splitlines() or ["no message"])[-1]
        raise SystemExit(f"python -m algorithms.train {' '.join(argv)} failed: {last}")
    return where / "env_log"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experiment", choices=["umbrella_length", "umbrella_distract"], required=True)
    parser.add_argument("--settings", type=int, nargs="+", required=True)
    parser.add_argument("--seeds", type=int, nargs=2, metavar=("START", "N"), required=True)
    parser.add_argument("--grid", type=pair, nargs="+", required=True, metavar="WARMUP:FORCED")
    parser.add_argument("--episodes", type=int, default=SHORT_EPISODES, help="per run (default: the short protocol's)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.episodes < 1:
        parser.error(f"--episodes {args.episodes}: expected a positive number of episodes per run")
    if args.seeds[1] < 1 or args.seeds[0] < 0:
        parser.error(f"--seeds {args.seeds[0]} {args.seeds[1]}: expected a first seed >= 0 and at least one seed")
    try:
        suite.protocol_settings(args.experiment, "bsuite", indices=args.settings)
    except VcbmGymError as exc:
        parser.error(str(exc))
    seeds = range(args.seeds[0], args.seeds[0] + args.seeds[1])
    rows = []
    for warmup, forced in args.grid:
        with tempfile.TemporaryDirectory() as tmp:
            logs = {
                (setting, seed): run_one(
                    args.experiment, setting, seed, warmup, forced, args.episodes, Path(tmp) / f"{setting}_{seed}"
                )
                for setting, seed in itertools.product(args.settings, seeds)
            }
            seed_scores = [
                bsuite_score.experiment_score([logs[s, seed] for s in args.settings], args.experiment) for seed in seeds
            ]
            regret = {str(s): [average_regret(logs[s, seed]) for seed in seeds] for s in args.settings}
        rows.append({"warmup_transitions": warmup, "forced_visits": forced, "seed_scores": seed_scores, "average_regret": regret})
        mean_regret = " ".join(f"{s}: {sum(r) / len(r):.2f}" for s, r in regret.items())
        print(
            f"warm-up {warmup:5d}, forced {forced:3d}: mean seed score {sum(seed_scores) / len(seed_scores):.3f} | "
            f"average regret by setting {mean_regret}",
            flush=True,
        )
    document = {
        "experiment": args.experiment,
        "settings": args.settings,
        "seeds": list(seeds),
        "episodes": args.episodes,
        "rows": rows,
    }
    cli.atomic_write_json(args.out, document)
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
