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
import io
import sys
import tempfile
from pathlib import Path

from algorithms.common import cli
from algorithms.common.errors import VcbmGymError
from algorithms.experiment import suite

SHORT_EPISODES = 1_000  # the short protocol's budget per setting


def pair(text: str) -> tuple[int, int]:
    warmup, _, forced = text.partition(":")
    if not (warmup.isdigit() and forced.isdigit()):
        raise argparse.ArgumentTypeError(f"{text!r}: expected WARMUP:FORCED, two non-negative integers, e.g. 100:8")
    return int(warmup), int(forced)


def sweep(experiment: str, settings: list[int], seeds: range, episodes: int, warmup: int, forced: int, out: Path):
    """One (warm-up, forced visits) pair through `algorithms.suite` (every episode counts, bsuite's own scorer): each
    seed's bsuite score and, per setting, each seed's whole-run regret per episode."""
    argv = [
        *("--experiment", experiment, "--algos", "vcbm", "--settings", *map(str, settings), "--episodes", str(episodes)),
        *("--seeds", str(len(seeds)), "--seed-start", str(seeds.start), "--workers", "0", "--no-progress", "--out", str(out)),
        *("--hyperparams", "env_kwargs={integer_observations: true}", f"warmup_transitions={warmup}", f"forced_visits={forced}"),
    ]
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):  # the suite's table
        results = suite.run(argv)
    seed_scores = results["experiments"][experiment]["algos"]["vcbm"]["seed_scores"]
    regret: dict[str, list[float]] = {str(setting): [] for setting in settings}
    for seed in seeds:
        for row in suite.setting_table(sorted(out.glob(f"runs/vcbm/*/seed{seed}/env_log"))):
            regret[row["bsuite_id"].partition("/")[2]].append(row["mean"])
    return seed_scores, regret


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
            seed_scores, regret = sweep(args.experiment, args.settings, seeds, args.episodes, warmup, forced, Path(tmp))
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
