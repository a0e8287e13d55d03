"""Credit-assignment overhead of LOOP / VCBM-LOOP (docs/papers/vcbm.md; target: < 1% of an iteration).

1. Trains the tiny CPU setting of `vcbm-loop` on TextWatchRepair-v0 for a few iterations and
   prints the credit computation time (episode batch, LOO, memory update, Eq. 12-14 weights) as a
   fraction of the measured iteration time, side by side.
2. Times the credit computation for a paper-sized batch: 48 rollouts (8 tasks x 6) of 20 turns,
   10 bookmarks each, with 10,000 memories already stored, and prints it against the same
   measured iteration time (a 7B-model AppWorld iteration is minutes, so this is conservative).

    python benchmarks/credit_overhead.py [--iterations 3] [--repeats 20] [--rollouts 48]
"""

from __future__ import annotations

import argparse
import tempfile
import time

import numpy as np

from vcbm_gym.credit.base import EpisodeBatch
from vcbm_gym.credit.vcbm_blend import VCBMBlendRule, _cached_embed, hash_embed

WORDS = "user account balance updated payment sent file created note song playlist added removed id status ok".split()


def paper_sized_batch(rng: np.random.Generator, tasks=8, k=6, turns=20, gen_tokens=60, env_tokens=200, bookmarks=10):
    width = turns * (gen_tokens + env_tokens)
    b = tasks * k
    step_turn = np.tile(np.repeat(np.arange(turns), gen_tokens + env_tokens), (b, 1))
    mask = np.tile(np.tile([True] * gen_tokens + [False] * env_tokens, turns), (b, 1))
    rewards = np.zeros((b, width))
    rewards[:, np.flatnonzero(mask[0])[-1]] = rng.random(b)
    flags, texts = [], []
    for _ in range(b):
        f = np.zeros(turns, bool)
        f[rng.choice(turns, bookmarks, replace=False)] = True
        flags.append(f)
        texts.append([" ".join(rng.choice(WORDS, 50)) + f" {rng.integers(1e6)}" for _ in range(turns)])
    return EpisodeBatch(
        rewards=rewards,
        mask=mask,
        group_ids=np.repeat(np.arange(tasks), k),
        step_turn=step_turn,
        turn_flags={"state_mutating": flags},
        turn_texts=texts,
        final_texts=[" ".join(rng.choice(WORDS, 80)) for _ in range(b)],
    )


def credit_step(rule: VCBMBlendRule, batch: EpisodeBatch) -> np.ndarray:
    """What LoopTrainer.token_advantages does per iteration (single process)."""
    advantages = rule.advantages(batch)
    rule.observe(batch)  # at the end of a kept iteration
    return advantages


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--rollouts", type=int, default=8, help="rollouts per tiny iteration (48 = the paper's; K = 4)")
    args = parser.parse_args()

    from algorithms.train import run

    with tempfile.TemporaryDirectory() as log_dir:
        summary = run(
            [
                "--algo",
                "vcbm-loop",
                "--env",
                "TextWatchRepair-v0",
                "--model",
                "tiny",
                "--no-progress",
                "--iterations",
                str(args.iterations),
                "--log-dir",
                log_dir,
                "--hyperparams",
                f"generation_batch_size={args.rollouts}",
                "num_generations=4",
                "per_device_train_batch_size=4",
            ]
        )
    iteration_s, credit_s = summary["mean_iteration_time_s"], summary["mean_credit_time_s"]
    print(
        f"tiny CPU iteration (TextWatchRepair-v0, {args.rollouts} rollouts): {iteration_s:.3f} s; credit {credit_s * 1e3:.2f} ms "
        f"-> {100 * credit_s / iteration_s:.3f}% of the iteration (target < 1%)"
    )

    rng = np.random.default_rng(0)
    rule = VCBMBlendRule(beta=1.0, tau=0.5, top_k=6, alpha=0.05, memory_capacity=10_000)
    rule.memory.add(rng.integers(0, 50, 10_000), np.stack([hash_embed(str(i)) for i in range(10_000)]), rng.random(10_000))
    batch = paper_sized_batch(rng)
    times = []
    for _ in range(args.repeats):
        _cached_embed.cache_clear()  # every iteration brings new execution outputs
        start = time.perf_counter()
        credit_step(rule, batch)
        times.append(time.perf_counter() - start)
    median = float(np.median(times))
    print(
        f"48-rollout batch (20 turns, 10 bookmarks each, {batch.rewards.shape[1]} tokens wide), "
        f"{len(rule.memory)} stored memories (capacity 10,000): credit {median * 1e3:.1f} ms (median of {args.repeats}) "
        f"-> {100 * median / iteration_s:.2f}% of the tiny CPU iteration above"
    )


if __name__ == "__main__":
    main()
