"""The SB3 arm's checks, made when a run is resolved, before its log dir exists: each constructor argument against
SB3's own default and the ranges SB3 leaves unchecked, the torch device, the env's spaces against what the algorithm
takes, the buffers against this machine's memory, the credit rule against this arm's batches, and policy_kwargs
against the policy class. Each refusal is one ConfigError line naming the value and what was expected."""

from __future__ import annotations

import functools
import importlib
import inspect
import math
import os
from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.preprocessing import get_action_dim, get_obs_shape

from algorithms.common.config import coerce_value, load_object
from algorithms.common.credit_slot import assign_credit
from algorithms.common.errors import ConfigError
from algorithms.common.validation import (
    AT_LEAST_ONE,
    NON_NEGATIVE,
    POSITIVE,
    UNIT,
    Range,
    check_finite,
    check_value,
)
from algorithms.sb3.buffers import RelabelingReplayBuffer
from algorithms.sb3.callbacks import in_space_shape, rollout_episode_batch
from vcbm_gym.credit.base import CreditRule
from vcbm_gym.credit.model_training import LessonBuffer

# Arguments that must be integers although a float would pass SB3's own annotations unnoticed.
INTEGER_ARGS = {
    "n_steps",
    "batch_size",
    "n_epochs",
    "buffer_size",
    "learning_starts",
    "gradient_steps",
    "target_update_interval",
    "stats_window_size",
    "sde_sample_freq",
    "policy_delay",
}
# Ranges of the common arguments; SB3 checks few of them and fails late or silently on the rest.
ARG_RANGES = {
    "learning_rate": POSITIVE, "n_steps": AT_LEAST_ONE, "batch_size": AT_LEAST_ONE, "n_epochs": AT_LEAST_ONE,
    "gamma": UNIT, "gae_lambda": UNIT, "clip_range": POSITIVE, "clip_range_vf": Range(0, lo_open=True, optional=True),
    "ent_coef": NON_NEGATIVE, "vf_coef": NON_NEGATIVE, "max_grad_norm": POSITIVE,
    "target_kl": Range(0, lo_open=True, optional=True), "rms_prop_eps": POSITIVE, "buffer_size": AT_LEAST_ONE,
    "learning_starts": NON_NEGATIVE, "tau": UNIT, "gradient_steps": Range(-1), "target_update_interval": AT_LEAST_ONE,
    "exploration_fraction": UNIT, "exploration_initial_eps": UNIT, "exploration_final_eps": UNIT,
    "stats_window_size": AT_LEAST_ONE, "policy_delay": AT_LEAST_ONE, "target_policy_noise": NON_NEGATIVE,
    "target_noise_clip": NON_NEGATIVE,
}  # fmt: skip


# Arguments SB3 also takes as a schedule of the remaining progress; in a config, rl-zoo3's notation
# "lin_<start>" for a linear decay from <start> to 0 over the run's step budget (max_episodes x episode steps)
SCHEDULED_ARGS = ("learning_rate", "clip_range")
LINEAR_PREFIX = "lin_"


def linear_start(name: str, value: str) -> float:
    """The start of a "lin_<start>" schedule, checked like the constant it replaces (one line naming it)."""
    try:
        start = float(value.removeprefix(LINEAR_PREFIX)) if value.startswith(LINEAR_PREFIX) else None
    except ValueError:
        start = None
    if start is None or not ARG_RANGES[name].contains(start):
        raise ConfigError(
            f"hyperparameter {name}={value!r}: expected {ARG_RANGES[name].describe()}, or '{LINEAR_PREFIX}<such a "
            "number>' for a linear decay from it to 0 over the run"
        )
    return start


