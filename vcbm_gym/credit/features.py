"""Per-step features of whole episodes, for credit rules that learn a sequence model (RUDDER).

A *featurizer* maps a batch's observations (B, T, ...) and actions (B, T, ...) to float32
features (B, T, F) and says F (`n_features`). Environment-specific features live with their
environment (WatchRepair's: `envs.watch_repair.WatchRepairFeaturizer`, offered through the env's
`credit_featurizer()`, see vcbm_gym/contract.py); `SpaceFeaturizer` is the generic one, read off
the Gymnasium spaces alone.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Protocol, runtime_checkable

import numpy as np
from gymnasium import spaces

if TYPE_CHECKING:
    from vcbm_gym.credit.base import EpisodeBatch


@runtime_checkable
class Featurizer(Protocol):
    n_features: int

    def __call__(self, observations: np.ndarray, actions: np.ndarray) -> np.ndarray:
        """(B, T, ...) observations and (B, T, ...) actions -> (B, T, n_features) float32."""
        ...


def _width(space: spaces.Space) -> int:
    return int(spaces.flatdim(space))


def _flatten(space: spaces.Space, values: np.ndarray, lead: tuple[int, ...]) -> np.ndarray:
    """Gymnasium's `spaces.flatten` of every element of a (*lead, *space.shape) array, at once."""
    if isinstance(space, spaces.Box):
        return values.reshape(*lead, -1).astype(np.float32)
    if isinstance(space, spaces.MultiBinary):
        return values.reshape(*lead, -1).astype(np.float32)
    if isinstance(space, spaces.Discrete):
        index = values.reshape(lead).astype(np.int64) - int(space.start)
        if index.size and (index.min() < 0 or index.max() >= space.n):
            raise ValueError(f"values outside {space} in the batch")
        return np.eye(int(space.n), dtype=np.float32)[index]
    if isinstance(space, spaces.MultiDiscrete):
        nvec = space.nvec.reshape(-1)
        index = values.reshape(*lead, len(nvec)).astype(np.int64) - space.start.reshape(-1)
        if index.size and (index.min() < 0 or (index >= nvec).any()):
            raise ValueError(f"values outside {space} in the batch")
        offsets = np.concatenate([[0], np.cumsum(nvec)[:-1]])
        out = np.zeros((*lead, int(nvec.sum())), dtype=np.float32)
        np.put_along_axis(out, index + offsets, 1.0, axis=-1)
        return out
    raise TypeError(f"{space}: expected a Box, Discrete, MultiDiscrete or MultiBinary space (or an env credit_featurizer)")


class SpaceFeaturizer:
    """The observation and the action flattened as Gymnasium's `spaces.flatten` does (Box and
    MultiBinary as floats, Discrete and MultiDiscrete one-hot), side by side per step.

    `differences=True` gives the observation part as the difference from the previous step (the
    first step raw), the input RUDDER's own experiments use (Arjona-Medina et al., 2019,
    arXiv:1806.07857); the default keeps the raw observation.
    """

    def __init__(self, observation_space: spaces.Space, action_space: spaces.Space, differences: bool = False) -> None:
        for space in (observation_space, action_space):
            if not isinstance(space, (spaces.Box, spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary)):
                raise TypeError(
                    f"{space}: expected a Box, Discrete, MultiDiscrete or MultiBinary space (or an env credit_featurizer)"
                )
        self.observation_space, self.action_space, self.differences = observation_space, action_space, bool(differences)
        self.n_features = _width(observation_space) + _width(action_space)

    def __call__(self, observations: np.ndarray, actions: np.ndarray) -> np.ndarray:
        obs, acts = np.asarray(observations), np.asarray(actions)
        lead = obs.shape[: obs.ndim - len(self.observation_space.shape or ())]
        if len(lead) != 2 or acts.shape[:2] != lead:
            raise ValueError(f"observations {obs.shape} and actions {acts.shape}: expected (B, T) + the spaces' shapes")
        state = _flatten(self.observation_space, obs, lead)
        if self.differences:
            state = np.diff(state, axis=1, prepend=np.zeros_like(state[:, :1]))
        return np.concatenate([state, _flatten(self.action_space, acts, lead)], axis=-1)


class TransitionFeaturizer:
    """[s, a, s - s'] per step, the input of RRD's MuJoCo reward model (Ren et al. 2022, reference code):
    the observation and the action flattened as `SpaceFeaturizer` does, then the change to the next
    observation. Reads the batch's next observations (`extras['next_observations']`), so a step's features,
    and the reward of a model on them, depend on that transition alone: a replay buffer can relabel any
    stored transition."""

    uses_next_observations = True

    def __init__(self, observation_space: spaces.Space, action_space: spaces.Space) -> None:
        if not isinstance(observation_space, spaces.Box):
            raise TypeError(f"{observation_space}: transition features (s, a, s - s') expect a Box observation space")
        self.step = SpaceFeaturizer(observation_space, action_space)
        self.observation_space = observation_space
        self.n_features = self.step.n_features + _width(observation_space)

    def __call__(self, observations: np.ndarray, actions: np.ndarray, next_observations: np.ndarray) -> np.ndarray:
        features = self.step(observations, actions)
        lead = features.shape[:2]
        change = _flatten(self.observation_space, np.asarray(observations), lead) - _flatten(
            self.observation_space, np.asarray(next_observations), lead
        )
        return np.concatenate([features, change], axis=-1)


def prefix_steps(batch: EpisodeBatch, rule: str) -> tuple[np.ndarray, Callable[[Any], np.ndarray]]:
    """A featurizer's view of an EpisodeBatch whose real steps are a prefix of each row: (each episode's length,
    `real(values)`: a (B, T, ...) field whose padding takes the first step's values, valid in any space). A batch
    without observations and actions, or with steps after padding, is a ValueError naming `rule`."""
    if batch.observations is None or batch.actions is None:
        raise ValueError(f"{rule} needs batch.observations (B, T, ...) and batch.actions (B, T, ...)")
    lengths = batch.mask.sum(axis=1)
    if not np.array_equal(batch.mask, np.arange(batch.mask.shape[1])[None, :] < lengths[:, None]):
        raise ValueError(f"{rule} expects each episode's real steps to be a prefix of its row (mask)")

    def real(values: Any) -> np.ndarray:
        values = np.asarray(values)
        keep = batch.mask.reshape(batch.mask.shape + (1,) * (values.ndim - 2))
        return np.where(keep, values, values[:, :1])

    return lengths, real


def is_per_transition(featurizer: object) -> bool:
    """Whether `featurizer`'s features of a step depend on that step's transition alone (no sequence context)."""
    return isinstance(featurizer, TransitionFeaturizer) or (
        isinstance(featurizer, SpaceFeaturizer) and not featurizer.differences
    )


def episode_featurizer(env: object) -> Featurizer:
    """The env's own `credit_featurizer()` if it has one, else the flattened observation and action."""
    own = getattr(getattr(env, "unwrapped", env), "credit_featurizer", None)
    return own() if callable(own) else SpaceFeaturizer(env.observation_space, env.action_space)
