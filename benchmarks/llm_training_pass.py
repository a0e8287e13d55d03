"""The LLM arm's training pass: TRL's (every row's prompt encoded again) against shared prompts, side by side.

    python benchmarks/llm_training_pass.py                         # 48 / 96 / 192 rollouts per iteration
    python benchmarks/llm_training_pass.py --sizes 48 --repeats 3 --model tiny-random

The setting of benchmarks/llm_learning.py's TextWatchRepair rows: LOOP (`LoopTrainer`) with 2 turns,
K = 8 rollouts per task, the whole generation batch in one micro-batch, the warm-started tiny model
(`--model tiny`), one torch thread. Per size, one iteration is played and its training batch kept (the
inputs of `_compute_loss`); then, `--repeats` times and alternating which goes first, each path computes
the batch's per-token log-probs with gradients and back-propagates a loss over them (what one optimizer
step costs), and computes them once more without gradients (the old-policy pass of a second epoch):

- TRL: `GRPOTrainer._get_per_token_logps_and_entropies`, the model over [prompt, completion] of every row;
- shared: the trainers' override (algorithms.llm.training.shared_prefix.SharedPromptLogps), each distinct prompt
  encoded once.

Printed per size: the batch's tokens (all rows, prompt and completion), the medians of each path's
seconds, the ratio TRL / shared, and the largest difference between the two paths' log-probs and between
their gradients (they compute the same function). `--json PATH` also writes the rows, `--markdown PATH`
the printed report.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from algorithms.common import cli  # noqa: E402
from algorithms.common.provenance import (  # noqa: E402
    add_report_arguments,
    check_report_files,
    measured_report,
)

ENV_ID = "TextWatchRepair-v0"
TURNS = 2
K = 8
PATHS = ("trl", "shared")


def captured_batch(model_name: str, rollouts: int, out: str):
    """(trainer, the inputs `_compute_loss` received) after one iteration of LOOP at this size."""
    import numpy as np
    from datasets import Dataset

    from algorithms.llm.config import LoopConfig
    from algorithms.llm.training.loop import LoopTrainer

    class Capture(LoopTrainer):
        shared = True  # False: TRL's pass

        def _can_share_prompts(self, model, extra_inputs):
            return self.shared and super()._can_share_prompts(model, extra_inputs)

        def _compute_loss(self, model, inputs):
            self.captured = inputs
            return super()._compute_loss(model, inputs)

    from algorithms.llm.build import model_and_tokenizer

    model, tokenizer = model_and_tokenizer(model_name, seed=0, bf16=False)
    args = LoopConfig(
        output_dir=out,
        seed=0,
        max_steps=1,
        num_iterations=1,
        generation_batch_size=rollouts,
        num_generations=K,
        per_device_train_batch_size=rollouts,
        max_turns=TURNS,
        max_new_tokens_per_turn=8,
        one_shot=False,
        system_prompt="algorithms.llm.generation.prompting:tiny_system_prompt",
        learning_rate=0.0,
        disable_tqdm=True,
        use_cpu=True,
    )
    seeds = np.random.default_rng(0).integers(0, 2**31 - 1, size=max(64, rollouts // K))
    trainer = Capture(
        model=model,
        args=args,
        train_dataset=Dataset.from_dict({"prompt": [str(int(s)) for s in seeds]}),
        processing_class=tokenizer,
        env_id=ENV_ID,
        env_kwargs={"max_turns": TURNS, "noise_scale": 1.0},
    )
    trainer.train()
    return trainer, trainer.captured


def one_pass(trainer, inputs, shared: bool) -> tuple[float, float, Any, dict]:
    """(seconds with gradients and backward, seconds without gradients, log-probs, gradients) on one path."""
    import torch

    trainer.shared = shared
    model = trainer.model
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    keep = inputs["completion_ids"].size(1)
    weights = inputs["completion_mask"].float() * inputs["advantages"]
    model.zero_grad(set_to_none=True)
    start = time.perf_counter()
    logps = trainer._get_per_token_logps_and_entropies(model, ids, mask, keep)[0]
    (logps * weights).sum().backward()
    with_grad = time.perf_counter() - start
    start = time.perf_counter()
    with torch.no_grad():
        trainer._get_per_token_logps_and_entropies(model, ids, mask, keep)
    without = time.perf_counter() - start
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return with_grad, without, logps.detach(), grads


def measure(model_name: str, rollouts: int, repeats: int) -> dict:
    import torch

    with tempfile.TemporaryDirectory() as out:
        trainer, inputs = captured_batch(model_name, rollouts, out)
        times = {path: {"grad": [], "no_grad": []} for path in PATHS}
        results = {}
        for r in range(repeats):
            order = PATHS if r % 2 == 0 else PATHS[::-1]
            for path in order:
                grad_s, no_grad_s, logps, grads = one_pass(trainer, inputs, path == "shared")
                times[path]["grad"].append(grad_s)
                times[path]["no_grad"].append(no_grad_s)
                results[path] = (logps, grads)
        on = inputs["completion_mask"].bool()
        logp_gap = (results["trl"][0] - results["shared"][0])[on].abs().max().item()
        grad_gap = max((results["trl"][1][n] - g).abs().max().item() for n, g in results["shared"][1].items())
        grad_scale = max(g.abs().max().item() for g in results["trl"][1].values())
        tokens = int(torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1).sum())
    row = {"rollouts": rollouts, "tokens": tokens, "max_logprob_gap": logp_gap, "max_grad_gap": grad_gap, "max_grad": grad_scale}
    for path in PATHS:
        row[f"{path}_grad_s"] = statistics.median(times[path]["grad"])
        row[f"{path}_no_grad_s"] = statistics.median(times[path]["no_grad"])
    return row


def report(rows: list[dict], seconds: float) -> list[str]:
    lines = [
        f"{'rollouts':>8} {'tokens':>7} {'TRL s':>7} {'shared s':>9} {'ratio':>6} {'TRL s no-grad':>14} {'shared s':>9} "
        f"{'ratio':>6} {'max |logp gap|':>15} {'max |grad gap| / max |grad|':>28}"
    ]
    for r in rows:
        lines.append(
            f"{r['rollouts']:>8} {r['tokens']:>7} {r['trl_grad_s']:>7.3f} {r['shared_grad_s']:>9.3f} "
            f"{r['trl_grad_s'] / r['shared_grad_s']:>5.2f}x {r['trl_no_grad_s']:>14.3f} {r['shared_no_grad_s']:>9.3f} "
            f"{r['trl_no_grad_s'] / r['shared_no_grad_s']:>5.2f}x {r['max_logprob_gap']:>15.2e} "
            f"{r['max_grad_gap'] / max(r['max_grad'], 1e-30):>28.2e}"
        )
    lines.append(f"(medians; one torch thread; {seconds:.0f} s in all)")
    return lines


def run(argv: list[str]) -> list[dict]:
    parser = cli.ArgumentParser(prog="llm_training_pass.py", description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[48, 96, 192], help="rollouts per iteration")
    parser.add_argument("--repeats", type=int, default=5, help="timed passes per path and size")
    parser.add_argument("--model", choices=("tiny", "tiny-random"), default="tiny")
    add_report_arguments(parser)
    args = parser.parse_args(argv)
    cli.check_multiples(args.sizes, "--sizes", K, "rollouts per task")
    cli.check_int(args.repeats, "--repeats", 1)
    check_report_files(args.json, args.markdown)

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    import torch

    torch.set_num_threads(1)
    return measured_report(
        "LLM training pass", "python benchmarks/llm_training_pass.py", argv,
        lambda: [measure(args.model, n, args.repeats) for n in args.sizes], report, args.json, args.markdown,
    )  # fmt: skip


if __name__ == "__main__":
    sys.exit(cli.main(run))
