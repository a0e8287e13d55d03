"""The env contract's error, in the lowest layer: wrappers here (DelayedReward) raise it, and vcbm_gym.contract
re-exports it with the checks that raise it there. The CLIs turn it into one `error:` line."""

from __future__ import annotations

from typing import Any

import gymnasium as gym

CONTRACT = "the env contract (ARCHITECTURE.md, 'The env contract'; check an env with vcbm_gym.contract.check_contract)"


class ContractError(ValueError):
    """An env does not report an `info` key the way the contract says (one line)."""


def env_name(env: gym.Env) -> str:
    spec = getattr(env, "spec", None)
    return repr(spec.id) if spec is not None else type(env.unwrapped).__name__


def non_finite_reward_message(env_name: str, reward: Any, where: str) -> str:
    """One line: the env paid a NaN or infinite reward at `where` (e.g. "step 3 of episode 1")."""
    return (
        f"env {env_name} returned reward {reward!r} at {where}: expected a finite number "
        f"(a NaN or infinite reward makes every return and mean after it NaN; see {CONTRACT})"
    )
