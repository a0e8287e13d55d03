"""Runner for `--algo loop`, `--algo vcbm-loop` and `--algo trl-grpo` (the LLM arm).

    python -m algorithms.train --algo vcbm-loop --env TextWatchRepair-v0 --model tiny --iterations 3

`--model tiny` is a tiny Qwen2 built offline and given a short format warm-start (supervised
tool-call turns that say nothing about which decision is right; algorithms.llm.warm_start), the
stand-in for an instruct model; `--model tiny-random` is the same model untrained. Any other value
is a Hugging Face name or local path loaded with transformers. `finetune: auto` trains every
parameter of the tiny models (LoRA cannot lift their frozen, nearly flat output layer enough to
express a policy) and LoRA (r 8, alpha 16, dropout 0 on q, k, v, o, gate, up, down by default)
through peft otherwise. `trl-grpo` is TRL's own GRPOTrainer objective and sequence-level group
advantage over the same multi-turn episodes: the external baseline. Checkpoints (weights,
optimizer, scheduler, RNG, episodic memory, counters) go to <log-dir>/checkpoints every
`--checkpoint-every` iterations; `--resume` continues from the latest one. The per-iteration
metrics (docs/papers/vcbm.md, "LOOP and VCBM-blended LOOP") are written to TensorBoard under `loop/`.

Before any model is built, one step of the env checks that it reports what the run learns from
(the env contract, vcbm_gym/contract.py): `state_mutating` for `--credit vcbm_blend` (vcbm-loop),
`effect` for `--ratio-sharing effect`; a missing key is one line naming it.

Credit: `--credit RULE` (a name in vcbm_gym.credit.base.RULES), as for the SB3 runner; the rule's
arguments go under `credit_kwargs`, keyed by rule name (`credit_kwargs: {vcbm_blend: {beta: 0.5}}`).
`loop` and `vcbm-loop` are zoo entries that name `loo` and `vcbm_blend`; any rule whose inputs the
LLM arm's EpisodeBatch holds works with either (grpo, gigpo, broadcast); one that needs more (casi:
coalition values; rudder, vcbm_bookmark: observations) is refused when the config is resolved.

Several processes: every process runs the same command; each plays its share of the iteration's
tasks (TRL's sampler keeps a task's K rollouts together), the credit rule sees all processes'
episodes (gathered), and the iteration metrics are over all of them. On CPUs (world size 2, gloo):

    torchrun --nproc_per_node 2 -m algorithms.train --algo vcbm-loop --env TextWatchRepair-v0 --model tiny --iterations 3

The per-process batch is derived (`share_batch`: generation_batch_size / processes) unless a config names it.

Every run prints its world size at start-up and records it in summary.json. On CPUs the model is
wrapped in DDP: accelerate 1.15 turns FSDP on only for accelerator devices (its MULTI_CPU state never
becomes FSDP), so DDP over gloo is the closest supported wrapping. Multi-GPU (FSDP2, as in the paper's
2-GPU AppWorld runs; not run on this project's CPUs):

    accelerate launch --config_file zoo_configs/accelerate/fsdp2.yaml -m algorithms.train \\
        --algo vcbm-loop --env AppWorld-v0 --model Qwen/Qwen2.5-7B-Instruct --use-vllm
"""

from __future__ import annotations

import argparse
import dataclasses
import enum
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from algorithms.common import cli
from algorithms.common.config import as_plain_dict, build_dataclasses, make_env
from algorithms.common.errors import ConfigError, VcbmGymError
from algorithms.common.run_context import RunContext
from algorithms.common.validation import AT_LEAST_ONE, NON_NEGATIVE, POSITIVE, Range, Validated
from vcbm_gym.contract import NEEDS, require_info
from vcbm_gym.credit.base import RULES
from vcbm_gym.credit.empo import RATIO_SHARING_MODES

