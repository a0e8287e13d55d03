"""RRD's reward model in JAX: RRDRule's `backend: jax` (vcbm_gym/credit/rrd.py imports this module only then).

The numpy backend's model, loss and optimizer, computed by XLA: the parameters [W_1, b_1, ..., W_L, b_L] in
nn.Linear's layout and initialisation (the rule hands them over), the subsets drawn by the rule's numpy rng, the
forward pass and the loss written once for both backends (`rrd.mlp_forward`, `rrd.loss_terms`, in jax.numpy here),
the gradient by jax.grad instead of `mlp_backward`, and optax's Adam, whose update is torch.optim.Adam's (bias-corrected
moments, eps added to the corrected root; `model_training.adam_step`). A training step (forward pass, gradient and
Adam update) is one compiled call.

Shapes stay fixed so that XLA compiles a handful of times per run, not once per batch: each step's subsets are
padded to `subsequence_size` columns (masked off: no term of the loss reads them, as for an episode shorter than
K), and the rows of a forward pass to the next power of two.

Precision: `dtype: float64` runs every call inside `jax.enable_x64` (local to these calls: SBX's float32 networks in
the same process keep their types); `float32` computes the loss in float32 too, where the numpy backend keeps it in
float64 (the rounding of a residual G - T/n sum r is then float32's, ~1e-7 of G).

XLA's threads are whatever jax started with: the SB3 arm sets them from `torch_threads` before anything imports jax
(algorithms/sb3/engines.py:configure_jax).
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from vcbm_gym.credit.model_training import AdamState
from vcbm_gym.credit.rrd_math import loss_terms, mlp_forward


def rewards(params: list[jax.Array], features: jax.Array) -> jax.Array:
    """r_theta of (..., F) features: `rrd.mlp_forward` in jax.numpy."""
    return mlp_forward(params, features, jnp)[0]


def rrd_objective(
    params: list[jax.Array],
    features: jax.Array,
    mask: jax.Array,
    lengths: jax.Array,
    returns: jax.Array,
    bias_correction: bool,
    per_step: bool,
) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
    """`rrd.rrd_loss`'s loss of the sampled (B, K, F) features: (loss, (surrogate, correction)), differentiable in params."""
    terms = loss_terms(rewards(params, features), mask, lengths, returns, per_step, jnp)
    surrogate, correction = terms.surrogate.mean(), terms.correction.mean()
    return (surrogate - correction if bias_correction else surrogate), (surrogate, correction)


def next_power_of_two(n: int) -> int:
    return 1 << max(int(n) - 1, 0).bit_length()


class JaxRewardModel:
    """The reward model's parameters and Adam state on JAX's device, with its compiled forward pass and training step."""

    def __init__(self, params: list[np.ndarray], config: Any) -> None:  # config: an RRDConfig
        self.config = config
        self.dtype = np.dtype(config.dtype)
        objective = functools.partial(rrd_objective, bias_correction=config.bias_correction, per_step=config.per_step_loss)
        self.optimizer = optax.adam(config.learning_rate, b1=0.9, b2=0.999, eps=1e-8)  # torch.optim.Adam's defaults
        gradient = jax.value_and_grad(objective, has_aux=True)

        def train_step(params, opt_state, features, mask, lengths, returns):
            (loss, (surrogate, correction)), grads = gradient(params, features, mask, lengths, returns)
            updates, opt_state = self.optimizer.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), opt_state, loss, surrogate, correction

        self._gradient = jax.jit(gradient)
        self._train_step = jax.jit(train_step, donate_argnums=(0, 1))  # the old parameters and moments are not kept
        self._rewards = jax.jit(rewards)
        with self.precision():
            self._params = [jnp.asarray(p) for p in params]
            self._opt_state = self.optimizer.init(self._params)

    def precision(self) -> contextlib.AbstractContextManager:
        """float64 arrays for a float64 model: x64 enabled for this model's calls only."""
        return jax.enable_x64(True) if self.dtype == np.float64 else contextlib.nullcontext()

    def _inputs(self, features: np.ndarray, mask: np.ndarray, lengths: np.ndarray, returns: np.ndarray) -> tuple[jax.Array, ...]:
        """The sampled (B, K', F) features, mask, lengths and returns as device arrays in the model's dtype, padded to
        K = `subsequence_size` columns: one compiled shape for every step of a run."""
        pad = self.config.subsequence_size - features.shape[1]
        features = np.pad(np.asarray(features, self.dtype), ((0, 0), (0, pad), (0, 0)))
        mask = np.pad(np.asarray(mask, self.dtype), ((0, 0), (0, pad)))
        return tuple(jnp.asarray(a) for a in (features, mask, np.asarray(lengths, self.dtype), np.asarray(returns, self.dtype)))

    def loss_and_gradients(
        self, features: np.ndarray, mask: np.ndarray, lengths: np.ndarray, returns: np.ndarray
    ) -> tuple[tuple[float, float, float], list[np.ndarray]]:
        """((loss, surrogate, correction), parameter gradients in numpy) of sampled subsets, as `RRDRule`'s numpy path."""
        with self.precision():
            (loss, (surrogate, correction)), grads = self._gradient(self._params, *self._inputs(features, mask, lengths, returns))
            return (float(loss), float(surrogate), float(correction)), [np.asarray(g) for g in grads]

    def train_step(self, features: np.ndarray, mask: np.ndarray, lengths: np.ndarray, returns: np.ndarray) -> tuple[float, ...]:
        """One Adam step on sampled subsets: (loss, surrogate, correction)."""
        with self.precision():
            self._params, self._opt_state, *values = self._train_step(
                self._params, self._opt_state, *self._inputs(features, mask, lengths, returns)
            )
            return tuple(float(v) for v in values)

    def rewards(self, features: np.ndarray) -> np.ndarray:
        """r_theta of (..., F) features, in numpy: the rows run padded to a power of two (few compiled shapes)."""
        rows = np.asarray(features, self.dtype).reshape(-1, np.shape(features)[-1])
        padded = np.pad(rows, ((0, next_power_of_two(len(rows)) - len(rows)), (0, 0)))
        with self.precision():
            out = np.asarray(self._rewards(self._params, jnp.asarray(padded)))
        return out[: len(rows)].reshape(np.shape(features)[:-1])

    def params(self) -> list[np.ndarray]:
        return [np.array(p) for p in self._params]

    def adam(self) -> AdamState:
        adam_state = self._opt_state[0]
        return AdamState(int(adam_state.count), [np.array(m) for m in adam_state.mu], [np.array(v) for v in adam_state.nu])

    def load(self, params: list[np.ndarray], adam: AdamState) -> None:
        """Parameters and Adam's state from numpy (`RRDRule.load_state_dict`)."""
        with self.precision():
            self._params = [jnp.asarray(p) for p in params]
            state = self.optimizer.init(self._params)
            moments: dict[str, Any] = {
                "count": jnp.asarray(adam.step, dtype=state[0].count.dtype),
                "mu": [jnp.asarray(m) for m in adam.exp_avg],
                "nu": [jnp.asarray(v) for v in adam.exp_avg_sq],
            }
            self._opt_state = (state[0]._replace(**moments), *state[1:])
