"""An LLM run resolved once: a flat mapping of hyperparameters -> `RunSpec` holding the plain values that
config.yml records (`hyperparams`) and the typed configs built from them (`config`; the run builds the credit
rule from their recipe).

Each config is built here once per run: `LoopRunConfig` and the trainer's config (`LoopConfig` for
loop / vcbm-loop, `TwoRoleConfig` for ccpo, `MultiTurnGRPOConfig` for trl-grpo, with the budget it derives from `iterations`),
and the credit rule. The run later sets only what it decides itself (output dir, seed, progress bar).
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping
from typing import Any

from algorithms.common import cli
from algorithms.common.config import as_plain_dict, build_dataclasses, coerce_value, on_this_machine
from algorithms.common.errors import ConfigError, VcbmGymError
from algorithms.common.spec import RunSpec
from algorithms.llm.config import DEFAULT_CREDIT, LLMConfig, LoopConfig, LoopRunConfig, MultiTurnGRPOConfig
from algorithms.llm.two_role.config import TWO_ROLE_DEFAULT, TwoRoleConfig

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
# Trainer-config fields the run sets itself (from what), refused as hyperparameters.
RUN_SET = {
    "output_dir": "<log-dir>/checkpoints",
    "seed": "--seed",
    "disable_tqdm": "--no-progress",
    "use_cpu": "whether the machine has a CUDA GPU",
    "max_steps": "iterations x num_iterations",
    "save_strategy": "checkpoint_every",
    "save_steps": "checkpoint_every",
    "logging_steps": "one log per iteration",
}
OUTPUT_DIR_UNSET = "<log-dir>/checkpoints (set by the run)"
# Trainer-config fields always written to config.yml (the other fields only when set)
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
RUN_KEYS = frozenset(f.name for f in dataclasses.fields(LoopRunConfig))
# Each algo's own credit when no config names one: LOOP's rules, and ccpo's two-role rule (two_role/config.py)
OWN_CREDIT = {**DEFAULT_CREDIT, "ccpo": TWO_ROLE_DEFAULT}
TWO_ROLE_REPORTED = ("objective", "role_schedule", "switch_every")


def trainer_config_class(algo: str) -> type[MultiTurnGRPOConfig]:
    if algo == "ccpo":
        return TwoRoleConfig
    return MultiTurnGRPOConfig if algo == "trl-grpo" else LoopConfig


def reported(algo: str) -> tuple[str, ...]:
    """The trainer-config fields config.yml records for `algo` (trl-grpo: TRL's objective's, not LOOP's)."""
    if algo == "ccpo":
        return REPORTED + TWO_ROLE_REPORTED
    if algo != "trl-grpo":
        return REPORTED
    loop_only = {f.name for f in dataclasses.fields(LoopConfig)} - {f.name for f in dataclasses.fields(MultiTurnGRPOConfig)}
    return tuple(k for k in REPORTED if k not in loop_only) + ("beta", "loss_type", "scale_rewards")


def plain(value: Any) -> Any:
    return value.value if isinstance(value, enum.Enum) else value


def resolve(algo: str, env_id: str, seed: int, mapping: Mapping[str, Any]) -> RunSpec:
    """Check `mapping` (one line for an unknown key, a wrong type or value, a refused rule) and build the run."""
    mapping = settled_mapping(algo, mapping)
    run_cfg, trainer_cfg = build_configs(algo, seed, mapping)  # LoopConfig checks its rule's class
    config = LLMConfig(run_cfg, trainer_cfg)
    if getattr(trainer_cfg, "beta", 0.0) and run_cfg.model == "tiny-random" and run_cfg.full_finetune:
        raise ConfigError(
            f"beta={trainer_cfg.beta}: the KL penalty's reference is loaded from the policy's folder, and tiny-random "
            "is built in memory; expected --model tiny, a saved model's folder, LoRA (finetune=lora) or beta 0"
        )
    if config.slot is not None:  # built dry, as every arm does: a bad argument is one line before anything is written
        try:
            config.slot.build(config.credit_fit)
        except ValueError as exc:
            raise ConfigError(f"algo {algo!r}: {exc}") from None
        check_branch_env(config.slot.credit, env_id, run_cfg.env_kwargs)
    hyperparams = as_plain_dict(run_cfg)
    for name in list(reported(algo)) + [k for k in mapping if k not in hyperparams]:
        hyperparams[name] = plain(getattr(trainer_cfg, name))
    return RunSpec(algo, env_id, seed, hyperparams, config)


def check_branch_env(credit: str, env_id: str, env_kwargs: Mapping[str, Any]) -> None:
    """A branch-based credit rule (vineppo, rice: vcbm_gym/credit/branch.py) restarts continuations from env snapshots:
    an env without the snapshot protocol (envs/snapshot.py) is one ConfigError line, before anything is written. An env
    class without snapshot()/restore() is refused from its registration alone (AppWorld's is never started); any other
    is made once and its wrapper chain checked (`snapshot_problem`)."""
    from vcbm_gym.credit.base import NO_CREDIT
    from vcbm_gym.credit.branch import BranchRule
    from vcbm_gym.credit.registry import rule_class

    if credit == NO_CREDIT or not issubclass(rule_class(credit), BranchRule):
        return
    import gymnasium as gym

    import vcbm_gym  # noqa: F401  (registers the envs)
    from envs.snapshot import GYMNASIUM_ENV_FIELDS, snapshot_problem

    try:
        entry = gym.spec(env_id).entry_point
    except gym.error.Error:
        return  # an unknown env id: the run's own check names it
    cls = gym.envs.registration.load_env_creator(entry) if isinstance(entry, str) else entry
    if isinstance(cls, type) and not (hasattr(cls, "snapshot") and hasattr(cls, "restore")) and cls not in GYMNASIUM_ENV_FIELDS:
        problem = f"env {cls.__name__} offers no snapshot()/restore() (envs.snapshot.Snapshotable)"
    else:
        env = gym.make(env_id, **env_kwargs)
        try:
            problem = snapshot_problem(env)
        finally:
            env.close()
    if problem is not None:
        raise ConfigError(
            f"credit={credit!r} on {env_id}: {problem}; expected an env with the snapshot protocol (envs/snapshot.py), "
            "which this rule's continuations restart from"
        )


def settled_mapping(algo: str, mapping: Mapping[str, Any]) -> dict[str, Any]:
    """The mapping as the configs will read it: the algo's credit rule, this machine's cpu_overrides, the
    per-process batch; keys of the earlier credit shape and keys the run sets itself are refused."""
    mapping = dict(mapping)
    moved = [k for k in mapping if k in MOVED_KEYS]
    if moved:
        new = ", ".join(f"{MOVED_KEYS[k]}: {mapping[k]!r}" for k in moved)
        raise ConfigError(
            f"hyperparameters {', '.join(moved)} for algo {algo!r}: the credit rule's settings moved; "
            f"expected credit: vcbm_blend and credit_kwargs: {{vcbm_blend: {{{new}}}}}"
        )
    set_by_run = [k for k in mapping if k in RUN_SET]
    if set_by_run:
        key = set_by_run[0]
        raise ConfigError(
            f"hyperparameter {key}={mapping[key]!r} for algo {algo!r}: the run sets it ({RUN_SET[key]}); expected no {key}"
        )
    if algo in OWN_CREDIT:
        mapping.setdefault("credit", OWN_CREDIT[algo])
    elif "credit" in mapping or "credit_kwargs" in mapping:
        raise ConfigError(
            f"credit={mapping.get('credit')!r} for algo {algo!r}: trl-grpo keeps TRL's own group advantage; "
            f"expected --algo loop or vcbm-loop for a credit rule"
        )
    if algo not in OWN_CREDIT and "objective" in mapping:
        raise ConfigError(
            f"objective={mapping['objective']!r} for algo {algo!r}: trl-grpo keeps TRL's own loss; expected --algo loop "
            "or vcbm-loop, or TRL's own importance_sampling_level: sequence (its GSPO)"
        )
    on_this_machine(mapping)  # a mapping given whole (train.resolve_spec folds each of its layers first)
    share_batch(mapping, cli.launch_world_size(), algo)
    return mapping


def build_configs(algo: str, seed: int, mapping: dict[str, Any]) -> tuple[LoopRunConfig, MultiTurnGRPOConfig]:
    """LoopRunConfig and the trainer's config, each built once, the trainer's with the budget it derives
    from the run's: `iterations` generation batches of `num_iterations` optimizer steps each."""
    import torch

    owner = f"algo {algo!r}"
    config_class = trainer_config_class(algo)

    def value(key: str, cls: type) -> int:  # as the config will read it (a bad one: the config's own line)
        return coerce_value(key, mapping[key], int, owner) if key in mapping else getattr(cls, key)

    iterations, every = value("iterations", LoopRunConfig), value("checkpoint_every", LoopRunConfig)
    per_iteration = value("num_iterations", config_class)
    derived = {
        "output_dir": OUTPUT_DIR_UNSET,
        "seed": seed,
        "use_cpu": not torch.cuda.is_available(),
        "max_steps": iterations * per_iteration,
        "save_strategy": "steps" if every else "no",
        "save_steps": max(every, 1) * per_iteration,
        "logging_steps": per_iteration,
    }
    try:
        run_cfg, trainer_cfg = build_dataclasses({**mapping, **derived}, [LoopRunConfig, config_class], owner)
    except ValueError as exc:
        if isinstance(exc, VcbmGymError):
            raise
        raise ConfigError(f"{owner}: {exc}") from None
    return run_cfg, trainer_cfg


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