CREDIT_OF_ALGO = {"loop": "loo", "vcbm-loop": "vcbm_blend"}  # the rule when no config names one
# Keys of the earlier shape (credit: loo | vcbm with vcbm_* beside it) -> their vcbm_blend argument.
MOVED_KEYS = {
    "vcbm_beta": "beta",
    "vcbm_tau": "tau",
    "vcbm_top_k": "top_k",
    "vcbm_alpha": "alpha",
    "vcbm_few_bookmarks": "few_bookmarks",
    "vcbm_embed_dim": "dim",
    "memory_capacity": "memory_capacity",
}
TINY_MODELS = ("tiny", "tiny-random")
MULTI_PROCESS = True  # algorithms.train accepts torchrun / accelerate launch for these algorithms
FINETUNE_MODES = ("auto", "lora", "full")
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
# LoopConfig fields always written to config.yml (the other GRPOConfig fields only when set)
REPORTED = (
    "credit",
    "credit_kwargs",
    "kl_abort",
    "outlier_grad_factor",
    "outlier_grad_window",
    "max_turns",
    "max_new_tokens_per_turn",
    "truncation_chars",
    "one_shot",
    "ratio_sharing",
    "length_norm",
    "epsilon",
    "learning_rate",
    "lr_scheduler_type",
    "weight_decay",
    "max_grad_norm",
    "num_iterations",
    "num_generations",
    "generation_batch_size",
    "per_device_train_batch_size",
    "temperature",
    "bf16",
    "activation_checkpointing",
)


@dataclass
class LoopRunConfig(Validated):
    RANGES = {
        "iterations": AT_LEAST_ONE,
        "checkpoint_every": NON_NEGATIVE,
        "n_tasks": AT_LEAST_ONE,
        "torch_threads": NON_NEGATIVE,
        "lora_r": AT_LEAST_ONE,
        "lora_alpha": POSITIVE,
        "lora_dropout": Range(0, 1, hi_open=True),
    }

    iterations: int = 200
    model: str = "tiny"
    finetune: str = "auto"  # auto: full for the tiny models, LoRA otherwise
    env_kwargs: dict = field(default_factory=dict)
    lora_r: int = 8
    lora_alpha: int = 16
    lora_dropout: float = 0.0
    lora_target_modules: list = field(default_factory=lambda: list(LORA_TARGETS))
    checkpoint_every: int = 0
    n_tasks: int = 1024  # task seeds drawn from the run seed; independent of --iterations so that resumes match
    torch_threads: int = 0  # 0: torch's default; 1 is often fastest for tiny models on shared CPUs
    # Settings that replace the entry's own on a machine without a CUDA GPU (e.g. the paper's
    # bf16 / vLLM AppWorld setting becomes a tiny CPU run); applied in resolve(), so config.yml shows them.
    cpu_overrides: dict = field(default_factory=dict)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("LLM (loop, vcbm-loop)")
    group.add_argument("--model", default=None, help="tiny (random, offline) or a transformers name/path")
    group.add_argument("--iterations", type=int, default=None, help="LOOP iterations (generation batches)")
    group.add_argument("--use-vllm", action="store_true", help="generate with TRL's vLLM engine")
    group.add_argument("--checkpoint-every", type=int, default=None, help="iterations between checkpoints (0: none)")
    group.add_argument("--ratio-sharing", choices=RATIO_SHARING_MODES, default=None, help="EMPO ratio sharing")
    group.add_argument(
        "--credit", default=None, help=f"credit rule, one of: {', '.join(RULES)} (loop: loo, vcbm-loop: vcbm_blend)"
    )
    group.add_argument("--no-length-norm", action="store_true", help="EMPO ablation: unnormalised response ratios")


def _config_class(algo: str):
    from algorithms.llm.config import LoopConfig, MultiTurnGRPOConfig

    return MultiTurnGRPOConfig if algo == "trl-grpo" else LoopConfig


def _loop_config(mapping: dict[str, Any], owner: str, algo: str = "loop"):
    try:
        run_cfg, cfg = build_dataclasses(mapping, [LoopRunConfig, _config_class(algo)], owner=owner)
        if run_cfg.finetune not in FINETUNE_MODES:
            raise ConfigError(f"{owner}: finetune={run_cfg.finetune!r}: expected one of {FINETUNE_MODES}")
        return run_cfg, cfg
    except ValueError as exc:
        if isinstance(exc, VcbmGymError):
            raise
        raise ConfigError(f"{owner}: {exc}") from None


def _plain(value: Any) -> Any:
    return value.value if isinstance(value, enum.Enum) else value