def _number(value: Any) -> float | None:
    """`value` as a finite float (an int or float, or a string of one), else None."""
    if isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _ent_coef(value: Any) -> Any:
    """SAC's entropy coefficient as SB3 reads it: a fixed number >= 0, "auto" (learned, from 1), or "auto_<init>"
    (learned, from init > 0)."""
    if value == "auto" or (isinstance(value, str) and value.startswith("auto_") and (_number(value[5:]) or 0.0) > 0):
        return value
    if not isinstance(value, str) and NON_NEGATIVE.contains(value):
        return float(value)
    raise ConfigError(
        f"hyperparameter ent_coef={value!r}: expected a finite number >= 0, 'auto' (learned), or 'auto_<x>' "
        "(learned, starting from a number x > 0)"
    )


def _target_entropy(value: Any) -> Any:
    """SAC's target entropy: "auto" (minus the action dimension) or a finite number."""
    if value == "auto":
        return value
    if isinstance(value, str) or _number(value) is None:
        raise ConfigError(f"hyperparameter target_entropy={value!r}: expected 'auto' or a finite number")
    return float(value)


def _train_freq(value: Any) -> Any:
    """The off-policy algorithms' update frequency: an integer >= 1 (steps), or [n, "step" | "episode"] (a list, as
    config.yml records it; `sb3_schedules` hands SB3 the tuple it expects)."""
    count, unit = (value[0], value[1]) if isinstance(value, (list, tuple)) and len(value) == 2 else (value, "step")
    whole = not isinstance(count, bool) and isinstance(count, (int, float)) and _number(count) is not None
    if not whole or int(count) != count or count < 1 or unit not in TRAIN_FREQ_UNITS:
        raise ConfigError(
            f"hyperparameter train_freq={value!r}: expected an integer >= 1 (env steps), or [n, unit] with an integer "
            f"n >= 1 and unit one of {', '.join(TRAIN_FREQ_UNITS)}"
        )
    return int(count) if not isinstance(value, (list, tuple)) else [int(count), unit]


def _action_noise(value: Any) -> Any:
    if value is not None:
        raise ConfigError(
            f"hyperparameter action_noise={value!r}: expected null (SB3 takes an ActionNoise object, which a config "
            "cannot hold; TD3 and SAC explore without one: TD3 through target_policy_noise, SAC through its entropy)"
        )
    return value


TRAIN_FREQ_UNITS = ("step", "episode")
# Arguments SB3 takes as a string or a number (or a pair), checked in every form SB3 accepts: config.yml records
# the value as given, and a rerun from that file must resolve to the same run.
MIXED_ARGS = {"ent_coef": _ent_coef, "target_entropy": _target_entropy, "train_freq": _train_freq, "action_noise": _action_noise}


def coerce_arg(name: str, value: Any, default: Any, owner: str) -> Any:
    # PPO's and A2C's ent_coef is a number only (their default is one); SAC's default is the string "auto"
    if name in MIXED_ARGS and (name != "ent_coef" or isinstance(default, str)):
        return MIXED_ARGS[name](value)
    if name in SCHEDULED_ARGS and isinstance(value, str):
        linear_start(name, value)  # kept as written: config.yml and the config hash record the plain string
        return value
    check_finite(name, value)
    if isinstance(default, bool) or name in INTEGER_ARGS:
        kind = bool if isinstance(default, bool) else int
        value = coerce_value(name, value, kind, owner)
    elif isinstance(default, float) and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if name in ARG_RANGES:
        check_value(name, value, ARG_RANGES[name])
    return value


def check_device(device: Any) -> None:
    """The run's torch device, before anything is built: SB3 would train a run that asked for an absent CUDA device on
    the CPU without a word (get_device), and torch refuses a malformed name with a traceback-sized message."""
    expected = "expected cpu, cuda, cuda:<index> or auto (cuda when available, else cpu)"
    try:
        parsed = torch.device(device) if isinstance(device, str) and device != "auto" else None
    except RuntimeError:
        parsed = None
    if device == "auto":
        return
    if parsed is None or parsed.type not in ("cpu", "cuda"):
        raise ConfigError(f"hyperparameter device={device!r}: {expected}")
    if parsed.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"hyperparameter device={device!r}: no CUDA device is available; expected cpu or auto")
    if parsed.type == "cuda" and parsed.index is not None and parsed.index >= torch.cuda.device_count():
        raise ConfigError(
            f"hyperparameter device={device!r}: this machine has {torch.cuda.device_count()} CUDA device(s); "
            f"expected cuda:0 to cuda:{torch.cuda.device_count() - 1}, cpu or auto"
        )


