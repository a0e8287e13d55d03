"""LLM arm throughput: rollouts per second and training tokens per second, before and after, side by side.

    python benchmarks/llm_throughput.py                      # 16 / 48 / 128 rollouts per iteration
    python benchmarks/llm_throughput.py --sizes 16 48 --pairs 3 --model tiny-random

The setting of benchmarks/llm_learning.py: LOOP (`LoopTrainer`) on TextWatchRepair-v0 with 3 turns, the
warm-started tiny model (`--model tiny`, algorithms.llm.warm_start), the zoo entry's CPU settings (4
rollouts per task, micro-batches of up to 16 rollouts, 2 optimizer steps per iteration, 8 new tokens per
turn, one torch thread). For each number of rollouts per iteration one trainer runs 1 + 2 x PAIRS
iterations; after the first (a warm-up, not counted) they alternate between the two rollout paths:

- before: `hf_generate` every turn, re-encoding each live episode's whole context (the earlier path,
  kept as `LoopTrainer.reencode_rollouts`);
- after: `CachedGeneration`, each episode's keys and values kept from one turn to the next and the
  prompt prefix that all episodes share encoded once (the default).

Alternating iterations of one trainer put both paths under the same machine load, which on a shared
machine changes from minute to minute; what is compared is the ratio. Per path and size it prints the
median over its iterations of: rollouts per second (rollouts / the rollout's wall time), training tokens
per second (the iteration's sequence tokens, prompt and completion, times the optimizer steps over them,
/ the rest of the iteration: the reference log-probs, the credit rule and the optimizer steps), and the
time per iteration. The last lines give each size's rollouts per second against the "before" path at
the smallest size (the issue's acceptance: at 48 rollouts per iteration, at least 3x that at 16).
`--json PATH` also writes the rows.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from algorithms.common import cli  # noqa: E402
from algorithms.common.errors import VcbmGymError  # noqa: E402

ENV_ID = "TextWatchRepair-v0"
TURNS = 3
K = 4  # rollouts per task (num_generations)
MICRO_BATCH = 16  # per_device_train_batch_size of the zoo entry
METHODS = ("before", "after")


def _model(name: str):
    if name == "tiny":
        from algorithms.llm.warm_start import warm_started_tiny

        return warm_started_tiny()
    from algorithms.llm.tiny import build_tiny

    return build_tiny(0)


def _trainer(name: str, rollouts: int, iterations: int, seed: int, out: str):
    import numpy as np
    from datasets import Dataset

    from algorithms.llm.config import LoopConfig
    from algorithms.llm.trainer import LoopTrainer

    model, tokenizer = _model(name)
    args = LoopConfig(
        output_dir=out,
        seed=seed,
        max_steps=iterations * 2,
        num_iterations=2,
        generation_batch_size=rollouts,
        num_generations=K,
        per_device_train_batch_size=min(rollouts, MICRO_BATCH),
        max_turns=TURNS,
        max_new_tokens_per_turn=8,
        one_shot=False,
        system_prompt="algorithms.llm.warm_start:tiny_system_prompt",
        learning_rate=3e-4,
        weight_decay=0.0,
        max_grad_norm=1.0,
        logging_steps=2,
        disable_tqdm=True,
        use_cpu=True,
    )
    seeds = np.random.default_rng(seed).integers(0, 2**31 - 1, size=max(64, rollouts // K))
    dataset = Dataset.from_dict({"prompt": [str(int(s)) for s in seeds]})
    return LoopTrainer(
        model=model,
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        env_id=ENV_ID,
        env_kwargs={"max_turns": TURNS, "noise_scale": 0.0},
    )


def measure(name: str, rollouts: int, pairs: int, seed: int = 0) -> dict[str, list[dict[str, float]]]:
    """Per method, one row per counted iteration: rollouts/s, training tokens/s, iteration time."""
    from transformers import TrainerCallback

    rows: dict[str, list[dict[str, float]]] = {m: [] for m in METHODS}

    class Alternate(TrainerCallback):
        """After each iteration (after the trainer's own metrics): record it, then switch paths."""

        def __init__(self) -> None:
            self.trainer = None
            self.count = 0

        def on_step_end(self, args, state, control, **kwargs):
            trainer = self.trainer
            if state.global_step % args.num_iterations:
                return
            method = "before" if trainer.reencode_rollouts else "after"
            last = trainer.history[-1]
            tokens = sum(len(e.prompt_ids) + len(e.completion_ids) for e in trainer._episodes) * args.num_iterations
            train_time = last["iteration_time_s"] - last["rollout_time_s"]
            if self.count > 0:  # the first iteration warms up (allocations, lazy imports)
                rows[method].append(
                    {
                        "rollouts_per_s": rollouts / last["rollout_time_s"],
                        "train_tokens_per_s": tokens / train_time,
                        "iteration_s": last["iteration_time_s"],
                        "rollout_s": last["rollout_time_s"],
                    }
                )
            self.count += 1
            trainer.reencode_rollouts = self.count % 2 == 1  # counted iterations: before, after, before, ...

    with tempfile.TemporaryDirectory() as out:
        trainer = _trainer(name, rollouts, 1 + 2 * pairs, seed, out)
        callback = Alternate()
        callback.trainer = trainer
        trainer.add_callback(callback)
        trainer.train()
    return rows


def _median(rows: list[dict[str, float]], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def run(argv: list[str]) -> dict:
    parser = cli.ArgumentParser(prog="llm_throughput.py", description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[16, 48, 128], help="rollouts per iteration")
    parser.add_argument("--pairs", type=int, default=2, help="counted iterations per path and size")
    parser.add_argument("--model", choices=("tiny", "tiny-random"), default="tiny")
    parser.add_argument("--json", help="also write the measured rows here")
    args = parser.parse_args(argv)
    bad = [n for n in args.sizes if n < K or n % K]
    if bad:
        raise VcbmGymError(f"--sizes {' '.join(map(str, bad))}: expected multiples of {K} (rollouts per task)")
    cli.check_int(args.pairs, "--pairs", 1)
    if args.json:
        target = Path(args.json)
        if target.is_dir() or not target.parent.is_dir():
            raise VcbmGymError(f"--json {args.json}: expected a file path in an existing folder")

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    import torch

    torch.set_num_threads(1)
    start = time.perf_counter()
    results = {n: measure(args.model, n, args.pairs) for n in args.sizes}
    print(
        f"{ENV_ID}, {TURNS} turns, model {args.model}, {K} rollouts per task, micro-batches of up to {MICRO_BATCH}, "
        f"1 torch thread; medians of {args.pairs} iterations per path ({time.perf_counter() - start:.0f} s in all)"
    )
    header = f"{'rollouts/iter':>13} {'path':>7} {'rollouts/s':>11} {'train tok/s':>12} {'s/iteration':>12} {'rollout s':>10}"
    print(header)
    for n, rows in results.items():
        for method in METHODS:
            r = rows[method]
            print(
                f"{n:>13} {method:>7} {_median(r, 'rollouts_per_s'):>11.1f} {_median(r, 'train_tokens_per_s'):>12.0f} "
                f"{_median(r, 'iteration_s'):>12.2f} {_median(r, 'rollout_s'):>10.2f}"
            )
    base_n = min(args.sizes)
    base = _median(results[base_n]["before"], "rollouts_per_s")
    for n, rows in results.items():
        ratio = _median(rows["after"], "rollouts_per_s") / base
        print(f"rollouts/s at {n} (after) / at {base_n} (before): {ratio:.2f}x")
    if args.json:
        cli.atomic_write_json(args.json, {str(n): rows for n, rows in results.items()})
    return results


if __name__ == "__main__":
    sys.exit(cli.main(run))
