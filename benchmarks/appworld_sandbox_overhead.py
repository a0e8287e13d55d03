"""What the AppWorld sandbox costs per `step`: the same episodes with and without it.

    python benchmarks/appworld_sandbox_overhead.py [--rounds 3] [--root DIR]

Plays every dev task's reference cells (synthetic data, `python -m envs.appworld.setup`) plus a
trivial `print(1)` step per task, `--rounds` times, once through the bubblewrap sandbox and once
unsandboxed (`trusted_code=True`), interleaved so machine load hits both alike, and prints the
median time per step of each and their ratio. Evaluation time (at episode end) is counted
separately, since it runs in the evaluator either way.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from envs.appworld.env import AppWorldEnv
from envs.appworld.pool import AppWorldServerPool, default_root, default_venv


def play(env: AppWorldEnv, root: Path, task_ids: list[str]) -> tuple[list[float], list[float]]:
    steps, evaluations = [], []
    for task_id in task_ids:
        cells = json.loads((root / "data" / "tasks" / task_id / "ground_truth" / "solution_cells.json").read_text())
        env.reset(options={"task_id": task_id})
        for cell in ["print(1)", *cells]:
            start = time.perf_counter()
            _, _, terminated, truncated, info = env.step(cell)
            elapsed = time.perf_counter() - start
            if terminated or truncated:
                evaluations.append(elapsed)  # the last step also runs the evaluator
                break
            steps.append(elapsed)
    return steps, evaluations


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--root", type=Path, default=None, help="data root (default $VCBM_APPWORLD_ROOT)")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error(f"--rounds must be >= 1, got {args.rounds}")
    root = args.root or default_root()
    times: dict[str, tuple[list[float], list[float]]] = {"sandbox": ([], []), "no sandbox": ([], [])}
    pools = {
        "sandbox": AppWorldServerPool(1, default_venv(), root),
        "no sandbox": AppWorldServerPool(1, default_venv(), root, trusted_code=True),
    }
    try:
        envs = {name: AppWorldEnv(split="dev", server_pool=pool) for name, pool in pools.items()}
        task_ids = envs["sandbox"].task_ids("dev")
        for _ in range(args.rounds):
            for name, env in envs.items():
                steps, evaluations = play(env, root, task_ids)
                times[name][0].extend(steps)
                times[name][1].extend(evaluations)
    finally:
        for pool in pools.values():
            pool.close()
    step = {name: statistics.median(value[0]) * 1e3 for name, value in times.items()}
    final = {name: statistics.median(value[1]) * 1e3 for name, value in times.items()}
    print(f"{'':28}{'sandbox':>12}{'no sandbox':>12}{'ratio':>8}")
    print(f"{'median step (ms)':28}{step['sandbox']:12.1f}{step['no sandbox']:12.1f}{step['sandbox'] / step['no sandbox']:8.2f}")
    print(
        f"{'median last step + eval (ms)':28}{final['sandbox']:12.1f}{final['no sandbox']:12.1f}"
        f"{final['sandbox'] / final['no sandbox']:8.2f}"
    )
    print(f"steps timed: {len(times['sandbox'][0])} per setting, {len(task_ids)} dev tasks x {args.rounds} rounds")


if __name__ == "__main__":
    main()
