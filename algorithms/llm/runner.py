"""Runner for `--algo loop`, `--algo vcbm-loop` and `--algo trl-grpo` (the LLM arm).

    python -m algorithms.train --algo vcbm-loop --env TextWatchRepair-v0 --model tiny --iterations 3

`--model tiny` is a tiny Qwen2 built offline and given a short format warm-start (supervised
tool-call turns that say nothing about which decision is right; algorithms.llm.model.warm_start), the
stand-in for an instruct model; `--model tiny-random` is the same model untrained. Any other value
is a Hugging Face name or local path loaded with transformers. `finetune: auto` trains every
parameter of the tiny models (LoRA cannot lift their frozen, nearly flat output layer enough to
express a policy) and LoRA through peft otherwise (LoopRunConfig's lora_* settings, on the attention and
MLP projections by default). `trl-grpo` is TRL's own GRPOTrainer objective and sequence-level group
advantage over the same multi-turn episodes: the external baseline. Checkpoints (weights,
optimizer, scheduler, RNG, episodic memory, counters) go to <log-dir>/checkpoints every
`--checkpoint-every` iterations; `--resume` continues from the latest one. The per-iteration
metrics (docs/papers/vcbm.md, "LOOP and VCBM-blended LOOP") are written to TensorBoard under `loop/`.

Before any model is built, one step of the env checks that it reports what the run learns from
(the env contract, vcbm_gym/contract.py): the info keys the credit rule declares (`CreditRule.info_needs`:
`state_mutating` for `--credit vcbm_blend`, vcbm-loop), except those the rollout has a stand-in for
(`execution_output`: the observation text), and `effect` for `--ratio-sharing effect`; a missing key is one
line naming it and who needs it.

The run is resolved once (algorithms/llm/resolve.py: its configs and credit rule, in `RunSpec.config`),
checked dry (`LLMArm.validate`, `LLMArm.check_resume`), then trained (`LLMArm.run`, building the model and
trainer through algorithms/llm/build.py). The trainer settings the run decides itself (output dir, seed,
progress bar, device, and the step budget derived from `iterations`) are refused as hyperparameters.

Credit: `--credit RULE` (a name in vcbm_gym.credit.registry.RULES), as for the SB3 runner; the rule's
arguments go under `credit_kwargs`, keyed by rule name (`credit_kwargs: {vcbm_blend: {beta: 0.5}}`).
`loop` and `vcbm-loop` differ only in their own rule (`loo`, `vcbm_blend`: config.DEFAULT_CREDIT); any rule whose inputs the
LLM arm's EpisodeBatch holds works with either (grpo, gigpo, broadcast); one that needs more (casi:
coalition values; rudder, vcbm_bookmark: observations) is refused when the config is resolved.

Several processes: every process runs the same command; each plays its share of the iteration's
tasks (TRL's sampler keeps a task's K rollouts together), the credit rule sees all processes'
episodes (gathered), and the iteration metrics are over all of them. On CPUs (world size 2, gloo):

    torchrun --nproc_per_node 2 -m algorithms.train --algo vcbm-loop --env TextWatchRepair-v0 --model tiny --iterations 3

The per-process batch is derived (`share_batch`: generation_batch_size / processes) unless a config names it.

Every run prints its world size at start-up and records it in summary.json. On CPUs the model is
wrapped in DDP: accelerate 1.16 turns FSDP on only for accelerator devices (its MULTI_CPU state never
becomes FSDP), so DDP over gloo is the closest supported wrapping. Multi-GPU (FSDP2, as in the paper's
2-GPU AppWorld runs; its paths run on two CPU processes in tests/test_fsdp2_cpu.py, not on GPUs here):

    accelerate launch --config_file zoo_configs/accelerate/fsdp2.yaml -m algorithms.train \\
        --algo vcbm-loop --env AppWorld-v0 --model Qwen/Qwen2.5-7B-Instruct --use-vllm
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from algorithms.common import cli
from algorithms.common.config import make_env
from algorithms.common.credit_slot import CreditFit
from algorithms.common.errors import ConfigError, VcbmGymError
from algorithms.common.spec import ITERATIONS, Arm, RunOptions, RunSpec
from algorithms.llm import resolve as resolving
from algorithms.llm.config import (
    DEFAULT_CREDIT,
    INFO_STAND_INS,
    LLM_BATCH_PROVIDES,
    LLM_CREDIT,
    LLM_INFO_PROVIDES,
    OBJECTIVES,
    TINY_MODELS,
    LLMConfig,
)
from vcbm_gym.contract import NEEDS, require_info
from vcbm_gym.credit.empo import RATIO_SHARING_MODES
from vcbm_gym.credit.registry import rule_class, rule_names


def info_needs(credit: str | None, ratio_sharing: str) -> dict[str, str]:
    """{info key: who needs it} for a run: the keys rule `credit` declares (`CreditRule.info_needs`) that the
    rollout has no stand-in for, and EMPO's effect for `--ratio-sharing effect`."""
    needs: dict[str, str] = {}
    if credit is not None:
        algos = [algo for algo, rule in DEFAULT_CREDIT.items() if rule == credit]
        who = f"--credit {credit}" + (f" ({', '.join(algos)})" if algos else "")
        needs.update({key: who for key in rule_class(credit).info_needs if key not in INFO_STAND_INS})
    if ratio_sharing == "effect":
        needs.update({key: "--ratio-sharing effect" for key in NEEDS["--ratio-sharing effect"]})
    return needs


