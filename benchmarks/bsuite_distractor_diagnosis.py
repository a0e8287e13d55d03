"""Why PPO learns bsuite's umbrella_length slowly: the same PPO with and without the distractor bits.

    python benchmarks/bsuite_distractor_diagnosis.py [--seeds 200 201 202 203] [--workers 2]

Plain SB3 PPO on bsuite's own umbrella_length/3 (chain 4, 20 distractor bits; the integer observation view the
sweeps use), 1,000 episodes (the short protocol's budget), with two PPO entries from
benchmarks/bsuite_baselines_pilot.py: round 8's (32-step rollouts in minibatches of 8) and round 11's choice
(128-step rollouts in minibatches of 32). Each is run on the env as it is, and with `ZeroDistractors`, which sets the
distractor bits to 0 in every observation and leaves everything else (the need and umbrella bits, the time, the
coin-flip rewards) as bsuite draws it. The measure: the rate of optimal first decisions over the whole run (bsuite's
regret per episode is about twice the rate of wrong ones), per seed and its mean. Seeds outside the pilot's (100-105)
and the scored check's (0-2). SB3 is driven directly (not algorithms.train), so single runs differ from the zoo's
runs of the same seed; the comparison is between the two observations under one driver.

Writes benchmarks/results/bsuite_distractor_diagnosis.json. About 15 s of one core per run: 16 runs, ~2 minutes on
2 workers.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import bsuite_baselines_pilot as pilot  # noqa: E402

from algorithms.common import cli, provenance  # noqa: E402
from algorithms.experiment import executor  # noqa: E402

BSUITE_ID = "umbrella_length/3"
EPISODES = 1_000
ENTRIES = {
    "round 8 (n32-b8)": pilot.PPO_B8_MGN100,
    "round 11 (n128-b32)": pilot.ROUND_11["ppo"]["n128-b32-e10-lr1e-3-l1-mgn100"],
}
VIEWS = ("as bsuite draws it", "distractors zeroed")
UMBRELLA_LEADING_COMPONENTS = 3  # need umbrella, has umbrella, time; the distractor bits follow


class ZeroDistractors(gym.ObservationWrapper):
    """umbrella's integer observation with every distractor bit set to 0 (the other components untouched)."""

    def observation(self, observation: np.ndarray) -> np.ndarray:
        hidden = np.array(observation, copy=True)
        hidden[UMBRELLA_LEADING_COMPONENTS:] = 0
        return hidden


def optimal_first_decision_rate(job: tuple[str, str, int]) -> float:
    """One run: PPO with the named entry on the named view for EPISODES episodes; its rate of optimal first decisions."""
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback

    from envs.bsuite import BSuiteEnv

    entry, view, seed = job
    env: gym.Env = BSuiteEnv(BSUITE_ID, integer_observations=True)
    if view == VIEWS[1]:
        env = ZeroDistractors(env)
    outcomes: list[bool] = []

    class RecordFirstDecisions(BaseCallback):
        def _on_step(self) -> bool:
            for done, info in zip(self.locals["dones"], self.locals["infos"], strict=True):
                if done:
                    outcomes.append(bool(info["first_decision_optimal"]))
            return len(outcomes) < EPISODES

    model = PPO("MlpPolicy", env, seed=seed, verbose=0, **ENTRIES[entry])
    model.learn(EPISODES * env.unwrapped.episode_steps, callback=RecordFirstDecisions())
    return sum(outcomes) / len(outcomes)


def run(argv: list[str]) -> None:
    parser = cli.ArgumentParser(prog="python benchmarks/bsuite_distractor_diagnosis.py", description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[200, 201, 202, 203])
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)
    cli.check_int(args.workers, "--workers", 0)
    for seed in args.seeds:
        cli.check_seed(seed, "--seeds")
    started = provenance.start()
    jobs = [(entry, view, seed) for entry in ENTRIES for view in VIEWS for seed in args.seeds]
    rates: dict[tuple[str, str, int], float] = {}
    failures: list[str] = []

    def finished(job: tuple[str, str, int], rate: float | None, error: str | None) -> None:
        if error is not None:
            failures.append(f"{job}: {error}")
        else:
            rates[job] = rate

    executor.run_jobs(optimal_first_decision_rate, jobs, workers=args.workers, finished=finished)
    if failures:
        raise RuntimeError(f"{len(failures)} run(s) failed: {failures[0]}")
    report: dict[str, Any] = {"bsuite_id": BSUITE_ID, "episodes": EPISODES, "seeds": args.seeds, "entries": {}}
    for entry, settings in ENTRIES.items():
        report["entries"][entry] = {"settings": settings}
        for view in VIEWS:
            per_seed = [rates[(entry, view, seed)] for seed in args.seeds]
            report["entries"][entry][view] = {"per_seed": per_seed, "mean": statistics.fmean(per_seed)}
            shown = ", ".join(f"{rate:.3f}" for rate in per_seed)
            print(f"{entry:20s} {view:20s} mean {statistics.fmean(per_seed):.3f}  ({shown})")
    report["run"] = provenance.run_record("benchmarks/bsuite_distractor_diagnosis.py", argv, started)
    cli.atomic_write_text(REPO / "benchmarks/results/bsuite_distractor_diagnosis.json", json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    sys.exit(cli.main(run))