class _SpacesNamed(Exception):
    """Carries the action spaces an SB3 algorithm passed to BaseAlgorithm.__init__ out of its constructor."""


@functools.cache
def supported_action_spaces(algo_cls: type) -> tuple[type, ...] | None:
    """The action space classes SB3's `algo_cls` accepts, read from SB3 itself. Each algorithm hands them to
    BaseAlgorithm.__init__ (`supported_action_spaces`) and keeps them nowhere, so a subclass whose method order puts
    a recorder just before BaseAlgorithm runs the algorithm's own constructor up to that call, without an env,
    a policy or a buffer."""

    class Recorder(BaseAlgorithm):
        def __init__(self, *args: Any, supported_action_spaces: tuple[type, ...] | None = None, **kwargs: Any) -> None:
            raise _SpacesNamed(supported_action_spaces)

    probe = type(f"{algo_cls.__name__}Spaces", (algo_cls, Recorder), {})
    try:
        probe("MlpPolicy", None)
    except _SpacesNamed as named:
        return named.args[0]
    return None


def space_text(space: gym.Space) -> str:
    return str(space) if len(str(space)) <= 80 else type(space).__name__


def check_spaces(algo: str, algo_cls: type, env_id: str, env: gym.Env, agents: Mapping[str, str]) -> None:
    """The env's action and observation spaces against what SB3's algorithm takes (its own declarations and
    preprocessing), when the run is resolved: SB3's assertion would otherwise surface as refused hyperparameters
    after an experiment's workers started. `agents` (the arm's algo -> "module:Class") names the algos that would
    take the env's actions."""
    supported = supported_action_spaces(algo_cls)
    if supported is not None and not isinstance(env.action_space, supported):
        names = " or ".join(cls.__name__ for cls in supported)
        takers = [
            name for name in agents if isinstance(env.action_space, supported_action_spaces(load_object(agents[name])) or ())
        ]
        other = f", or one of --algo {', '.join(takers)} on {env_id}" if takers else " (no SB3 algo takes these actions)"
        raise ConfigError(
            f"--algo {algo} needs a {names} action space; {env_id} has {space_text(env.action_space)}: expected an "
            f"env with a {names} action space{other}"
        )
    for kind, space, read in (
        ("observation", env.observation_space, get_obs_shape),
        ("action", env.action_space, get_action_dim),
    ):
        try:
            read(space)
        except (NotImplementedError, AssertionError) as exc:
            raise ConfigError(
                f"--algo {algo} cannot take {env_id}'s {kind} space {space_text(space)} ({exc}); expected an env whose "
                f"{kind}s are a Box, Discrete, MultiDiscrete or MultiBinary space (or a Dict of them, for observations)"
            ) from None


def memory_bytes() -> int:
    """This machine's physical memory: the bound on one buffer (SB3 allocates its buffers whole, up front)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not POSIX: no bound
        return 2**63


def _space_bytes(space: gym.Space) -> int:
    """Bytes one observation or action takes in an SB3 buffer (stored in the space's dtype)."""
    if isinstance(space, gym.spaces.Dict):
        return sum(_space_bytes(sub) for sub in space.spaces.values())
    if isinstance(space, gym.spaces.Discrete):
        return np.dtype(space.dtype).itemsize
    shape = space.shape or ()
    return int(np.prod(shape, dtype=np.int64)) * np.dtype(space.dtype or np.float32).itemsize


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if n < 1024 or unit == "PiB":
            return f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} PiB"


