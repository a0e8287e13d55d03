"""What an LLM run builds from its resolved `RunSpec`: the trainer's config for this run's log dir, the
model and tokenizer, the LoRA config, the trainer itself, and after training the weights and summary."""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from algorithms.common import cli
from algorithms.common.config import as_plain_dict
from algorithms.common.errors import VcbmGymError
from algorithms.common.spec import RunSpec
from algorithms.llm.config import LLMConfig, LoopRunConfig
from algorithms.llm.resolve import plain, reported

CHECKPOINTS = "checkpoints"  # <log-dir>/checkpoints: the trainer's output dir
UNTIMED = ("iteration_time_s", "rollout_time_s", "credit_time_s")  # metrics the summary gives as means, not finals


def trainer_config_for_run(spec: RunSpec, log_dir: str | Path, progress: bool) -> Any:
    """The resolved trainer config with what the run decides itself: its output dir (<log-dir>/checkpoints),
    its seed and its progress bar. A shallow copy, not a rebuild (none of these enter GRPOConfig's derived
    fields), so the spec's own config stays as resolved for another run of it."""
    cfg = copy.copy(spec.config.trainer)
    cfg.output_dir = str(Path(log_dir) / CHECKPOINTS)
    cfg.seed = spec.seed
    cfg.disable_tqdm = not progress
    return cfg


def write_loop_config(log_dir: Path, algo: str, run_cfg: LoopRunConfig, cfg: Any) -> None:
    """loop_config.yml: the run's settings as the trainer reads them (with the budget it derived)."""
    trainer_keys = reported(algo) + ("use_vllm", "max_steps", "save_steps", "seed")
    settings = {**as_plain_dict(run_cfg), **{k: plain(getattr(cfg, k)) for k in trainer_keys}}
    cli.atomic_write_text(log_dir / "loop_config.yml", yaml.safe_dump(settings, sort_keys=False))


def model_and_tokenizer(name: str, seed: int, bf16: bool, env_id: str | None = None):
    if name in ("tiny", "tiny-random"):
        from algorithms.llm.model.env_registry import env_tiny_model

        env_model = env_tiny_model(env_id)  # an env whose words the shared tiny vocabulary lacks has models of its own
        if env_model is not None:
            return env_model.load(name, seed)
    if name == "tiny" and env_id == "TextThinkSolve-v0":  # its roles also write SEPO's rating (two_role/warm_start.py)
        from algorithms.llm.two_role.warm_start import warm_started_two_role

        return warm_started_two_role()
    if name == "tiny":
        from algorithms.llm.model.warm_start import warm_started_tiny

        return warm_started_tiny()
    if name == "tiny-random":
        from algorithms.llm.model.tiny import build_tiny

        return build_tiny(seed)
    import torch

    return pretrained(name, torch.bfloat16 if bf16 else torch.float32, "'tiny' or a local path / hub name")


def pretrained(name: str, dtype: Any, expected: str):
    """A Hugging Face causal LM and its tokenizer (a pad token where it has none); one line naming `name` and
    `expected` where it cannot be loaded."""
    from transformers import AutoModelForCausalLM

    from algorithms.llm.model.tiny import load_tokenizer

    try:
        tokenizer = load_tokenizer(name)
        model = AutoModelForCausalLM.from_pretrained(name, dtype=dtype)
    except (OSError, ValueError, KeyError) as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise VcbmGymError(f"model {name!r} could not be loaded ({first}); expected {expected}") from None
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return model, tokenizer


def lora_config(run_cfg: LoopRunConfig):
    """peft's LoraConfig of the run, or None when every parameter is trained."""
    if run_cfg.full_finetune:
        return None
    from peft import LoraConfig

    return LoraConfig(
        r=run_cfg.lora_r,
        lora_alpha=run_cfg.lora_alpha,
        lora_dropout=run_cfg.lora_dropout,
        target_modules=list(run_cfg.lora_target_modules),
        task_type="CAUSAL_LM",
    )