def check_env_reports(env_id: str, env_kwargs: dict[str, Any], needs: dict[str, str], seed: int) -> None:
    """One reset and one step of the env with a sampled action: the keys in `needs` must be in its info."""
    if not needs:
        return
    env = make_env(env_id, env_kwargs)
    try:
        env.reset(seed=seed)
        env.action_space.seed(seed)
        info = env.step(env.action_space.sample())[4]
    finally:
        env.close()
    require_info(info, needs, repr(env_id))


def check_model(name: str) -> None:
    """`--model`: a tiny model, or a folder / hub name whose config and tokenizer load (no weights yet)."""
    if name in TINY_MODELS:
        return
    path = Path(name).expanduser()
    looks_like_path = name.startswith((".", "/", "~")) or name.count("/") > 1 or os.sep != "/" and os.sep in name
    if not path.exists() and looks_like_path:
        raise VcbmGymError(
            f"--model {name!r}: no such directory; expected {' or '.join(TINY_MODELS)}, a model folder or a hub name"
        )
    if path.exists() and not path.is_dir():
        raise VcbmGymError(f"--model {name!r} is a file; expected a model folder (config.json, weights, tokenizer) or a hub name")
    from transformers import AutoConfig

    from algorithms.llm.model.tiny import load_tokenizer

    try:
        AutoConfig.from_pretrained(name)
        load_tokenizer(name)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        first = str(exc).strip().splitlines()
        raise VcbmGymError(
            f"--model {name!r} could not be loaded ({first[0][:200] if first else type(exc).__name__}); "
            f"expected {' or '.join(TINY_MODELS)}, a model folder or a hub name"
        ) from None


def check_system_prompt(name: str | None) -> None:
    """`system_prompt`: None or a registered prompt's name (algorithms.llm.generation.prompting.PROMPTS), whose text is built
    once here; the registry is the only lookup, so a config's string never imports a module of its own choosing."""
    from algorithms.llm.generation.prompting import system_prompt_text

    try:
        system_prompt_text(name)
    except ValueError as exc:
        raise ConfigError(f"hyperparameter {exc}") from None