def lesson_buffer_bytes(rule: CreditRule | None, steps: int) -> int:
    """What a credit rule's lesson buffer (RRD's and RUDDER's `LessonBuffer`, vcbm_gym/credit/model_training.py)
    comes to once its episodes are `steps` long: capacity x steps x features in float32, each entry's length and
    return, and the copy np.pad makes while it widens its rows (the old rows live beside the new)."""
    buffer = getattr(rule, "buffer", None)
    if not isinstance(buffer, LessonBuffer):
        return 0
    capacity, width = buffer.capacity, buffer.features.shape[2]
    itemsize = buffer.features.itemsize
    return capacity * (steps * width * itemsize + buffer.lengths.itemsize + buffer.returns.itemsize) + capacity * width * itemsize


def check_buffer_memory(
    off_policy: bool,
    n_envs: int,
    kwargs: dict[str, Any],
    env: gym.Env,
    rule: CreditRule | None = None,
    steps: int = 1,
) -> None:
    """Refuse a rollout or replay buffer, with the credit rule's lesson buffer beside it, larger than this machine's
    memory, before SB3 allocates it: numpy's "Unable to allocate 1.1 PiB" would otherwise be a traceback (or, below
    the overcommit limit, a run that swaps or is killed far into training, where the lesson buffer grows)."""
    obs, action = _space_bytes(env.observation_space), _space_bytes(env.action_space)
    if off_policy:
        # observations and next observations, actions, then rewards, dones and timeouts (float32)
        rows, per_row, what = kwargs["buffer_size"], 2 * obs + action + 3 * 4, f"buffer_size={kwargs['buffer_size']}"
        fix = "a smaller buffer_size"
    else:
        # observations, actions (float32), then rewards, returns, episode starts, values, log-probs, advantages
        rows = kwargs["n_steps"] * n_envs
        per_row = obs + 4 * get_action_dim(env.action_space) + 6 * 4
        what, fix = f"n_steps={kwargs['n_steps']} x n_envs={n_envs}", "a smaller n_steps (or n_envs)"
    kind = "replay" if off_policy else "rollout"
    need, lesson, have = rows * per_row, lesson_buffer_bytes(rule, steps), memory_bytes()
    if lesson and need + lesson > have:
        capacity = rule.buffer.capacity
        raise ConfigError(
            f"credit_kwargs[{rule.name!r}] buffer_capacity={capacity}: the rule's lesson buffer would need "
            f"{_human(lesson)} ({capacity} episodes x {steps} steps x {rule.buffer.features.shape[2]} features), and the "
            f"{kind} buffer ({what}) {_human(need)}, more than this machine's {_human(have)} of memory together; "
            f"expected a smaller buffer_capacity or {fix}"
        )
    if need > have:
        raise ConfigError(
            f"hyperparameters {what}: the {kind} buffer would need {_human(need)}, more than this machine's "
            f"{_human(have)} of memory; expected {fix}"
        )


def check_rule_reads_batches(algo: str, rule: CreditRule, env_id: str, env: gym.Env, off_policy: bool) -> None:
    """Hand the dry-built rule one episode of one step, stored and assembled by this arm's own code (the replay
    buffer's, or the rollout callback's), so that a rule that cannot read the arm's batches (their shapes, their
    dtypes) is refused in one line before anything is written, not far into the run."""
    obs, next_obs = env.observation_space.sample(), env.observation_space.sample()
    action = env.action_space.sample()
    try:
        if off_policy:
            buffer = RelabelingReplayBuffer(2, env.observation_space, env.action_space, device="cpu", rule=rule)
            buffer.add(np.array([obs]), np.array([next_obs]), np.array([action]), np.zeros(1), np.ones(1), [{}])
        else:
            stored = np.asarray(obs, dtype=np.float32).reshape((1, 1, *get_obs_shape(env.observation_space)))
            acts = np.asarray(action, dtype=np.float32).reshape((1, 1, get_action_dim(env.action_space)))
            zeros = np.zeros((1, 1), dtype=np.float32)
            observations = in_space_shape(stored, env.observation_space, 2)
            assign_credit(rule, rollout_episode_batch([(0, 0, 1)], zeros, observations, acts, zeros, zeros))
    except (ValueError, TypeError, IndexError, KeyError) as exc:
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        raise ConfigError(
            f"credit rule {rule.name!r} with --algo {algo} on {env_id}: the rule cannot read this arm's episodes "
            f"({type(exc).__name__}: {first}); expected a rule whose features fit {env_id}'s observation space "
            f"{space_text(env.observation_space)} and action space {space_text(env.action_space)}"
        ) from None


