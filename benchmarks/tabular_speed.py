"""Issue-15 speed check: this project against plain numpy loops doing the same work, side by side.

    python benchmarks/tabular_speed.py [--seeds 10] [--batched-seeds 1000] [--repeats 3]

Everything runs in this one process, on one core, and each pair of measurements alternates
(project, plain, project, plain, ...) so that load from other processes hits both sides alike; the
ratio is taken between medians of process CPU time. It prints:

1. WatchRepair env steps per second: `gym.make("WatchRepair-v0")` (wrappers included) and the
   bare `WatchRepairEnv`, against a bare numpy loop drawing the same random numbers per step.
   Target: the env at least 0.5x the bare loop's rate.
2. VCBM CPU time per seed: `algorithms.train.run` (one seed per call: env, agent, TensorBoard
   scalars, summary.json) and `vcbm_batch.run_batch` (all seeds in one batch), against
   `plain_vcbm` below, a plain per-step numpy VCBM (docs/papers/vcbm.md, "Tabular VCBM") written independently of the
   project (it draws the same random numbers, so it also reproduces the project's
   episodes-to-converge, which is checked). Target: at most 1.0x the plain loop.
3. Wall and CPU time of `--batched-seeds` VCBM seeds in one `run_batch` (target: 1,000 in <= 90 s).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import numpy as np

# ------------------------------------------------------------------------------------------------
# The plain references: straightforward per-step loops over the same constants (docs/papers/vcbm.md).

PRICE = np.array([18.0, 28.0, 31.0, 59.0])
COST_MEAN, COST_SD = np.array([1.0, 4.0, 5.0, 24.5]), np.array([2.0, 2.0, 2.0, 1.0])
TRANSPORT_MEAN, TRANSPORT_SD = np.array([0.5, 2.5, 4.5, 18.0]), 1.5
COUNTER_P, PENALTY = np.array([0.10, 0.05]), np.array([0.1, 7.0])
BRAND_CDF = np.array([0.25, 0.5, 0.75, 1.0])
OPTIMAL = [1, 0, 0, 1]
T = 50


def plain_episode(rng: np.random.Generator, actions: np.ndarray) -> float:
    """One WatchRepair episode, step by step: s = [flag, c1, c2, brand, t]."""
    s = [0, 0, 0, int(BRAND_CDF.searchsorted(rng.random(), side="right")), 0]
    total = 0.0
    for t in range(T):
        r = 0.0
        if t == 0 and actions[t] == 0:
            r -= rng.normal(COST_MEAN[s[3]], COST_SD[s[3]])
            s[0] = 1
        bumps = rng.random(2) < COUNTER_P
        s[1] += int(bumps[0])
        s[2] += int(bumps[1])
        s[4] += 1
        if s[4] == T and s[0] == 1:
            r += PRICE[s[3]] - rng.normal(TRANSPORT_MEAN[s[3]], TRANSPORT_SD) - (s[1] * PENALTY[0] + s[2] * PENALTY[1])
        total += r
    return total


def plain_vcbm(seed: int, max_episodes: int = 20_000) -> int | None:
    """Tabular VCBM (docs/papers/vcbm.md) in one plain loop; returns episodes to converge (750-window, 95%)."""
    import gymnasium as gym  # only for the seeding convention env.reset(seed=k) uses

    env_rng = gym.utils.seeding.np_random(seed)[0]
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0x7AB]))
    changes = np.zeros((5, 2), dtype=np.int64)
    taken = np.zeros(2, dtype=np.int64)
    pre_change = [set() for _ in range(5)]
    contexts, ctx_idx, key_idx, roles = set(), [], [], None
    values = {}  # (key, action) -> [n, mean, m2]
    window, correct_in_window, transitions = [], 0, 0
    for episode in range(max_episodes):
        s = [0, 0, 0, int(BRAND_CDF.searchsorted(env_rng.random(), side="right")), 0]
        visits, ret, first = [], 0.0, None
        for t in range(T):
            a = None
            if contexts and tuple(s[i] for i in ctx_idx) in contexts:
                key = tuple(s[i] for i in key_idx)
                w0, w1 = values.setdefault((key, 0), [0, 0.0, 0.0]), values.setdefault((key, 1), [0, 0.0, 0.0])
                if min(w0[0], w1[0]) < 60:
                    a = (0 if w0[0] < w1[0] else 1) if w0[0] != w1[0] else int(rng.integers(2))
                else:
                    se0, se1 = np.sqrt(w0[2] / (w0[0] * (w0[0] - 1))), np.sqrt(w1[2] / (w1[0] * (w1[0] - 1)))
                    se, diff = np.sqrt(se0**2 + se1**2), abs(w0[1] - w1[1])
                    z = (np.inf if diff > 0 else 0.0) if se == 0 else diff / se
                    eps = 0.005 if z > 2.0 else max(0.005, 0.2 * 0.995**episode)
                    a = int(rng.integers(2)) if rng.random() < eps or w0[1] == w1[1] else (0 if w0[1] > w1[1] else 1)
                visits.append((key, a))
            if a is None:
                a = int(rng.integers(2))
            first = a if t == 0 else first
            nxt = list(s)
            if t == 0 and a == 0:
                ret -= env_rng.normal(COST_MEAN[s[3]], COST_SD[s[3]])
                nxt[0] = 1
            bumps = env_rng.random((1, 2)) < COUNTER_P
            nxt[1] += int(bumps[0, 0])
            nxt[2] += int(bumps[0, 1])
            nxt[4] += 1
            if nxt[4] == T and nxt[0] == 1:
                ret += (
                    PRICE[s[3]] - env_rng.normal(TRANSPORT_MEAN[s[3]], TRANSPORT_SD) - (nxt[1] * PENALTY[0] + nxt[2] * PENALTY[1])
                )
            taken[a] += 1
            for i in range(5):
                if s[i] != nxt[i]:
                    changes[i, a] += 1
                    pre_change[i].add(tuple(s))
            transitions += 1
            if transitions >= 2000 and transitions % 500 == 0:  # Eq. 9-10 roles, then the contexts
                n0, n1 = taken
                roles = []
                for i in range(5):
                    p = (changes[i, 0] + changes[i, 1]) / (n0 + n1)
                    var = p * (1 - p) * (1 / n0 + 1 / n1)
                    z = abs(changes[i, 0] / n0 - changes[i, 1] / n1) / np.sqrt(var) if var > 0 else 0.0
                    if min(changes[i, 0] / n0, changes[i, 1] / n1) > 0.9:
                        roles.append("clock")
                    elif changes[i].sum() == 0:
                        roles.append("static")
                    else:
                        roles.append("controlled" if z > 4.0 else "noise")
                ctx_idx = [i for i, r in enumerate(roles) if r in ("controlled", "clock")]
                key_idx = [i for i, r in enumerate(roles) if r != "noise"]
                contexts = {
                    tuple(st[j] for j in ctx_idx) for i, r in enumerate(roles) if r == "controlled" for st in pre_change[i]
                }
            s = nxt
        for key_action in visits:  # Welford (Eq. 11)
            w = values[key_action]
            w[0] += 1
            delta = ret - w[1]
            w[1] += delta / w[0]
            w[2] += delta * (ret - w[1])
        ok = first == OPTIMAL[s[3]]
        window.append(ok)
        correct_in_window += ok
        if len(window) > 750:
            correct_in_window -= window.pop(0)
        if len(window) == 750 and correct_in_window / 750 >= 0.95:
            return episode + 1
    return None


# ------------------------------------------------------------------------------------------------


def cpu(fn, *args):
    start = time.process_time()
    out = fn(*args)
    return time.process_time() - start, out


def env_steps(episodes: int) -> tuple[float, float, float]:
    """CPU seconds for `episodes` episodes: gym.make env, bare env, bare numpy loop (same actions)."""
    import gymnasium as gym

    import vcbm_gym  # noqa: F401
    from envs.watch_repair import WatchRepairEnv

    actions = np.random.default_rng(0).integers(0, 2, size=(episodes, T))

    def run_env(env):
        env.reset(seed=0)
        for row in actions.tolist():
            env.reset()
            for a in row:
                env.step(a)

    def run_plain():
        rng = np.random.default_rng(0)
        for row in actions:
            plain_episode(rng, row)

    made = gym.make("WatchRepair-v0")
    return cpu(run_env, made)[0], cpu(run_env, WatchRepairEnv())[0], cpu(run_plain)[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10, help="seeds for the per-seed VCBM comparison")
    parser.add_argument("--batched-seeds", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--env-episodes", type=int, default=2000)
    args = parser.parse_args()

    from algorithms.tabular.vcbm_batch import run_batch
    from algorithms.train import run

    steps = args.env_episodes * T
    made, bare, plain = zip(*(env_steps(args.env_episodes) for _ in range(args.repeats)))
    made, bare, plain = statistics.median(made), statistics.median(bare), statistics.median(plain)
    print(
        f"env steps/s (CPU): gym.make {steps / made:,.0f}   bare env {steps / bare:,.0f}   bare numpy loop {steps / plain:,.0f}"
    )
    print(
        f"  ratio gym.make / bare loop = {plain / made:.2f}x rate   "
        f"bare env / bare loop = {plain / bare:.2f}x rate   (target >= 0.5x)"
    )

    seeds = list(range(args.seeds))
    single, batched, reference = [], [], []
    project_eps, plain_eps = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        # warm-up: the first train.run imports the runner and the event-file protobufs
        run(
            [
                "--algo",
                "vcbm",
                "--env",
                "WatchRepair-v0",
                "--seed",
                "0",
                "--log-dir",
                f"{tmp}/w",
                "--no-progress",
                "--max-episodes",
                "3",
            ]
        )
        for repeat in range(args.repeats):  # seed by seed, project then plain, so both see the same load
            single.append(0.0)
            reference.append(0.0)
            for k in seeds:
                argv = [
                    "--algo",
                    "vcbm",
                    "--env",
                    "WatchRepair-v0",
                    "--seed",
                    str(k),
                    "--log-dir",
                    f"{tmp}/r{repeat}/s{k}",
                    "--no-progress",
                ]
                t, summary = cpu(run, argv)
                single[-1] += t
                project_eps[k] = summary["episodes_to_converge"]
                t, plain_eps[k] = cpu(plain_vcbm, k)
                reference[-1] += t
            t, batch_out = cpu(run_batch, seeds)
            batched.append(t)
    n = len(seeds)
    single, batched, reference = (statistics.median(x) / n for x in (single, batched, reference))
    project_eps, plain_eps = [project_eps[k] for k in seeds], [plain_eps[k] for k in seeds]
    same = project_eps == plain_eps == [s["episodes_to_converge"] for s in batch_out]
    print(
        f"VCBM CPU per seed ({n} seeds, median of {args.repeats}): train.run {single:.3f} s   "
        f"run_batch {batched:.3f} s   plain loop {reference:.3f} s"
    )
    print(
        f"  ratio train.run / plain = {single / reference:.2f}x   "
        f"run_batch / plain = {batched / reference:.2f}x   (target <= 1.0x)"
    )
    print(f"  episodes-to-converge identical in all three: {same} ({project_eps})")

    if args.batched_seeds:
        wall, start = time.perf_counter(), time.process_time()
        out = run_batch(range(args.batched_seeds), batch_size=args.batched_seeds)
        cpu_s, wall = time.process_time() - start, time.perf_counter() - wall
        converged = [s["episodes_to_converge"] for s in out if s["converged"]]
        print(
            f"{args.batched_seeds} batched VCBM seeds: wall {wall:.1f} s, CPU {cpu_s:.1f} s (target <= 90 s on one core); "
            f"converged {len(converged)}, median {statistics.median(converged):g}"
        )


if __name__ == "__main__":
    main()
