"""Seconds per training iteration with TRL's old-policy pass against the first epoch's log-probs, side by side.

    python benchmarks/llm_old_logps.py                                   # twr-paper and workshop-low settings
    python benchmarks/llm_old_logps.py --settings twr-paper --iterations 6 --model tiny-random

With 2 epochs per iteration, TRL scores each generation batch once more, without gradients, before training on
it, for PPO's old log-probs (Eq. 7). The trainers take them from the first epoch's own forward pass instead
(algorithms.llm.training.old_logps, tests/test_llm_old_logps.py: the same numbers). One LOOP trainer (`LoopTrainer`,
its shortcut switched per iteration) per setting of benchmarks/llm_learning.py (its rollouts, K, epochs,
learning rate, turns and noise; the warm-started tiny model; one torch thread) runs 1 + 2 x `--iterations`
iterations; the first warms up, the others alternate between the two paths (TRL's pass on even iterations), so
both meet the same machine load. Printed per setting: the medians of each path's seconds per iteration (the
whole iteration: rollout, scoring, credit, both epochs) and of its training part (the iteration less its
rollout), and the ratios TRL's / first epoch's. `--json PATH` also writes the rows, `--markdown PATH` the
printed report.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from algorithms.common import cli  # noqa: E402
from algorithms.common.provenance import (  # noqa: E402
    add_report_arguments,
    check_report_files,
    measured_report,
)
from benchmarks.llm_learning import SETTINGS  # noqa: E402

PATHS = ("trl_pass", "first_epoch")
DEFAULT_SETTINGS = ("twr-paper", "workshop-low")


def measure(setting_name: str, model_name: str, iterations: int) -> dict:
    """Seconds per iteration on each path, alternating, in one trainer of the setting."""
    import numpy as np
    from datasets import Dataset
    from transformers import TrainerCallback

    from algorithms.llm.build import model_and_tokenizer
    from algorithms.llm.config import LoopConfig
    from algorithms.llm.training.loop import LoopTrainer

    setting = SETTINGS[setting_name]
    key = "max_turns" if setting.env_id == "TextWatchRepair-v0" else "n_stations"
    times: dict[str, dict[str, list[float]]] = {path: {"iteration": [], "training": []} for path in PATHS}

    class Switched(LoopTrainer):
        first_epoch = True  # False: TRL's pass

        def _old_policy_is_first_epoch(self) -> bool:
            return self.first_epoch and super()._old_policy_is_first_epoch()

    class Alternate(TrainerCallback):
        """At each iteration's end: book its seconds under the path it ran, and switch paths for the next."""

        def __init__(self, trainer: LoopTrainer) -> None:
            self.trainer = trainer

        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step % args.num_iterations:
                return
            done = state.global_step // args.num_iterations  # iterations finished; the first warms up
            last = self.trainer.history[-1]
            if done > 1:
                path = PATHS[(done - 2) % 2]
                times[path]["iteration"].append(last["iteration_time_s"])
                times[path]["training"].append(last["iteration_time_s"] - last["rollout_time_s"])
            self.trainer.first_epoch = PATHS[(done - 1) % 2] == "first_epoch"

    model, tokenizer = model_and_tokenizer(model_name, seed=0, bf16=False)
    with tempfile.TemporaryDirectory() as out:
        args = LoopConfig(
            output_dir=out,
            seed=0,
            max_steps=(1 + 2 * iterations) * setting.epochs,
            num_iterations=setting.epochs,
            generation_batch_size=setting.rollouts,
            num_generations=setting.group,
            per_device_train_batch_size=setting.rollouts,
            max_turns=setting.turns,
            max_new_tokens_per_turn=8,
            one_shot=False,
            system_prompt="algorithms.llm.generation.prompting:tiny_system_prompt",
            learning_rate=setting.learning_rate,
            max_grad_norm=1.0,
            disable_tqdm=True,
            use_cpu=True,
        )
        seeds = np.random.default_rng(0).integers(0, 2**31 - 1, size=1024)
        trainer = Switched(
            model=model,
            args=args,
            train_dataset=Dataset.from_dict({"prompt": [str(int(s)) for s in seeds]}),
            processing_class=tokenizer,
            env_id=setting.env_id,
            env_kwargs={key: setting.turns, "noise_scale": setting.noise_scale},
        )
        trainer.add_callback(Alternate(trainer))
        trainer.first_epoch = False  # the warm-up iteration
        trainer.train()
    row = {"setting": setting_name, "iterations_per_path": iterations}
    for path in PATHS:
        for part in ("iteration", "training"):
            row[f"{path}_{part}_s"] = statistics.median(times[path][part])
    return row


def report(rows: list[dict], seconds: float) -> list[str]:
    lines = [
        f"{'setting':<14} {'TRL pass s/it':>13} {'first epoch':>11} {'ratio':>6} {'training s, TRL pass':>20} "
        f"{'first epoch':>11} {'ratio':>6}"
    ]
    for r in rows:
        lines.append(
            f"{r['setting']:<14} {r['trl_pass_iteration_s']:>13.3f} {r['first_epoch_iteration_s']:>11.3f} "
            f"{r['trl_pass_iteration_s'] / r['first_epoch_iteration_s']:>5.2f}x {r['trl_pass_training_s']:>20.3f} "
            f"{r['first_epoch_training_s']:>11.3f} {r['trl_pass_training_s'] / r['first_epoch_training_s']:>5.2f}x"
        )
    lines.append(f"(medians over {rows[0]['iterations_per_path']} iterations per path; one torch thread; {seconds:.0f} s in all)")
    return lines


def run(argv: list[str]) -> list[dict]:
    parser = cli.ArgumentParser(prog="llm_old_logps.py", description=__doc__.splitlines()[0])
    parser.add_argument("--settings", nargs="+", choices=sorted(SETTINGS), default=list(DEFAULT_SETTINGS))
    parser.add_argument("--iterations", type=int, default=10, help="timed iterations per path and setting")
    parser.add_argument("--model", choices=("tiny", "tiny-random"), default="tiny")
    add_report_arguments(parser)
    args = parser.parse_args(argv)
    cli.check_int(args.iterations, "--iterations", 1)
    check_report_files(args.json, args.markdown)

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    import torch

    torch.set_num_threads(1)
    return measured_report(
        "Old-policy log-probs", "python benchmarks/llm_old_logps.py", argv,
        lambda: [measure(name, args.model, args.iterations) for name in args.settings], report, args.json, args.markdown,
    )  # fmt: skip


if __name__ == "__main__":
    sys.exit(cli.main(run))
