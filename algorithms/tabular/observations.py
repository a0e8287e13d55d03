"""Observations as the tabular agents read them: one flat int64 vector per step.

A tabular agent keys its tables on tuples of integer state components. `TabularObservations` turns
any discrete observation space into that form: Discrete, MultiDiscrete, MultiBinary, a Box of an
integer (or bool) dtype, and Tuple or Dict spaces of those, flattened in the space's own order (a
Dict in its key order). A Box of floats cannot be tabulated and is refused with one line naming
the space; so is any other space (Text, Graph, Sequence...).

Every call returns a new array: an env that reuses the array it returned (and writes the next
observation into it) would otherwise hand the agent the same object as "before" and "after", and
every component would look static.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
from gymnasium import spaces

# (low, high, flatten, names) of one leaf space: flatten(obs) -> list of ints
_Leaf = tuple[np.ndarray, np.ndarray, Callable[[Any], np.ndarray], list[str]]


class UntabulableSpace(ValueError):
    """The observation space has no integer view a table can key on."""


def _is_integer_dtype(dtype: Any) -> bool:
    return np.issubdtype(dtype, np.integer) or np.issubdtype(dtype, np.bool_)


def _leaves(space: spaces.Space, path: str) -> list[_Leaf]:
    """The flat pieces of `space`, depth first."""
    if isinstance(space, spaces.Discrete):
        start = int(space.start)
        return [(np.array([start]), np.array([start + int(space.n) - 1]), lambda obs: np.array([obs], dtype=np.int64), [path])]
    if isinstance(space, spaces.MultiDiscrete):
        low = np.asarray(space.start, dtype=np.int64).reshape(-1)
        high = low + np.asarray(space.nvec, dtype=np.int64).reshape(-1) - 1
    elif isinstance(space, spaces.MultiBinary):
        size = int(np.prod(space.shape))
        low, high = np.zeros(size, dtype=np.int64), np.ones(size, dtype=np.int64)
    elif isinstance(space, spaces.Box):
        if not _is_integer_dtype(space.dtype):
            raise UntabulableSpace(f"{space} is a Box of {space.dtype} values")
        low, high = space.low.astype(np.int64).reshape(-1), space.high.astype(np.int64).reshape(-1)
    elif isinstance(space, spaces.Tuple):
        parts = [_leaves(sub, f"{path}[{i}]" if path else str(i)) for i, sub in enumerate(space.spaces)]
        return [_composite(parts, lambda obs: obs)]
    elif isinstance(space, spaces.Dict):
        keys = list(space.spaces)
        parts = [_leaves(space.spaces[key], f"{path}.{key}" if path else str(key)) for key in keys]
        return [_composite(parts, lambda obs: [obs[key] for key in keys])]
    else:
        raise UntabulableSpace(f"{space} is not a Discrete, MultiDiscrete, MultiBinary, integer Box, Tuple or Dict space")
    names = [path] if len(low) == 1 else [f"{path}[{j}]" for j in range(len(low))]
    if len(space.shape) == 1:  # already flat: only the copy (the runner's inner loop calls this every step)
        return [(low, high, lambda obs: np.array(obs, dtype=np.int64), names)]
    return [(low, high, lambda obs: np.array(obs, dtype=np.int64).reshape(-1), names)]


def _composite(parts: list[list[_Leaf]], children: Callable[[Any], list[Any]]) -> _Leaf:
    leaves = [leaf for part in parts for leaf in part]
    flatteners = [leaf[2] for leaf in leaves]

    def flatten(obs: Any) -> np.ndarray:
        return np.concatenate([f(child) for f, child in zip(flatteners, children(obs))])

    low = np.concatenate([leaf[0] for leaf in leaves]) if leaves else np.zeros(0, dtype=np.int64)
    high = np.concatenate([leaf[1] for leaf in leaves]) if leaves else np.zeros(0, dtype=np.int64)
    return low, high, flatten, [name for leaf in leaves for name in leaf[3]]


class TabularObservations:
    """`flatten(obs)` -> a new (n_components,) int64 array; `space`: the flat space the agent is given.

    The flat space is a MultiDiscrete when every piece is Discrete, MultiDiscrete or MultiBinary (the
    space itself when it already is a flat MultiDiscrete, e.g. WatchRepair's), else an int64 Box of
    the pieces' bounds. `names`: one per component for a Tuple or Dict space ("key", "key[j]"),
    else None (the agents then number the components).
    """

    def __init__(self, space: spaces.Space) -> None:
        ((low, high, flatten, names),) = _leaves(space, "")
        self.source = space
        self.flatten = flatten
        composite = isinstance(space, (spaces.Tuple, spaces.Dict))
        self.names: tuple[str, ...] | None = tuple(names) if composite else None
        if isinstance(space, spaces.MultiDiscrete) and len(space.shape) == 1:
            self.space: spaces.Space = space
        elif not _has_box(space):
            self.space = spaces.MultiDiscrete(high - low + 1, start=low)
        else:
            self.space = spaces.Box(low, high, dtype=np.int64)

    @property
    def n_components(self) -> int:
        return int(np.prod(self.space.shape))


def _has_box(space: spaces.Space) -> bool:
    if isinstance(space, spaces.Box):
        return True
    if isinstance(space, spaces.Tuple):
        return any(_has_box(sub) for sub in space.spaces)
    if isinstance(space, spaces.Dict):
        return any(_has_box(sub) for sub in space.spaces.values())
    return False