class LLMArm(Arm):
    """loop, vcbm-loop (TRL's GRPOTrainer with a credit rule's per-token advantages) and trl-grpo."""

    name = "llm"
    budget_key = "iterations"
    budget_flag = "--iterations"
    budget_unit = "iterations"
    objective = ITERATIONS
    metric_tags = {"correct": "loop/task_goal_completion", "return": "loop/mean_return"}
    reports_convergence = False
    multi_process = True  # torchrun / accelerate launch
    resumes_itself = True  # checkpoints: --resume continues the run
    batch_provides = LLM_BATCH_PROVIDES
    info_provides = LLM_INFO_PROVIDES
    rule_defaults = LLM_CREDIT.rule_defaults

    def consumes(self, algo: str | None = None) -> frozenset[str]:
        """loop and vcbm-loop read advantages (LOOP's loss); trl-grpo keeps TRL's own group advantage."""
        return frozenset() if algo == "trl-grpo" else LLM_CREDIT.consumes

    def credit_fit(self, algo: str | None = None) -> CreditFit:
        return LLM_CREDIT if algo != "trl-grpo" else super().credit_fit(algo)

    def default_credit(self, algo: str) -> str:
        return DEFAULT_CREDIT.get(algo, "none")

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        group = parser.add_argument_group("LLM (loop, vcbm-loop)")
        group.add_argument("--model", default=None, help="tiny (random, offline) or a transformers name/path")
        group.add_argument("--iterations", type=int, default=None, help="LOOP iterations (generation batches)")
        group.add_argument("--use-vllm", action="store_true", help="generate with TRL's vLLM engine")
        group.add_argument("--checkpoint-every", type=int, default=None, help="iterations between checkpoints (0: none)")
        group.add_argument("--ratio-sharing", choices=RATIO_SHARING_MODES, default=None, help="EMPO ratio sharing")
        defaults = ", ".join(f"{algo}: {rule}" for algo, rule in DEFAULT_CREDIT.items())
        group.add_argument("--credit", default=None, help=f"credit rule, one of: {', '.join(rule_names())} ({defaults})")
        group.add_argument("--no-length-norm", action="store_true", help="EMPO ablation: unnormalised response ratios")
        group.add_argument(
            "--objective",
            choices=OBJECTIVES,
            default=None,
            help="base objective (docs/papers/base_objectives.md; default ppo_clip)",
        )

    def flag_hyperparams(self, args: argparse.Namespace) -> dict[str, Any]:
        """The flags as hyperparameters: `algorithms.train` folds them into the one resolved config
        (so config.yml and the config hash record them) before anything runs."""
        out: dict[str, Any] = {}
        for flag in ("model", "iterations", "checkpoint_every", "ratio_sharing", "credit", "objective"):
            if getattr(args, flag, None) is not None:
                out[flag] = getattr(args, flag)
        if getattr(args, "no_length_norm", False):
            out["length_norm"] = False
        if getattr(args, "use_vllm", False):
            out["use_vllm"] = True
        return out

    def resolve(self, algo: str, env: str, seed: int, mapping: Mapping[str, Any]) -> RunSpec:
        return resolving.resolve(algo, env, seed, mapping)

    def validate(self, spec: RunSpec) -> None:
        """Everything a run can refuse before it trains, checked before algorithms.train writes the log dir:
        the model path, the env's info keys and turn limit, the system prompt. The model's weights are not
        loaded (that is the run's first work)."""
        from algorithms.llm.training.trainer import check_turn_limits

        config: LLMConfig = spec.config
        cfg = config.trainer
        check_model(config.run.model)
        needs = info_needs(getattr(cfg, "credit", None), getattr(cfg, "ratio_sharing", "none"))  # trl-grpo: neither
        check_env_reports(spec.env, config.run.env_kwargs, needs, spec.seed)
        env = make_env(spec.env, config.run.env_kwargs)
        try:
            check_turn_limits(cfg.max_turns, env, spec.env)
        finally:
            env.close()
        check_system_prompt(cfg.system_prompt)

    def check_resume(self, spec: RunSpec, log_dir: str) -> None:
        """--resume needs a complete checkpoint in <log-dir>/checkpoints (checked before the log dir is touched)."""
        from algorithms.llm.build import CHECKPOINTS, resume_checkpoint

        resume_checkpoint(Path(log_dir) / CHECKPOINTS)

    def run(self, spec: RunSpec, log_dir: str, options: RunOptions) -> dict[str, Any]:
        os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
        import torch

        from algorithms.llm import build

        config: LLMConfig = spec.config
        cfg = build.trainer_config_for_run(spec, log_dir, options.progress)
        main_process = cli.is_launch_main_process()
        if main_process:
            build.write_loop_config(Path(log_dir), spec.algo, config.run, cfg)
        previous_threads = torch.get_num_threads()
        if config.run.torch_threads > 0:
            torch.set_num_threads(config.run.torch_threads)
        writer = None
        try:
            checkpoint = build.resume_checkpoint(Path(cfg.output_dir)) if options.resume else None
            if main_process:
                from torch.utils.tensorboard import SummaryWriter

                writer = SummaryWriter(log_dir)
            trainer = build.build_trainer(spec, cfg, writer)
            build.announce(trainer, cfg)
            if options.report is not None:
                from algorithms.llm.report import ReportIterations

                trainer.add_callback(ReportIterations(trainer, options.report))
            initial = build.trainable_weights(trainer)
            if checkpoint is not None and hasattr(trainer, "load_loop_checkpoint"):
                trainer.load_loop_checkpoint(checkpoint)
            trainer.train(resume_from_checkpoint=checkpoint)
        finally:
            if writer is not None:
                writer.close()
            torch.set_num_threads(previous_threads)
        build.save_final_weights(trainer, Path(log_dir) / ("model" if config.run.full_finetune else "adapter"))
        if main_process:
            cli.atomic_write_json(Path(log_dir) / "history.json", trainer.history)  # a benchmark reads it back
        return build.run_summary(trainer, cfg, config.run, checkpoint, build.weight_change_l2(trainer, initial))


ARM = LLMArm()
