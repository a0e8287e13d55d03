"""The SB3 arm's engines: which library's classes train a run (hyperparameter `engine`).

- `sb3` (the default): Stable-Baselines3's own PyTorch classes, every algo of the arm.
- `sbx`: SBX (sbx-rl, Stable-Baselines3 in JAX) for SAC, TD3 and DQN. SBX's off-policy classes are SB3's
  OffPolicyAlgorithm with JAX networks: they take SB3's replay buffer classes and sample them as SB3 does, so the
  credit slot's RelabelingReplayBuffer (algorithms/sb3/buffers.py) plugs in unchanged, IRCR's heap and RRD's reward
  model with it. PPO and A2C stay on `sb3`: the on-policy credit callback (algorithms/sb3/callbacks.py) rewrites
  SB3's rollout buffer and reruns its GAE, which SBX's PPO (and SBX has no A2C) is not wired to here.

Each engine's class is the one source of its constructor defaults (the runner reads its signature), so a setting
only one library has (SB3's `target_update_interval`, SBX's `qf_learning_rate`) is known to that engine only.

Threads: JAX's CPU backend (XLA) reads its thread settings from `XLA_FLAGS` once per process, when jax starts;
`configure_jax` writes them from the run's `torch_threads` before sbx (and with it jax) is imported, so that one
setting keeps torch, numpy's BLAS and XLA to the run's cores: `torch_threads: 1` (the default) makes XLA single-threaded.
XLA's default, a thread per core, contends with an experiment's other workers as numpy's BLAS did
(benchmarks/sac_speed_levers.py). A credit rule that computes in JAX (RRD's `backend: jax`, vcbm_gym/credit/rrd_jax.py)
starts jax too, under either engine: the same settings go first (`rule_uses_jax`). RRD stays numpy under sbx unless
the run's credit_kwargs choose jax: on Hopper the JAX model measured no faster (vcbm_gym/credit/rrd.py says why).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any

from algorithms.common.config import load_object
from algorithms.common.errors import ConfigError
from algorithms.common.extras import require_extra

SB3, SBX = "sb3", "sbx"
ENGINES = (SB3, SBX)
# engine -> algo -> "module:Class"
AGENTS: dict[str, dict[str, str]] = {
    SB3: {
        "ppo": "stable_baselines3:PPO",
        "a2c": "stable_baselines3:A2C",
        "dqn": "stable_baselines3:DQN",
        "sac": "stable_baselines3:SAC",
        "td3": "stable_baselines3:TD3",
    },
    SBX: {"dqn": "sbx:DQN", "sac": "sbx:SAC", "td3": "sbx:TD3"},
}
# policy_kwargs the runner would turn from a name into a torch class: SBX's policies take flax / optax callables
TORCH_ONLY_POLICY_KWARGS = ("activation_fn", "optimizer_class")
# XLA's CPU backend on one thread: Eigen's thread pool off (XLA has no setting for a count between one and a thread
# per core; `intra_op_parallelism_threads=1` is the form TensorFlow's and JAX's users pass, which XLA tolerates)
SINGLE_THREAD_XLA = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"


def check_engine(engine: Any, algo: str) -> None:
    """A known engine that runs `algo`, and, for sbx, its installed extra; one line otherwise."""
    if engine not in ENGINES:
        raise ConfigError(f"hyperparameter engine={engine!r}: expected one of {', '.join(ENGINES)}")
    if algo not in AGENTS[engine]:
        takers = ", ".join(name for name, table in AGENTS.items() if algo in table)
        raise ConfigError(
            f"hyperparameter engine={engine!r} with --algo {algo}: engine {engine} runs --algo "
            f"{', '.join(AGENTS[engine])}; expected engine {takers} for {algo}"
        )
    if engine == SBX:
        require_extra("hyperparameter engine=sbx", "sbx")


def xla_flags(threads: int, current: str | None) -> str:
    """`current` XLA_FLAGS with XLA's CPU backend made single-threaded for `threads` 1 (more threads: XLA's own pool,
    a thread per core); a thread setting the user already put there is kept."""
    current = (current or "").strip()
    if threads != 1 or "xla_cpu_multi_thread_eigen" in current or "intra_op_parallelism_threads" in current:
        return current
    return f"{current} {SINGLE_THREAD_XLA}".strip()


def configure_jax(threads: int, device: str) -> None:
    """XLA's thread settings and, for device cpu, JAX's platform, while jax is not yet imported (XLA reads them once:
    a later call in a process that already imported jax changes nothing)."""
    if "jax" in sys.modules:
        return
    os.environ["XLA_FLAGS"] = xla_flags(threads, os.environ.get("XLA_FLAGS"))
    if device == "cpu":  # JAX would otherwise take a GPU it sees, whatever the run's device says
        os.environ.setdefault("JAX_PLATFORMS", "cpu")


def rule_uses_jax(credit: str, credit_kwargs: Any) -> bool:
    """Whether the run's credit rule computes in JAX (RRD with `backend: jax` in its credit_kwargs)."""
    options = credit_kwargs.get(credit) if isinstance(credit_kwargs, Mapping) else None
    return credit == "rrd" and isinstance(options, Mapping) and options.get("backend") == "jax"


def algo_class(algo: str, engine: str = SB3) -> type:
    return load_object(AGENTS[engine][algo])


def check_engine_settings(engine: str, device: Any, policy_kwargs: dict[str, Any] | None) -> None:
    """What SBX cannot honour, refused in one line: a CUDA device (JAX places its networks on its own platform,
    not torch's device) and policy_kwargs that name torch classes."""
    if engine != SBX:
        return
    if device not in ("cpu", "auto"):
        raise ConfigError(
            f"hyperparameter device={device!r} with engine=sbx: JAX, not torch, places SBX's networks; expected cpu "
            "(JAX on the CPU) or auto (JAX's own default platform)"
        )
    named = [key for key in TORCH_ONLY_POLICY_KWARGS if (policy_kwargs or {}).get(key) is not None]
    if named:
        raise ConfigError(
            f"hyperparameter policy_kwargs.{named[0]}={policy_kwargs[named[0]]!r} with engine=sbx: SBX's policies take a "
            "flax / optax function, not a torch class; expected it unset (SBX's default) or engine=sb3"
        )


def trained_on(model: Any, engine: str) -> str:
    """The device the model trained on: torch's for sb3, JAX's platform for sbx."""
    if engine != SBX:
        return str(model.device)
    import jax

    return f"jax:{jax.default_backend()}"
