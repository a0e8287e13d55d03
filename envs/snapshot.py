"""Snapshot and branch: an optional env protocol, for credit measured by replaying continuations.

An env that offers it has, on its unwrapped instance (`Snapshotable`):

- `snapshot() -> EnvSnapshot`: the whole state of the env now, episode and generators included: an opaque,
  immutable, picklable value (the state pickled to bytes, so nothing in it aliases the live env, and
  restoring one snapshot twice gives two identical starts);
- `restore(state, outcome_seed=None)`: put the env back in that state. With `outcome_seed=None` the env
  continues exactly as it would have from there: the same actions give the same observations, rewards,
  terminations and infos. With an integer, the past stays (everything the episode has revealed) and what it
  has not revealed yet, its *outcome*, is drawn afresh from a generator seeded with `outcome_seed`, so
  continuations restored with different seeds are independent draws of the rest of the episode (the
  K continuations of replay credit or VinePPO). The reset-option `outcome_seed` of the text envs
  (`WatchTextEnv.reset_outcome`) is the same idea at the start of an episode. What later episodes draw
  after an outcome-seeded restore is each env's own business (its docstring says).

Gymnasium has no such API (its maintainers point to pickling the env, Gymnasium issue #94; ALE's
`clone_state`/`restore_state` and MuJoCo's `set_state` are per-family). A wrapped env holds state in its
wrappers too (TimeLimit's step count, DelayedReward's held-back reward), which `env.unwrapped.snapshot()`
cannot see; and in Gymnasium 1.x a wrapper no longer forwards unknown attributes, so `env.snapshot()` on a
wrapped env is an AttributeError rather than a silently partial snapshot. Call the protocol through
`snapshot(env)` / `restore(env, state, outcome_seed)` here, on the env you step: they walk the wrapper chain,
capture each wrapper's own fields (`WRAPPER_FIELDS`, or a wrapper's `snapshot_fields`), and refuse with one
line a wrapper whose state they do not know. They also cover Gymnasium's classic-control envs
(`GYMNASIUM_ENV_FIELDS`), whose state is a few attributes and their generator: so the `Delayed<id>` envs
branch through `snapshot(env)` although CartPole itself has no `snapshot()`.

A state is a pickle, so restore only states this process (or one you trust) took: unpickling runs code.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import gymnasium as gym
import numpy as np
from gymnasium.envs.classic_control import AcrobotEnv, CartPoleEnv, MountainCarEnv, PendulumEnv
from gymnasium.wrappers import OrderEnforcing, PassiveEnvChecker, TimeLimit

# Gymnasium's own generator fields (gym.Env.np_random and its seed): part of every env's state.
GENERATOR_FIELDS = ("_np_random", "_np_random_seed")
WRAPPER_FIELDS: dict[type, tuple[str, ...]] = {
    TimeLimit: ("_elapsed_steps",),
    OrderEnforcing: ("_has_reset",),
    PassiveEnvChecker: (),  # its flags only record which one-time checks already ran
}
# Gymnasium envs that do not offer the protocol but keep their whole state in these attributes (and their
# generator): the classic-control tasks behind the Delayed<id> envs.
GYMNASIUM_ENV_FIELDS: dict[type, tuple[str, ...]] = {
    CartPoleEnv: ("state", "steps_beyond_terminated"),
    AcrobotEnv: ("state",),
    MountainCarEnv: ("state",),
    PendulumEnv: ("state", "last_u"),
}


class SnapshotError(ValueError):
    """A state that is not a snapshot of this env, or an env (or wrapper) that cannot be snapshotted (one line)."""


@dataclass(frozen=True)
class EnvSnapshot:
    """An unwrapped env's state: `owner` names the env and its parameters, `payload` is the pickled state."""

    owner: str
    payload: bytes

    def __repr__(self) -> str:
        return f"EnvSnapshot({self.owner}, {len(self.payload)} bytes)"


@dataclass(frozen=True)
class ChainSnapshot:
    """A wrapped env's state: each wrapper's fields (outermost first) and the unwrapped env's snapshot."""

    wrappers: tuple[tuple[str, bytes], ...]
    env: EnvSnapshot

    def __repr__(self) -> str:
        return f"ChainSnapshot({' > '.join(name for name, _ in self.wrappers) or 'no wrappers'} > {self.env!r})"


