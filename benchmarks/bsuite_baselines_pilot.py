"""Pilot for the SB3 baselines' bsuite zoo entries: candidate settings of ppo, a2c and dqn on umbrella_length, chosen on
settings and seeds outside the scored sweeps (chain lengths 2, 5 and 8; seeds 100-101; the short protocol scores chains
1, 3, 6 and 10 on seeds 0-2), at the short protocol's budget (1,000 episodes per setting).

    python benchmarks/bsuite_baselines_pilot.py --round N [--out runs/bsuite_pilot] [--workers 2]

The measure: the rate of optimal first decisions (`final_correct_rate`, the env's `first_decision_optimal`) over
the last 200 episodes (round 1) or over the whole run (round 2: what bsuite's regret, averaged over every episode,
rewards), mean over settings and seeds, and the worst setting's mean. Writes
benchmarks/results/bsuite_baselines_pilot_round<N>.json; the candidate chosen for each algo (the best mean) goes to
zoo_configs/<algo>.yml by hand, with this file named there.

Round 1's choices learned (0.76 ppo, 0.87 dqn over the last 200 episodes) but too slowly for bsuite's regret: the
short sweep of umbrella_length then gave regret 0.65-1.0 (ppo) and 0.54-0.72 (dqn). Round 2 measures the whole run
and tries settings that update more often, still on the same held-out settings and seeds.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from algorithms.common import cli, provenance  # noqa: E402
from algorithms.experiment.jobs import seed_jobs, train_jobs  # noqa: E402
from algorithms.train import resolve_spec  # noqa: E402

SETTINGS = (1, 4, 7)  # umbrella_length indices: chain lengths 2, 5, 8 (the short protocol scores 0, 2, 5, 9)
SEEDS = range(100, 102)
EPISODES = 1_000
WINDOWS = {1: 200, 2: EPISODES}  # round -> the episodes the measured rate covers
ROUND_1: dict[str, dict[str, dict[str, Any]]] = {
    "ppo": {
        "n32-lr1e-3": {"n_steps": 32, "batch_size": 32, "n_epochs": 4, "learning_rate": 1e-3, "ent_coef": 0.01},
        "n128-lr3e-4": {"n_steps": 128, "batch_size": 64, "n_epochs": 10, "learning_rate": 3e-4, "ent_coef": 0.01},
        "n64-lr1e-3-g1": {"n_steps": 64, "batch_size": 64, "n_epochs": 4, "learning_rate": 1e-3, "ent_coef": 0.01, "gamma": 1.0},
    },
    "a2c": {
        "n8-lr1e-3": {"n_steps": 8, "learning_rate": 1e-3, "ent_coef": 0.01},
        "n32-lr7e-4-g1": {"n_steps": 32, "learning_rate": 7e-4, "ent_coef": 0.01, "gamma": 1.0},
    },
    "dqn": {
        "ls100-tu100": {
            "learning_starts": 100, "buffer_size": 20_000, "batch_size": 32, "learning_rate": 1e-3,
            "target_update_interval": 100, "exploration_fraction": 0.2, "exploration_final_eps": 0.02, "train_freq": 1,
        },
        "ls500-tu250-g1": {
            "learning_starts": 500, "buffer_size": 20_000, "batch_size": 64, "learning_rate": 5e-4,
            "target_update_interval": 250, "exploration_fraction": 0.3, "exploration_final_eps": 0.02, "train_freq": 1,
            "gamma": 1.0,
        },
    },
}  # fmt: skip
ROUND_2: dict[str, dict[str, dict[str, Any]]] = {
    "ppo": {
        "n64-lr1e-3-g1": ROUND_1["ppo"]["n64-lr1e-3-g1"],
        "n16-e10-lr3e-3": {"n_steps": 16, "batch_size": 16, "n_epochs": 10, "learning_rate": 3e-3, "gamma": 1.0},
        "n32-e10-lr1e-3": {"n_steps": 32, "batch_size": 32, "n_epochs": 10, "learning_rate": 1e-3, "gamma": 1.0},
    },
    "a2c": {
        "n8-lr1e-3": ROUND_1["a2c"]["n8-lr1e-3"],
        "n4-lr3e-3-g1": {"n_steps": 4, "learning_rate": 3e-3, "gamma": 1.0},
    },
    "dqn": {
        "ls500-tu250-g1": ROUND_1["dqn"]["ls500-tu250-g1"],
        "ls100-tu50-e0.1-g1": {
            "learning_starts": 100, "buffer_size": 20_000, "batch_size": 32, "learning_rate": 1e-3,
            "target_update_interval": 50, "exploration_fraction": 0.1, "exploration_final_eps": 0.01, "train_freq": 1,
            "gamma": 1.0,
        },
        "ls100-tu50-e0.1-g1-gs4": {
            "learning_starts": 100, "buffer_size": 20_000, "batch_size": 32, "learning_rate": 1e-3,
            "target_update_interval": 50, "exploration_fraction": 0.1, "exploration_final_eps": 0.01, "train_freq": 1,
            "gradient_steps": 4, "gamma": 1.0,
        },
    },
}  # fmt: skip
ROUNDS = {1: ROUND_1, 2: ROUND_2}
VIEW = {"env_kwargs": {"integer_observations": True}}  # the view every algo of the sweeps sees


def run(argv: list[str]) -> None:
    parser = cli.ArgumentParser(prog="python benchmarks/bsuite_baselines_pilot.py", description=__doc__.splitlines()[0])
    parser.add_argument("--round", type=int, choices=sorted(ROUNDS), required=True)
    parser.add_argument("--out", default="runs/bsuite_pilot")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)
    out = cli.check_output_dir(args.out, "--out") / f"round{args.round}"
    candidates_of = ROUNDS[args.round]
    common = {"stop_at_convergence": False, "convergence_window": WINDOWS[args.round], "max_episodes": EPISODES}
    started = provenance.start()
    jobs, cells = [], {}
    for algo, candidates in candidates_of.items():
        for name, settings in candidates.items():
            for index in SETTINGS:
                env = f"bsuite:umbrella_length/{index}"
                spec = resolve_spec(algo, env, SEEDS[0], {**common, **VIEW, **settings})
                where = out / algo / name / f"umbrella_length-{index}"
                cell = seed_jobs(f"{algo} {name}", spec, SEEDS, lambda s, w=where: w / f"seed{s}")
                cells[(algo, name, index)] = cell
                jobs += cell
    summaries = train_jobs(jobs, args.workers, progress=False)
    report: dict[str, Any] = {
        "round": args.round, "settings": list(SETTINGS), "seeds": list(SEEDS), "episodes": EPISODES,
        "rate_over_last_episodes": WINDOWS[args.round], "candidates": {},
    }  # fmt: skip
    for algo, candidates in candidates_of.items():
        for name, settings in candidates.items():
            per_setting = {
                index: [summaries[job]["final_correct_rate"] for job in cells[(algo, name, index)]] for index in SETTINGS
            }
            means = [sum(v) / len(v) for v in per_setting.values()]
            report["candidates"][f"{algo} {name}"] = {
                "settings": settings,
                "final_correct_rate": {f"umbrella_length/{i}": v for i, v in per_setting.items()},
                "mean": sum(means) / len(means),
                "worst_setting_mean": min(means),
            }
            print(f"{algo:4s} {name:16s} mean {sum(means) / len(means):.3f}  worst {min(means):.3f}")
    report["run"] = provenance.run_record("benchmarks/bsuite_baselines_pilot.py", argv, started)
    path = REPO / f"benchmarks/results/bsuite_baselines_pilot_round{args.round}.json"
    cli.atomic_write_text(path, json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    sys.exit(cli.main(run))