def build_trainer(spec: RunSpec, cfg: Any, writer: Any):
    """The run's trainer (LoopTrainer, MultiTurnGRPOTrainer for trl-grpo, TwoRoleTrainer for ccpo) on its model,
    task seeds and the credit rule, built here from the spec's recipe (`LLMConfig.slot`)."""
    import torch
    from datasets import Dataset

    from algorithms.llm.training.loop import LoopTrainer
    from algorithms.llm.training.trainer import MultiTurnGRPOTrainer

    config: LLMConfig = spec.config
    run_cfg = config.run
    torch.manual_seed(spec.seed)
    model, tokenizer = model_and_tokenizer(run_cfg.model, spec.seed, bool(cfg.bf16), spec.env)
    task_seeds = np.random.default_rng(spec.seed).integers(0, 2**31 - 1, size=run_cfg.n_tasks)
    dataset = Dataset.from_dict({"prompt": [str(int(s)) for s in task_seeds]})
    common = dict(
        model=model,
        args=cfg,
        train_dataset=dataset,
        processing_class=tokenizer,
        env_id=spec.env,
        env_kwargs=run_cfg.env_kwargs,
        peft_config=lora_config(run_cfg),
        writer=writer,
    )
    if spec.algo == "trl-grpo":
        return MultiTurnGRPOTrainer(**common)
    rule = config.slot.build(config.credit_fit)
    if spec.algo == "ccpo":  # two roles of one model: algorithms/llm/two_role/trainer.py
        from algorithms.llm.two_role.trainer import TwoRoleTrainer

        return TwoRoleTrainer(**common, credit_rule=rule)
    return LoopTrainer(**common, credit_rule=rule)


def announce(trainer: Any, cfg: Any) -> None:
    """Process 0 prints the log-prob memory estimate and the world size at start-up."""
    from algorithms.llm.training.metrics import logprob_memory_line

    vocab = getattr(getattr(trainer.model, "config", None), "vocab_size", None) or len(trainer.processing_class)
    line = logprob_memory_line(
        trainer.episode_token_bound,
        int(vocab),
        cfg.per_device_train_batch_size,
        cfg.per_device_train_batch_size * cfg.steps_per_generation,
        bool(cfg.use_vllm),
    )
    state = trainer.accelerator.state
    if trainer.accelerator.is_main_process:
        print(line, file=sys.stderr, flush=True)
        world = trainer.accelerator.num_processes
        print(f"world size {world} ({state.distributed_type.value}, backend {state.backend})", file=sys.stderr, flush=True)


def resume_checkpoint(ckpt_dir: Path) -> str:
    """The checkpoint --resume continues from; one line when there is none."""
    from algorithms.llm.training.checkpoints import latest_complete_checkpoint

    checkpoint = latest_complete_checkpoint(ckpt_dir) if ckpt_dir.is_dir() else None
    if checkpoint is None:
        raise VcbmGymError(
            f"--resume: no complete checkpoint in {str(ckpt_dir)!r}; expected a run started with "
            "--checkpoint-every that saved at least once"
        )
    return checkpoint


def full_tensor(param) -> Any:
    """A parameter as one plain tensor: FSDP2 holds each process's shard as a DTensor."""
    tensor = param.detach()
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def trainable_weights(trainer: Any) -> dict[str, Any]:
    """The trainable weights before training, in CPU memory. Under FSDP the Trainer leaves the model where it was
    loaded (the CPU) until training starts, then shards it onto the accelerator, so the weights compared at the
    end live on another device than these; on the CPU the copy also takes no accelerator memory."""
    return {n: full_tensor(p).to("cpu", copy=True) for n, p in trainer.model.named_parameters() if p.requires_grad}


def weight_change_l2(trainer: Any, initial: dict[str, Any]) -> float:
    """L2 norm of the trained weights' change from `initial` (trainable_weights before training), one whole
    parameter at a time on the CPU."""
    params = trainer.model.named_parameters()
    return sum(float((full_tensor(p).cpu() - initial[n]).pow(2).sum()) for n, p in params if n in initial) ** 0.5


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


def run_summary(trainer: Any, cfg: Any, run_cfg: LoopRunConfig, checkpoint: str | None, weight_change: float) -> dict[str, Any]:
    from algorithms.llm.training.metrics import rule_numbers

    history = trainer.history
    final = history[-1] if history else {}
    return {
        "iterations_run": len(history),
        "world_size": trainer.accelerator.num_processes,
        "model_wrapper": type(trainer.model_wrapped).__name__,  # as trained: DistributedDataParallel on CPUs
        "resumed_from": checkpoint,
        "finetune": "full" if run_cfg.full_finetune else "lora",
        "trained_weight_change_l2": weight_change,
        "credit": getattr(cfg, "credit", None),
        **rule_numbers(getattr(trainer, "credit_rule", None)),
        **{f"final_{k}": v for k, v in final.items() if k not in UNTIMED},
        "mean_iteration_time_s": float(np.mean([h["iteration_time_s"] for h in history])) if history else None,
        "mean_credit_time_s": float(np.mean([h.get("credit_time_s", 0.0) for h in history])) if history else None,
    }