# policy_kwargs that SB3 takes as a torch class, written in a config by name (rl-zoo3's "nn.ReLU" too): config.yml
# records the name, which a class would not survive
TORCH_CLASS_KWARGS = {"activation_fn": ("torch.nn", torch.nn.Module), "optimizer_class": ("torch.optim", torch.optim.Optimizer)}


def torch_class(key: str, name: str, module: str, base: type) -> type:
    """The class `name` ("ReLU", "nn.ReLU" or "torch.nn.ReLU") of torch module `module`, a subclass of `base`."""
    short = module.rpartition(".")[2]
    attr = name.removeprefix(f"{module}.").removeprefix(f"{short}.")
    found = getattr(importlib.import_module(module), attr, None) if attr.isidentifier() else None
    if not (isinstance(found, type) and issubclass(found, base)):
        raise ConfigError(
            f"hyperparameter policy_kwargs.{key}={name!r}: expected the name of a {module} class, e.g. "
            f"{'ReLU or nn.Tanh' if short == 'nn' else 'Adam or torch.optim.RMSprop'}"
        )
    return found


def with_torch_classes(policy_kwargs: dict[str, Any] | None) -> dict[str, Any] | None:
    """policy_kwargs with each class written by name made the class SB3 takes."""
    if not policy_kwargs:
        return policy_kwargs
    out = dict(policy_kwargs)
    for key, (module, base) in TORCH_CLASS_KWARGS.items():
        if isinstance(out.get(key), str):
            out[key] = torch_class(key, out[key], module, base)
    return out


def check_policy_kwargs(algo_cls: type, policy: str, policy_kwargs: dict[str, Any] | None) -> None:
    """policy_kwargs against the policy class's own constructor, and net_arch's layer widths, with their name."""
    if not policy_kwargs:
        return
    policy_cls = algo_cls.policy_aliases.get(policy) if isinstance(policy, str) else policy
    if policy_cls is None:
        raise ConfigError(f"hyperparameter policy={policy!r}: expected one of: {', '.join(algo_cls.policy_aliases)}")
    params = inspect.signature(policy_cls.__init__).parameters
    if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        allowed = [n for n in params if n not in ("self", "observation_space", "action_space", "lr_schedule")]
        unknown = [key for key in policy_kwargs if key not in allowed]
        if unknown:
            raise ConfigError(
                f"hyperparameter policy_kwargs={policy_kwargs!r}: unknown key {unknown[0]!r} for {policy_cls.__name__}; "
                f"expected some of: {', '.join(allowed)}"
            )
    for key, (module, base) in TORCH_CLASS_KWARGS.items():
        if isinstance(policy_kwargs.get(key), str):
            torch_class(key, policy_kwargs[key], module, base)
    arch = policy_kwargs.get("net_arch")
    layers = list(arch.values()) if isinstance(arch, dict) else [arch]
    widths_ok = arch is None or all(
        isinstance(layer, (list, tuple)) and all(isinstance(w, int) and not isinstance(w, bool) and w >= 1 for w in layer)
        for layer in layers
    )
    if not widths_ok or (isinstance(arch, dict) and not set(arch) <= {"pi", "vf", "qf"}):
        raise ConfigError(
            f"hyperparameter policy_kwargs.net_arch={arch!r}: expected a list of layer widths (integers >= 1), "
            "or {pi: [...], vf: [...]} of such lists"
        )
