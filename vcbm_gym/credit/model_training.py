"""What the learned credit models (RUDDER's LSTM, vcbm_gym/credit/rudder.py; RRD's reward model,
vcbm_gym/credit/rrd.py) share: the buffer of featurised episodes they sample their training batches
from, and torch.optim.Adam's step written out in numpy over their float64 parameters (rudder.py says
why: a run takes ~10^4 steps, and torch's per-op overhead dominates them)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from vcbm_gym.credit.features import Featurizer


class LessonBuffer:
    """FIFO ring buffer of featurised episodes with their returns; uniform sampling from a seeded rng.

    Rows start `max_length` steps long and grow (zero-padded) when a longer episode arrives; a
    sampled batch is cut to its longest episode. Padding never reaches the loss (lengths mask it).
    """

    def __init__(self, capacity: int, max_length: int, n_features: int, seed: int = 0) -> None:
        if capacity < 1:
            raise ValueError(f"capacity={capacity}: expected >= 1")
        self.capacity = capacity
        self.features = np.zeros((capacity, max_length, n_features), dtype=np.float32)
        self.lengths = np.zeros(capacity, dtype=np.int64)
        self.returns = np.zeros(capacity, dtype=np.float64)
        self.size = 0
        self.next_slot = 0  # the oldest entry once full
        self.rng = np.random.default_rng(np.random.SeedSequence([seed, 0x1E5]))

    def __len__(self) -> int:
        return self.size

    def add(self, features: np.ndarray, episode_return: float) -> None:
        length = len(features)
        if features.ndim != 2 or length < 1 or features.shape[1] != self.features.shape[2]:
            raise ValueError(f"episode features {features.shape}: expected (steps >= 1, {self.features.shape[2]})")
        if length > self.features.shape[1]:
            self.features = np.pad(self.features, ((0, 0), (0, length - self.features.shape[1]), (0, 0)))
        slot = self.next_slot
        self.features[slot] = 0.0
        self.features[slot, :length] = features
        self.lengths[slot] = length
        self.returns[slot] = episode_return
        self.next_slot = (slot + 1) % self.capacity
        self.size = min(self.size + 1, self.capacity)

    def distinct_returns(self) -> int:
        return len(np.unique(self.returns[: self.size]))

    def sample(self, batch_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Uniform with replacement over the stored episodes: (features, lengths, returns)."""
        if self.size == 0:
            raise ValueError("cannot sample from an empty lesson buffer")
        idx = self.rng.integers(self.size, size=batch_size)
        lengths = self.lengths[idx]
        return self.features[idx, : lengths.max()], lengths, self.returns[idx]

    def state_dict(self) -> dict[str, Any]:
        return {
            "features": self.features.copy(),
            "lengths": self.lengths.copy(),
            "returns": self.returns.copy(),
            "size": self.size,
            "next_slot": self.next_slot,
            "rng": self.rng.bit_generator.state,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.features = np.array(state["features"], dtype=np.float32)
        self.lengths = np.array(state["lengths"], dtype=np.int64)
        self.returns = np.array(state["returns"], dtype=np.float64)
        self.capacity = len(self.returns)
        self.size, self.next_slot = int(state["size"]), int(state["next_slot"])
        self.rng.bit_generator.state = state["rng"]


@dataclass
class AdamState:
    """torch.optim.Adam's state (L2 weight decay added to the gradient, bias-corrected moments)."""

    step: int
    exp_avg: list[np.ndarray]
    exp_avg_sq: list[np.ndarray]

    @classmethod
    def zeros_like(cls, params: list[np.ndarray]) -> AdamState:
        return cls(0, [np.zeros_like(p) for p in params], [np.zeros_like(p) for p in params])


def adam_step(
    params: list[np.ndarray],
    grads: list[np.ndarray],
    state: AdamState,
    lr: float,
    weight_decay: float,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
) -> None:
    """One torch.optim.Adam step, in place on the parameter arrays (tested against torch)."""
    beta1, beta2 = betas
    state.step += 1
    correction1, correction2 = 1.0 - beta1**state.step, 1.0 - beta2**state.step
    for param, grad, m, v in zip(params, grads, state.exp_avg, state.exp_avg_sq):
        grad = grad + weight_decay * param
        m *= beta1
        m += (1.0 - beta1) * grad
        v *= beta2
        v += (1.0 - beta2) * grad * grad
        param -= (lr / correction1) * m / (np.sqrt(v) / np.sqrt(correction2) + eps)


def learned_rule_config(rule: str, featurizer: Any, config: Any, config_cls: type, overrides: Mapping[str, Any]) -> Any:
    """A learned-credit rule's config (RRDRule's, RudderRule's): `config` (else `config_cls()`) with the keyword
    `overrides` applied, once `featurizer` is known to give per-step features; a bad one is one ValueError line."""
    if not isinstance(featurizer, Featurizer):
        raise ValueError(
            f"featurizer={featurizer!r}: expected per-step features with `n_features` "
            f"(SpaceFeaturizer(observation_space, action_space), an env's credit_featurizer(), or {rule}.from_env(env))"
        )
    cfg = config or config_cls()
    if overrides:
        unknown = sorted(set(overrides) - set(asdict(cfg)))
        if unknown:
            raise ValueError(
                f"unknown {rule} option(s) {unknown}; expected fields of {config_cls.__name__}: {sorted(asdict(cfg))}"
            )
        cfg = config_cls(**{**asdict(cfg), **overrides})
    return cfg