def _reported(algo: str) -> tuple[str, ...]:
    if algo != "trl-grpo":
        return REPORTED
    from algorithms.llm.config import LoopConfig

    loop_only = {f.name for f in dataclasses.fields(LoopConfig)} - {f.name for f in dataclasses.fields(_config_class(algo))}
    return tuple(k for k in REPORTED if k not in loop_only) + ("beta", "loss_type", "scale_rewards")


def resolve(algo: str, env_id: str, mapping: dict[str, Any]) -> dict[str, Any]:
    mapping = dict(mapping)
    moved = [k for k in mapping if k in MOVED_KEYS]
    if moved:
        new = ", ".join(f"{MOVED_KEYS[k]}: {mapping[k]!r}" for k in moved)
        raise ConfigError(
            f"hyperparameters {', '.join(moved)} for algo {algo!r}: the credit rule's settings moved; "
            f"expected credit: vcbm_blend and credit_kwargs: {{vcbm_blend: {{{new}}}}}"
        )
    if algo in CREDIT_OF_ALGO:
        mapping.setdefault("credit", CREDIT_OF_ALGO[algo])
    elif "credit" in mapping or "credit_kwargs" in mapping:
        raise ConfigError(
            f"credit={mapping.get('credit')!r} for algo {algo!r}: trl-grpo keeps TRL's own group advantage; "
            f"expected --algo loop or vcbm-loop for a credit rule"
        )
    import torch

    overrides = mapping.get("cpu_overrides") or {}
    if not isinstance(overrides, dict):
        raise ConfigError(f"cpu_overrides={overrides!r} for algo {algo!r}: expected a mapping of hyperparameters")
    if overrides and not torch.cuda.is_available():
        mapping.update({k: v for k, v in overrides.items() if k != "cpu_overrides"})
    share_batch(mapping, cli.launch_world_size(), algo)
    # validated as on this machine; run() sets the real output_dir (<log-dir>/checkpoints) and device
    checked = {"output_dir": "unused", "use_cpu": not torch.cuda.is_available(), **mapping}
    run_cfg, loop_cfg = _loop_config(checked, f"algo {algo!r}", algo)
    out = as_plain_dict(run_cfg)
    for name in list(_reported(algo)) + [k for k in mapping if k not in out]:
        out[name] = _plain(getattr(loop_cfg, name))
    return out


def share_batch(mapping: dict[str, Any], world_size: int, algo: str) -> None:
    """Derive the per-process batch from the rollouts per iteration and the number of processes.

    `generation_batch_size` is the iteration's rollouts over all processes; each process trains on its
    share. When no config names `per_device_train_batch_size`, it is that whole share (one micro-batch
    per process: the zoo's CPU entries), so the same entry runs on one process or several. A batch that
    cannot be shared equally, or a named per-process batch that does not divide it, is one line.
    """
    rollouts, per_device = mapping.get("generation_batch_size"), mapping.get("per_device_train_batch_size")
    if not isinstance(rollouts, int) or isinstance(rollouts, bool) or rollouts < 1:
        return  # unset (TRL derives it from the per-process batch) or malformed (the config check names it)
    processes = f"{world_size} process{'es' if world_size > 1 else ''} (WORLD_SIZE={world_size})"
    if per_device is None:
        if rollouts % world_size:
            raise ConfigError(
                f"generation_batch_size={rollouts} rollouts per iteration for algo {algo!r} cannot be shared equally by "
                f"{processes}; expected a multiple of {world_size}"
            )
        mapping["per_device_train_batch_size"] = rollouts // world_size
    elif isinstance(per_device, int) and not isinstance(per_device, bool) and per_device >= 1:
        if rollouts % (per_device * world_size):
            raise ConfigError(
                f"generation_batch_size={rollouts} rollouts per iteration for algo {algo!r} is not a multiple of "
                f"per_device_train_batch_size={per_device} x {processes}; expected a multiple of {per_device * world_size}, "
                "or no per_device_train_batch_size (derived: generation_batch_size / processes)"
            )