@runtime_checkable
class Snapshotable(Protocol):
    """The protocol, on an unwrapped env (module docstring)."""

    def snapshot(self) -> EnvSnapshot: ...

    def restore(self, state: EnvSnapshot, outcome_seed: int | None = None) -> None: ...


def check_outcome_seed(outcome_seed: Any) -> int | None:
    """None, or the seed as an int; one line for anything else."""
    if outcome_seed is None:
        return None
    if isinstance(outcome_seed, bool) or not isinstance(outcome_seed, (int, np.integer)) or outcome_seed < 0:
        raise SnapshotError(f"outcome_seed={outcome_seed!r}: expected None (the same outcome) or an integer >= 0")
    return int(outcome_seed)


def outcome_generator(outcome_seed: int | None) -> np.random.Generator | None:
    """A fresh generator for the unrevealed outcome (None: keep the snapshot's generators)."""
    seed = check_outcome_seed(outcome_seed)
    return None if seed is None else gym.utils.seeding.np_random(seed)[0]


def pack(owner: str, fields: dict[str, Any]) -> EnvSnapshot:
    # One pickle for all fields keeps aliases between them (a text env's outcome generator may be np_random).
    return EnvSnapshot(owner, pickle.dumps(fields, protocol=pickle.HIGHEST_PROTOCOL))


def unpack(state: Any, owner: str) -> dict[str, Any]:
    """The fields of `state`, a snapshot of an env `owner`; one line naming what was expected otherwise."""
    if isinstance(state, ChainSnapshot):
        raise SnapshotError(
            f"restore(state): got a snapshot of a wrapped env ({state!r}); restore it with envs.snapshot.restore(env, "
            "state) on the wrapped env it was taken from"
        )
    if not isinstance(state, EnvSnapshot):
        raise SnapshotError(
            f"restore(state): got {type(state).__name__} {_short(state)}; expected an EnvSnapshot taken by {owner}'s snapshot()"
        )
    if state.owner != owner:
        raise SnapshotError(f"restore(state): a snapshot of {state.owner}; expected one of this env, {owner}")
    return pickle.loads(state.payload)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def env_owner(env: gym.Env, identity: Any = "") -> str:
    """How a snapshot names its env: the class, and what must match for a state to fit (e.g. its parameters)."""
    return f"{type(env).__qualname__}({identity})"


class SnapshotMixin:
    """`snapshot()` and `restore()` for an env that lists its state's attributes in `snapshot_fields` (or
    overrides `snapshot_state` / `restore_state`), names what a state must match in `snapshot_identity()`, and
    re-draws its unrevealed outcome in `redraw_outcome(rng)`. Attributes absent at the snapshot (before the
    first reset) are left as they are."""

    snapshot_fields: tuple[str, ...] = ()

    def snapshot_identity(self) -> Any:
        return getattr(self, "params", "")

    def snapshot_state(self) -> dict[str, Any]:
        names = (*GENERATOR_FIELDS, *self.snapshot_fields)
        return {name: getattr(self, name) for name in names if hasattr(self, name)}

    def restore_state(self, fields: dict[str, Any]) -> None:
        for name, value in fields.items():
            setattr(self, name, value)

    def snapshot(self) -> EnvSnapshot:
        return pack(env_owner(self, self.snapshot_identity()), self.snapshot_state())

    def restore(self, state: EnvSnapshot, outcome_seed: int | None = None) -> None:
        rng = outcome_generator(outcome_seed)
        self.restore_state(unpack(state, env_owner(self, self.snapshot_identity())))
        if rng is not None:
            self.redraw_outcome(rng)

    def redraw_outcome(self, rng: np.random.Generator) -> None:
        raise NotImplementedError(f"{type(self).__name__} lists snapshot_fields but does not say how to redraw its outcome")


def _wrapper_fields(wrapper: gym.Wrapper) -> tuple[str, ...] | None:
    declared = getattr(type(wrapper), "snapshot_fields", None)
    return declared if declared is not None else WRAPPER_FIELDS.get(type(wrapper))


