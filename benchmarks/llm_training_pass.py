"""The LLM arm's training pass: TRL's, shared prompts, and shared prompts over length-trimmed chunks, side by side.

    python benchmarks/llm_training_pass.py                                   # both settings, 48 rollouts
    python benchmarks/llm_training_pass.py --settings twr-paper --sizes 48 96 192 --repeats 3

Each setting is a registered experiment's (its train command, from the spec): `twr-paper` (llm_power_twr_paper:
TextWatchRepair, 2 turns, K = 8) and `sokoban` (llm_empo_gigpo_sokoban: SokobanDescribed, up to 15 moves, K = 8),
with `--sizes` rollouts per iteration in one micro-batch, the env's warm-started tiny model and one torch thread.
Per size, the first training batch of a LOOP run is captured (the inputs of `_compute_loss`); then, `--repeats`
times and rotating which goes first, each path computes the batch's per-token log-probs with gradients and
back-propagates a loss over them (what one optimizer step costs), and computes them once more without gradients
(the old-policy pass of a second epoch):

- TRL: `GRPOTrainer._get_per_token_logps_and_entropies`, the model over [prompt, completion] of every row;
- whole: `shared_prefix_logps` over the whole batch, each distinct prompt encoded once;
- trimmed: the trainers' pass (algorithms.llm.training.shared_prefix.SharedPromptLogps): the same over chunks of
  rows of similar completion length, each cut to its longest completion.

Printed per setting and size: the batch's real tokens and its padded rectangle, the medians of each path's seconds,
the ratios whole / trimmed and TRL / trimmed, and the largest difference between the trimmed and TRL paths'
log-probs and between their gradients (they compute the same function). `--json PATH` also writes the rows,
`--markdown PATH` the printed report.
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

SETTINGS = {"twr-paper": "llm_power_twr_paper", "sokoban": "llm_empo_gigpo_sokoban"}  # setting -> the spec that runs it
METHOD = "loop"
K = 8
PATHS = ("trl", "whole", "trimmed")


class Captured(Exception):
    """Raised by the first loss of the run, once its inputs are kept: the rest of the run is not needed."""


def captured_batch(setting: str, model_name: str, rollouts: int, out: str):
    """(trainer, the inputs `_compute_loss` received first) of a LOOP run in the registered setting at this size."""
    from algorithms.experiment import llm_study, specs
    from algorithms.llm.build import build_trainer, trainer_config_for_run
    from algorithms.train import resolve_argv

    run = specs.load_spec(SETTINGS[setting]).run
    argv = llm_study.run_argv(llm_study.settings_of(run)[setting], llm_study.methods_of(run)[METHOD], 0, 1, Path(out))
    argv[argv.index("--model") + 1] = model_name
    spec = resolve_argv([*argv, f"generation_batch_size={rollouts}", "per_device_train_batch_size=null"])
    trainer = build_trainer(spec, trainer_config_for_run(spec, out, progress=False), writer=None)

    def capture(model, inputs):
        trainer.captured = inputs
        raise Captured

    trainer._compute_loss = capture
    try:
        trainer.train()
    except Captured:
        pass
    return trainer, trainer.captured


def logps_of(trainer, path: str, ids, mask, keep):
    from trl import GRPOTrainer

    from algorithms.llm.training.shared_prefix import shared_prefix_logps

    if path == "trl":
        return GRPOTrainer._get_per_token_logps_and_entropies(trainer, trainer.model, ids, mask, keep)[0]
    if path == "whole":
        return shared_prefix_logps(trainer.model, ids, mask, keep, trainer.temperature, False)[0]
    return trainer._get_per_token_logps_and_entropies(trainer.model, ids, mask, keep)[0]


def one_pass(trainer, inputs, path: str) -> tuple[float, float, Any, dict]:
    """(seconds with gradients and backward, seconds without gradients, log-probs, gradients) on one path."""
    import torch

    model = trainer.model
    ids = torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], dim=1)
    mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
    keep = inputs["completion_ids"].size(1)
    weights = inputs["completion_mask"].float() * inputs["advantages"]
    model.zero_grad(set_to_none=True)
    start = time.perf_counter()
    logps = logps_of(trainer, path, ids, mask, keep)
    (logps * weights).sum().backward()
    with_grad = time.perf_counter() - start
    start = time.perf_counter()
    with torch.no_grad():
        logps_of(trainer, path, ids, mask, keep)
    without = time.perf_counter() - start
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return with_grad, without, logps.detach(), grads


def measure(setting: str, model_name: str, rollouts: int, repeats: int) -> dict:
    import torch

    with tempfile.TemporaryDirectory() as out:
        trainer, inputs = captured_batch(setting, model_name, rollouts, out)
        trainer.model.train()
        times = {path: {"grad": [], "no_grad": []} for path in PATHS}
        results = {}
        for r in range(repeats):
            order = PATHS[r % len(PATHS) :] + PATHS[: r % len(PATHS)]
            for path in order:
                grad_s, no_grad_s, logps, grads = one_pass(trainer, inputs, path)
                times[path]["grad"].append(grad_s)
                times[path]["no_grad"].append(no_grad_s)
                results[path] = (logps, grads)
        on = inputs["completion_mask"].bool()
        logp_gap = (results["trl"][0] - results["trimmed"][0])[on].abs().max().item()
        grad_gap = max((results["trl"][1][n] - g).abs().max().item() for n, g in results["trimmed"][1].items())
        grad_scale = max(g.abs().max().item() for g in results["trl"][1].values())
        mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
        row = {
            "setting": setting,
            "rollouts": rollouts,
            "tokens": int(mask.sum()),
            "padded_tokens": int(mask.numel()),
            "max_logprob_gap": logp_gap,
            "max_grad_gap": grad_gap,
            "max_grad": grad_scale,
        }
    for path in PATHS:
        row[f"{path}_grad_s"] = statistics.median(times[path]["grad"])
        row[f"{path}_no_grad_s"] = statistics.median(times[path]["no_grad"])
    return row


def report(rows: list[dict], seconds: float) -> list[str]:
    head = f"{'setting':<10} {'rollouts':>8} {'tokens':>7} {'padded':>7}"
    for kind in ("", " no-grad"):
        head += f" {'TRL s' + kind:>13} {'whole s':>8} {'trimmed s':>9} {'whole/trim':>10} {'TRL/trim':>8}"
    lines = [head + f" {'max |logp gap|':>15} {'max |grad gap| / max |grad|':>28}"]
    for r in rows:
        line = f"{r['setting']:<10} {r['rollouts']:>8} {r['tokens']:>7} {r['padded_tokens']:>7}"
        for kind in ("grad", "no_grad"):
            trl, whole, trimmed = (r[f"{p}_{kind}_s"] for p in PATHS)
            line += f" {trl:>13.3f} {whole:>8.3f} {trimmed:>9.3f} {whole / trimmed:>9.2f}x {trl / trimmed:>7.2f}x"
        lines.append(line + f" {r['max_logprob_gap']:>15.2e} {r['max_grad_gap'] / max(r['max_grad'], 1e-30):>28.2e}")
    lines.append(f"(medians; one torch thread; {seconds:.0f} s in all)")
    return lines


def run(argv: list[str]) -> list[dict]:
    parser = cli.ArgumentParser(prog="llm_training_pass.py", description=__doc__.splitlines()[0])
    parser.add_argument("--settings", nargs="+", choices=tuple(SETTINGS), default=list(SETTINGS), help="registered settings")
    parser.add_argument("--sizes", type=int, nargs="+", default=[48], help="rollouts per iteration")
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
        lambda: [measure(s, args.model, n, args.repeats) for s in args.settings for n in args.sizes], report, args.json,
        args.markdown,
    )  # fmt: skip


if __name__ == "__main__":
    sys.exit(cli.main(run))