def flag_hyperparams(args: argparse.Namespace) -> dict[str, Any]:
    """The runner's flags as hyperparameters: `algorithms.train` folds them into the one resolved config
    (so config.yml and the config hash record them) before anything runs."""
    out: dict[str, Any] = {}
    for flag in ("model", "iterations", "checkpoint_every", "ratio_sharing", "credit"):
        if getattr(args, flag, None) is not None:
            out[flag] = getattr(args, flag)
    if getattr(args, "no_length_norm", False):
        out["length_norm"] = False
    if getattr(args, "use_vllm", False):
        out["use_vllm"] = True
    return out


def _apply_flags(hp: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    return {**hp, **flag_hyperparams(args)}  # checked with the rest by LoopRunConfig (resolve() folded them in)


def info_needs(credit: str | None, ratio_sharing: str) -> dict[str, str]:
    """{info key: who needs it} for a run: vcbm_blend's bookmarks (vcbm-loop), EMPO's effect cells."""
    needs: dict[str, str] = {}
    if credit == "vcbm_blend":
        needs.update({key: "--credit vcbm_blend (vcbm-loop)" for key in NEEDS["vcbm-loop"]})
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


def _model_and_tokenizer(name: str, seed: int, bf16: bool):
    if name == "tiny":
        from algorithms.llm.warm_start import warm_started_tiny

        return warm_started_tiny()
    if name == "tiny-random":
        from algorithms.llm.tiny import build_tiny

        return build_tiny(seed)
    import torch
    from transformers import AutoModelForCausalLM

    from algorithms.llm.tiny import load_tokenizer

    try:
        tokenizer = load_tokenizer(name)
        model = AutoModelForCausalLM.from_pretrained(name, dtype=torch.bfloat16 if bf16 else torch.float32)
    except OSError as exc:
        raise VcbmGymError(f"model {name!r} could not be loaded ({exc}); expected 'tiny' or a local path / hub name") from None
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


@dataclass
class Prepared:
    """The run's checked settings: LoopRunConfig, the trainer's config (output under <log-dir>/checkpoints)."""

    run_cfg: LoopRunConfig
    cfg: Any  # LoopConfig or MultiTurnGRPOConfig
    ckpt_dir: Path


def prepare(ctx: RunContext) -> Prepared:
    import torch

    hp = _apply_flags(ctx.hyperparams, ctx.args)
    ckpt_dir = Path(ctx.log_dir) / "checkpoints"
    run_keys = {f.name for f in dataclasses.fields(LoopRunConfig)}
    run_cfg, _ = _loop_config({k: v for k, v in hp.items() if k in run_keys}, f"algo {ctx.algo!r}", ctx.algo)
    loop_kwargs = {k: v for k, v in hp.items() if k not in run_keys}
    per_iteration = loop_kwargs.get("num_iterations", _config_class(ctx.algo).num_iterations)
    loop_kwargs.update(
        output_dir=str(ckpt_dir),
        seed=ctx.seed,
        max_steps=run_cfg.iterations * per_iteration,
        save_strategy="steps" if run_cfg.checkpoint_every else "no",
        save_steps=max(run_cfg.checkpoint_every, 1) * per_iteration,
        logging_steps=per_iteration,
        disable_tqdm=not ctx.progress,
        use_cpu=not torch.cuda.is_available(),
    )
    _, cfg = _loop_config(loop_kwargs, f"algo {ctx.algo!r}", ctx.algo)
    return Prepared(run_cfg, cfg, ckpt_dir)


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

    from algorithms.llm.tiny import load_tokenizer

    try:
        AutoConfig.from_pretrained(name)
        load_tokenizer(name)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        first = str(exc).strip().splitlines()
        raise VcbmGymError(
            f"--model {name!r} could not be loaded ({first[0][:200] if first else type(exc).__name__}); "
            f"expected {' or '.join(TINY_MODELS)}, a model folder or a hub name"
        ) from None


def validate(ctx: RunContext) -> None:
    """Everything a run can refuse before it trains, checked before algorithms.train writes the log dir:
    the trainer's config, the model path, the env's info keys and turn limit, the system prompt, and a
    checkpoint to --resume from. The model's weights are not loaded (that is the run's first work)."""
    from algorithms.llm.trainer import check_turn_limits, latest_complete_checkpoint
    from algorithms.registry import load_object

    prepared = prepare(ctx)
    run_cfg, cfg = prepared.run_cfg, prepared.cfg
    check_model(run_cfg.model)
    needs = info_needs(getattr(cfg, "credit", None), getattr(cfg, "ratio_sharing", "none"))  # trl-grpo: neither
    check_env_reports(ctx.env_id, run_cfg.env_kwargs, needs, ctx.seed)
    env = make_env(ctx.env_id, run_cfg.env_kwargs)
    try:
        check_turn_limits(cfg.max_turns, env, ctx.env_id)
    finally:
        env.close()
    if cfg.system_prompt:
        try:
            prompt = load_object(cfg.system_prompt)
        except (ImportError, AttributeError, ValueError) as exc:
            raise ConfigError(
                f"hyperparameter system_prompt={cfg.system_prompt!r} cannot be loaded ({type(exc).__name__}: {exc}); "
                "expected module:function(one_shot) returning the system prompt"
            ) from None
        if not callable(prompt):
            raise ConfigError(f"hyperparameter system_prompt={cfg.system_prompt!r} is not callable; expected module:function")
    if getattr(ctx.args, "resume", False):
        ckpt_dir = prepared.ckpt_dir
        if (latest_complete_checkpoint(ckpt_dir) if ckpt_dir.is_dir() else None) is None:
            raise VcbmGymError(
                f"--resume: no complete checkpoint in {str(ckpt_dir)!r}; expected a run started with "
                "--checkpoint-every that saved at least once"
            )


def run(ctx: RunContext) -> dict[str, Any]:
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    import numpy as np
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from torch.utils.tensorboard import SummaryWriter

    from algorithms.llm.trainer import LoopTrainer, MultiTurnGRPOTrainer, latest_complete_checkpoint, logprob_memory_line

    log_dir = Path(ctx.log_dir)
    prepared = prepare(ctx)
    run_cfg, cfg, ckpt_dir = prepared.run_cfg, prepared.cfg, prepared.ckpt_dir
    needs = info_needs(getattr(cfg, "credit", None), getattr(cfg, "ratio_sharing", "none"))  # trl-grpo: neither
    check_env_reports(ctx.env_id, run_cfg.env_kwargs, needs, ctx.seed)
    main_process = cli.is_launch_main_process()
    if main_process:
        cli.atomic_write_text(
            log_dir / "loop_config.yml",
            yaml.safe_dump(
                {
                    **as_plain_dict(run_cfg),
                    **{k: _plain(getattr(cfg, k)) for k in _reported(ctx.algo) + ("use_vllm", "max_steps", "save_steps", "seed")},
                },
                sort_keys=False,
            ),
        )

    previous_threads = torch.get_num_threads()
    if run_cfg.torch_threads > 0:
        torch.set_num_threads(run_cfg.torch_threads)
    torch.manual_seed(ctx.seed)
    model, tokenizer = _model_and_tokenizer(run_cfg.model, ctx.seed, bool(cfg.bf16))
    task_seeds = np.random.default_rng(ctx.seed).integers(0, 2**31 - 1, size=run_cfg.n_tasks)
    dataset = Dataset.from_dict({"prompt": [str(int(s)) for s in task_seeds]})
    full = run_cfg.finetune == "full" or (run_cfg.finetune == "auto" and run_cfg.model in TINY_MODELS)
    peft_config = (
        None
        if full
        else LoraConfig(
            r=run_cfg.lora_r,
            lora_alpha=run_cfg.lora_alpha,
            lora_dropout=run_cfg.lora_dropout,
            target_modules=list(run_cfg.lora_target_modules),
            task_type="CAUSAL_LM",
        )
    )
    writer = SummaryWriter(str(log_dir)) if main_process else None
    trainer_class = MultiTurnGRPOTrainer if ctx.algo == "trl-grpo" else LoopTrainer
    trainer = trainer_class(
        model=model,
        args=cfg,
        train_dataset=dataset,
        processing_class=tokenizer,
        env_id=ctx.env_id,
        env_kwargs=run_cfg.env_kwargs,
        peft_config=peft_config,
        writer=writer,
    )
    vocab = getattr(getattr(trainer.model, "config", None), "vocab_size", None) or len(tokenizer)
    line = logprob_memory_line(
        trainer.episode_token_bound,
        int(vocab),
        cfg.per_device_train_batch_size,
        cfg.per_device_train_batch_size * cfg.steps_per_generation,
        bool(cfg.use_vllm),
    )
    state = trainer.accelerator.state
    world_size = trainer.accelerator.num_processes
    if trainer.accelerator.is_main_process:
        print(line, file=sys.stderr, flush=True)
        print(f"world size {world_size} ({state.distributed_type.value}, backend {state.backend})", file=sys.stderr, flush=True)
    if ctx.report is not None:
        from algorithms.llm.report import ReportIterations

        trainer.add_callback(ReportIterations(trainer, ctx.report))
    initial = {n: _full_tensor(p).clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    resume = getattr(ctx.args, "resume", False)
    checkpoint = latest_complete_checkpoint(ckpt_dir) if resume and ckpt_dir.is_dir() else None
    if resume and checkpoint is None:
        raise VcbmGymError(
            f"--resume: no complete checkpoint in {str(ckpt_dir)!r}; expected a run started with "
            "--checkpoint-every that saved at least once"
        )
    if checkpoint is not None and hasattr(trainer, "load_loop_checkpoint"):
        trainer.load_loop_checkpoint(checkpoint)
    try:
        trainer.train(resume_from_checkpoint=checkpoint)
    finally:
        if writer is not None:
            writer.close()
        torch.set_num_threads(previous_threads)
    save_final_weights(trainer, log_dir / ("model" if full else "adapter"))
    if main_process:
        cli.atomic_write_json(log_dir / "history.json", trainer.history)  # a benchmark reads it back
    delta = sum(float((_full_tensor(p) - initial[n]).pow(2).sum()) for n, p in trainer.model.named_parameters() if n in initial)
    final = trainer.history[-1] if trainer.history else {}
    rule = getattr(trainer, "credit_rule", None)
    return {
        "iterations_run": len(trainer.history),
        "world_size": world_size,
        "model_wrapper": type(trainer.model_wrapped).__name__,  # as trained: DistributedDataParallel on CPUs
        "resumed_from": checkpoint,
        "finetune": "full" if full else "lora",
        "trained_weight_change_l2": delta**0.5,
        "credit": getattr(cfg, "credit", None),
        "memory_size": rule.summary().get("memory_size", 0) if rule is not None else 0,
        **{f"final_{k}": v for k, v in final.items() if k not in ("iteration_time_s", "rollout_time_s", "credit_time_s")},
        "mean_iteration_time_s": float(np.mean([h["iteration_time_s"] for h in trainer.history])) if trainer.history else None,
        "mean_credit_time_s": float(np.mean([h.get("credit_time_s", 0.0) for h in trainer.history])) if trainer.history else None,
    }


def _full_tensor(param) -> Any:
    """A parameter as one plain tensor: FSDP2 holds each process's shard as a DTensor."""
    tensor = param.detach()
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def save_final_weights(trainer, folder: Path) -> None:
    """The trained model (or LoRA adapter) in `folder`, loadable by `from_pretrained` and algorithms.evaluate.

    Under FSDP with SHARDED_STATE_DICT (zoo_configs/accelerate/fsdp2.yaml), `Trainer.save_model`
    writes nothing, so the shards are gathered into one full state dict (accelerate's
    `get_state_dict`, a collective every process joins) and process 0 saves it.
    """
    from accelerate.utils import DistributedType

    accelerator = trainer.accelerator
    if accelerator.distributed_type != DistributedType.FSDP:
        trainer.save_model(str(folder))
        return
    state_dict = accelerator.get_state_dict(trainer.model)
    if accelerator.is_main_process:
        accelerator.unwrap_model(trainer.model).save_pretrained(str(folder), state_dict=state_dict)
        trainer.processing_class.save_pretrained(str(folder))
    accelerator.wait_for_everyone()


def _arm():
    from algorithms.common.module_arm import ITERATIONS, ModuleArm

    arm = ModuleArm(
        sys.modules[__name__],
        name="llm",
        budget_key="iterations",
        budget_flag="--iterations",
        budget_unit="iterations",
        objective=ITERATIONS,
        metric_tags={"correct": "loop/task_goal_completion", "return": "loop/mean_return"},
        reports_convergence=False,
        multi_process=True,
        resumes_itself=True,
    )
    arm.default_credit = lambda algo: CREDIT_OF_ALGO.get(algo, "none")
    return arm


ARM = _arm()