def _chain(env: gym.Env) -> list[gym.Wrapper]:
    wrappers = []
    while isinstance(env, gym.Wrapper):
        wrappers.append(env)
        env = env.env
    return wrappers


def snapshot_problem(env: gym.Env) -> str | None:
    """Why `snapshot(env)` cannot capture `env` (one line), or None when it can."""
    for wrapper in _chain(env):
        if _wrapper_fields(wrapper) is None:
            return (
                f"wrapper {type(wrapper).__name__} holds state a snapshot cannot see: give it a class attribute "
                "snapshot_fields (the names of its state's attributes), or snapshot an env without it"
            )
    inner = env.unwrapped
    if not isinstance(inner, Snapshotable) and type(inner) not in GYMNASIUM_ENV_FIELDS:
        return f"env {type(inner).__name__} offers no snapshot()/restore() (envs.snapshot.Snapshotable)"
    return None


def supports_snapshot(env: gym.Env) -> bool:
    return snapshot_problem(env) is None


def _inner_snapshot(inner: gym.Env) -> EnvSnapshot:
    if isinstance(inner, Snapshotable):
        return inner.snapshot()
    names = (*GENERATOR_FIELDS, *GYMNASIUM_ENV_FIELDS[type(inner)])
    return pack(env_owner(inner, getattr(inner, "spec", None) and inner.spec.id), {n: getattr(inner, n) for n in names})


def _inner_restore(inner: gym.Env, state: EnvSnapshot, outcome_seed: int | None) -> None:
    if isinstance(inner, Snapshotable):
        inner.restore(state, outcome_seed=outcome_seed)
        return
    rng = outcome_generator(outcome_seed)
    for name, value in unpack(state, env_owner(inner, getattr(inner, "spec", None) and inner.spec.id)).items():
        setattr(inner, name, value)
    if rng is not None:  # these tasks' only randomness after reset is drawn from np_random (Acrobot's torque noise)
        inner._np_random = rng


def snapshot(env: gym.Env) -> ChainSnapshot:
    """The state of `env` and of every wrapper around it (module docstring); SnapshotError where it cannot."""
    problem = snapshot_problem(env)
    if problem is not None:
        raise SnapshotError(f"snapshot(env): {problem}")
    wrappers = tuple(
        (type(w).__name__, pickle.dumps({n: getattr(w, n) for n in _wrapper_fields(w)}, protocol=pickle.HIGHEST_PROTOCOL))
        for w in _chain(env)
    )
    return ChainSnapshot(wrappers, _inner_snapshot(env.unwrapped))


def restore(env: gym.Env, state: ChainSnapshot, outcome_seed: int | None = None) -> None:
    """Put `env` and its wrappers back in `state` (taken by `snapshot` of an env with the same wrappers)."""
    check_outcome_seed(outcome_seed)
    if not isinstance(state, ChainSnapshot):
        raise SnapshotError(
            f"restore(env, state): got {type(state).__name__} {_short(state)}; expected a ChainSnapshot taken by "
            "envs.snapshot.snapshot(env)"
        )
    wrappers = _chain(env)
    names = tuple(type(w).__name__ for w in wrappers)
    if names != tuple(name for name, _ in state.wrappers):
        raise SnapshotError(
            f"restore(env, state): {state!r} was taken through wrappers {' > '.join(n for n, _ in state.wrappers)}; "
            f"this env's are {' > '.join(names) or 'none'}"
        )
    _inner_restore(env.unwrapped, state.env, outcome_seed)
    for wrapper, (_, payload) in zip(wrappers, state.wrappers):
        for name, value in pickle.loads(payload).items():
            setattr(wrapper, name, value)
        if isinstance(wrapper, PassiveEnvChecker):
            _settle_passive_checks(wrapper)


def _settle_passive_checks(checker: PassiveEnvChecker) -> None:
    """An env restored before its first step continues an episode its own reset never began: Gymnasium's one-time
    check that compares reset's data with the first step's would find no reset data. The checks count as run (the
    env the snapshot came from ran them)."""
    if not checker.checked_step and getattr(checker, "_previous_data", None) is None:
        checker.checked_reset = checker.checked_step = True
        if hasattr(checker, "checked_data_reuse"):
            checker.checked_data_reuse = True
