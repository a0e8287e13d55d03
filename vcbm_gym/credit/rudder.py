"""RUDDER return redistribution as a credit rule.

RUDDER: "RUDDER: Return Decomposition for Delayed Rewards", Arjona-Medina, Gillhofer, Widrich,
Unterthiner, Brandstetter and Hochreiter, NeurIPS 2019, arXiv:1806.07857. The form used here is
the one of "Visual Causal-chain Bookmarking" (Selvakumar, 2026, arXiv:2610.24032), Sec. II-B,
Eq. 3-5; the details the paper leaves open are settled in docs/papers/vcbm.md ("RUDDER").

Read top to bottom:

1. Features: a *featurizer* (vcbm_gym/credit/features.py) maps each episode's observations and
   actions to per-step input vectors. It comes from the environment (`credit_featurizer()`, e.g.
   WatchRepair's differences of [flag, counters, one-hot brand, t / T] plus the one-hot action:
   envs.watch_repair.WatchRepairFeaturizer) or, by default, is the flattened observation and
   action (`SpaceFeaturizer`). The rule reads arrays only, never an env.
2. `GatelessLSTM`: forget and output gates removed. Cell input z_t = tanh(W x_t + b) from the
   current input only; input gate i_t = sigmoid(R h_{t-1} + b_i) from the recurrent state only;
   c_t = c_{t-1} + i_t * z_t; h_t = c_t; prediction G_hat_t = Linear(16, 1)(h_t) (Eq. 3).
3. `rudder_loss` (Eq. 4): squared error against G0 = G / R_scale at the last step plus
   lambda_aux = 0.5 times the mean squared error over all prefixes.
4. `LessonBuffer` (model_training.py, shared with RRD): FIFO of 2,048 featurised episodes, uniform
   batches of 8 from its own seeded rng; its rows grow to the longest episode seen (shorter ones are
   padded and masked by length).
5. `train_until_converged`: one training event = Adam steps on fresh batches until an exponential
   running average of the main loss (reset to 0.3 at each event, decay 0.99) falls below 0.15, or
   a step cap; the step count is returned for logging. The step itself (`loss_and_gradients`,
   `adam_step`) is written out in numpy over the torch module's float64 parameters: a 50-step
   recurrence through autograd costs several times more in per-op overhead, and a run needs
   ~10^4 steps. Both are tested against torch autograd and torch.optim.Adam. A single Adam step
   per event never learns the brand effect of WatchRepair (measured: 0 of 3 seeds converge in
   10,000 episodes): the schedule, not the model, is the delicate part.
6. `redistribute` (Eq. 5): r_t = R_scale (G_hat_t - G_hat_{t-1}), G_hat_{-1} = 0; sums to
   R_scale * G_hat_T.
7. `RudderRule`: the CreditRule wrapper: `observe` fills the buffer and trains on schedule
   (start once the buffer holds > 256 episodes with > 1 distinct return, then every 25 episodes);
   `advantages` returns the redistributed rewards (the raw rewards before the first training event).

Choices where the papers are silent (config fields of `RudderCreditConfig`):
- Initialisation: every weight matrix N(0, 0.1); the input-gate bias b_i = -3 (so i_0 ~ 0.05 and
  the cell integrates slowly); the cell-input and output biases 0.
- The running loss is an exponential moving average with decay 0.99 restarted at 0.3 at each
  event, so an event takes at least 69 Adam steps (0.3 * 0.99^69 < 0.15), as measured on the
  RUDDER demonstration code's schedule (docs/papers/vcbm.md, "RUDDER").
- Cap: 2,000 Adam steps per event (logged, so a capped event is visible).
- Observations are the states the actions were taken in (s_0 .. s_{T-1}); the terminal state is not
  an input (EpisodeBatch has one observation per step).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from scipy.special import expit
from torch import nn

import vcbm_gym.credit.options as options
from vcbm_gym.credit.base import EpisodeBatch, RewardRule
from vcbm_gym.credit.features import Featurizer, episode_featurizer, prefix_steps
from vcbm_gym.credit.model_training import (  # noqa: F401 (also imported from here)
    AdamState,
    LessonBuffer,
    adam_step,
    learned_rule_config,
)


@dataclass
class RudderLSTMConfig:
    """The model and its training schedule: the hyperparameters a user tunes."""

    hidden_size: int = 16
    init_std: float = 0.1
    input_gate_bias_init: float = -3.0
    reward_scale: float = 10.0  # R_scale: the LSTM predicts G0 = G / R_scale
    aux_loss_weight: float = 0.5  # lambda_aux in Eq. 4
    learning_rate: float = 1e-2
    weight_decay: float = 1e-6
    buffer_capacity: int = 2048
    batch_size: int = 8
    min_buffer_episodes: int = 256  # train once the buffer holds more than this many episodes
    train_every: int = 25  # episodes between training events
    loss_threshold: float = 0.15
    running_loss_init: float = 0.3
    running_loss_decay: float = 0.99
    max_steps_per_event: int = 2000


@dataclass
class RudderCreditConfig(RudderLSTMConfig):
    """RudderLSTMConfig with its values checked (the rule's own config; the input size comes from
    the featurizer)."""

    def __post_init__(self) -> None:
        for name in ("hidden_size", "buffer_capacity", "batch_size", "train_every", "max_steps_per_event"):
            setattr(self, name, options.integer(name, getattr(self, name), 1))
        self.min_buffer_episodes = options.integer("min_buffer_episodes", self.min_buffer_episodes, 0)
        for name in ("init_std", "aux_loss_weight", "weight_decay", "loss_threshold", "running_loss_init"):
            setattr(self, name, options.number(name, getattr(self, name), 0))
        for name in ("reward_scale", "learning_rate"):
            setattr(self, name, options.number(name, getattr(self, name), above=0))
        self.input_gate_bias_init = options.number("input_gate_bias_init", self.input_gate_bias_init)
        self.running_loss_decay = options.number("running_loss_decay", self.running_loss_decay, 0, below=1)


def recurrence_forward(z: np.ndarray, recurrent: np.ndarray, gate_bias: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Time-major (T, B, H) cell inputs -> (gates i_t, cells c_t): i_t = sigmoid(R c_{t-1} + b_i), c_t = c_{t-1} + i_t z_t."""
    r_t = np.ascontiguousarray(recurrent.T)
    gates = np.empty_like(z)
    cells = np.empty_like(z)
    c = np.zeros(z.shape[1:])
    for t in range(len(z)):
        g = gates[t]
        np.matmul(c, r_t, out=g)
        g += gate_bias
        expit(g, out=g)
        c = cells[t]
        np.multiply(g, z[t], out=c)
        if t:
            c += cells[t - 1]
    return gates, cells


def recurrence_backward(
    z: np.ndarray, recurrent: np.ndarray, gates: np.ndarray, cells: np.ndarray, d_out: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Backpropagation through time of `recurrence_forward`: dL/dc_t given directly as `d_out` (T, B, H)
    -> (dL/dz, dL/dR, dL/db_i)."""
    d_cells = np.empty_like(z)  # dL/dc_t along all paths
    gate_slope = z * gates * (1.0 - gates)  # d c_t / d a_t, a_t the gate pre-activation
    d_pre = np.empty_like(z)
    for t in range(len(z) - 1, -1, -1):
        dc = d_cells[t]
        if t + 1 < len(z):
            np.add(d_out[t], d_cells[t + 1], out=dc)
            dc += d_pre[t + 1] @ recurrent  # through the next gate: a_{t+1} = R c_t + b_i
        else:
            dc[...] = d_out[t]
        np.multiply(dc, gate_slope[t], out=d_pre[t])
    d_recurrent = np.einsum("tbh,tbk->hk", d_pre[1:], cells[:-1])  # a_0 sees c_{-1} = 0
    return d_cells * gates, d_recurrent, d_pre.sum(axis=(0, 1))


class GatelessRecurrence(torch.autograd.Function):
    """The recurrence with backpropagation through time written by hand (numpy, float64).

    Why by hand: autograd over 50 tiny steps spends most of an Adam step in per-op overhead, and a
    training event needs ~80 steps. `GatelessLSTM.cell_states_autograd` is the plain-autograd
    reference this is tested against.
    """

    @staticmethod
    def forward(ctx, z: torch.Tensor, recurrent: torch.Tensor, gate_bias: torch.Tensor) -> torch.Tensor:
        zs = np.ascontiguousarray(z.detach().double().numpy().transpose(1, 0, 2))  # time-major (T, B, H)
        r = recurrent.detach().double().numpy()
        gates, cells = recurrence_forward(zs, r, gate_bias.detach().double().numpy())
        ctx.arrays = (zs, r, gates, cells)
        ctx.dtypes = (z.dtype, recurrent.dtype, gate_bias.dtype)
        return torch.from_numpy(cells.transpose(1, 0, 2).copy()).to(z.dtype)

    @staticmethod
    def backward(ctx, grad_cells: torch.Tensor):
        zs, r, gates, cells = ctx.arrays
        d_out = np.ascontiguousarray(grad_cells.detach().double().numpy().transpose(1, 0, 2))
        d_z, d_r, d_b = recurrence_backward(zs, r, gates, cells, d_out)
        z_dtype, r_dtype, b_dtype = ctx.dtypes
        return (
            torch.from_numpy(d_z.transpose(1, 0, 2).copy()).to(z_dtype),
            torch.from_numpy(d_r).to(r_dtype),
            torch.from_numpy(d_b).to(b_dtype),
        )


class GatelessLSTM(nn.Module):
    """Eq. 3: an LSTM with forget and output gates removed (a stock nn.LSTM is not this model).

    z_t = tanh(W x_t + b); i_t = sigmoid(R h_{t-1} + b_i); c_t = c_{t-1} + i_t * z_t; h_t = c_t;
    G_hat_t = v . h_t + v_0. The tanh on the cell input matters: with a linear cell input the
    score of repair minus keep is the same for every brand and the task cannot be learned.
    """

    def __init__(
        self,
        n_features: int,
        hidden_size: int = RudderLSTMConfig.hidden_size,
        init_std: float = RudderLSTMConfig.init_std,
        input_gate_bias: float = RudderLSTMConfig.input_gate_bias_init,
        seed: int = 0,
    ):
        super().__init__()
        self.cell_input = nn.Linear(n_features, hidden_size)  # W, b
        self.recurrent_gate = nn.Linear(hidden_size, hidden_size, bias=False)  # R
        self.gate_bias = nn.Parameter(torch.full((hidden_size,), float(input_gate_bias)))  # b_i
        self.readout = nn.Linear(hidden_size, 1)
        generator = torch.Generator().manual_seed(int(seed))
        with torch.no_grad():
            for weight in (self.cell_input.weight, self.recurrent_gate.weight, self.readout.weight):
                weight.normal_(0.0, init_std, generator=generator)
            self.cell_input.bias.zero_()
            self.readout.bias.zero_()

    def cell_states(self, features: torch.Tensor) -> torch.Tensor:
        """(B, T, F) -> (B, T, H) cell states c_t (= h_t), through the hand-written BPTT of `GatelessRecurrence`."""
        z = torch.tanh(self.cell_input(features))  # depends on x_t only: computed for all t at once
        return GatelessRecurrence.apply(z, self.recurrent_gate.weight, self.gate_bias)

    def cell_states_autograd(self, features: torch.Tensor) -> torch.Tensor:
        """The same recurrence step by step in torch autograd: the reference `cell_states` is tested against."""
        z = torch.tanh(self.cell_input(features))
        c = features.new_zeros(features.shape[0], z.shape[-1])
        states = []
        for t in range(features.shape[1]):
            gate = torch.sigmoid(self.recurrent_gate(c) + self.gate_bias)  # h_{t-1} = c_{t-1}
            c = c + gate * z[:, t]
            states.append(c)
        return torch.stack(states, dim=1)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """(B, T, F) -> (B, T) return predictions G_hat_t (in units of R_scale) after every prefix."""
        return self.readout(self.cell_states(features)).squeeze(-1)


def rudder_loss(
    predictions: torch.Tensor, target: torch.Tensor, lengths: torch.Tensor, aux_weight: float = 0.5
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Eq. 4: (main + aux_weight * aux, main, aux) for (B, T) predictions and (B,) targets G0.

    main = mean_b (G_hat_{T_b - 1} - G0_b)^2 at each episode's last step; aux = mean over every
    real step of (G_hat_t - G0)^2 (padding beyond `lengths` is ignored).
    """
    steps = torch.arange(predictions.shape[1], device=predictions.device)
    valid = (steps[None, :] < lengths[:, None]).to(predictions.dtype)
    errors = (predictions - target[:, None]) ** 2
    main = errors.gather(1, (lengths - 1)[:, None]).mean()
    aux = ((errors * valid).sum(1) / lengths.to(predictions.dtype)).mean()
    return main + aux_weight * aux, main, aux


PARAMETER_NAMES = ("cell_input.weight", "cell_input.bias", "recurrent_gate.weight", "gate_bias", "readout.weight", "readout.bias")


def parameter_arrays(model: GatelessLSTM) -> list[np.ndarray]:
    """Numpy views (shared memory) of the model's float64 parameters, in PARAMETER_NAMES order."""
    named = dict(model.named_parameters())
    arrays = [named[name].detach().numpy() for name in PARAMETER_NAMES]
    if any(a.dtype != np.float64 for a in arrays):
        raise TypeError("the fast RUDDER trainer works on a float64 model: call model.double()")
    return arrays


def loss_and_gradients(
    params: list[np.ndarray], features: np.ndarray, lengths: np.ndarray, targets: np.ndarray, aux_weight: float
) -> tuple[float, float, list[np.ndarray]]:
    """Eq. 4 and its gradient by hand, the same numbers as `rudder_loss` on `GatelessLSTM` with autograd
    (tested): (main, aux, gradients in PARAMETER_NAMES order) for a (B, T, F) batch."""
    weight, bias, recurrent, gate_bias, readout, readout_bias = params
    x = np.ascontiguousarray(features.transpose(1, 0, 2), dtype=np.float64)  # (T, B, F)
    z = np.tanh(x @ weight.T + bias)
    gates, cells = recurrence_forward(z, recurrent, gate_bias)
    predictions = cells @ readout[0] + readout_bias[0]  # (T, B)
    n_steps, batch = predictions.shape
    rows = np.arange(batch)
    valid = np.arange(n_steps)[:, None] < lengths[None, :]
    errors = predictions - targets[None, :]
    last = errors[lengths - 1, rows]
    main = float(np.mean(last**2))
    aux = float(np.mean((errors**2 * valid).sum(axis=0) / lengths))
    d_pred = (2.0 * aux_weight / batch) * errors * valid / lengths[None, :]
    d_pred[lengths - 1, rows] += 2.0 * last / batch
    d_readout = np.einsum("tb,tbh->h", d_pred, cells)[None, :]
    d_z, d_recurrent, d_gate_bias = recurrence_backward(z, recurrent, gates, cells, d_pred[:, :, None] * readout[0])
    d_pre = d_z * (1.0 - z**2)
    d_weight = np.einsum("tbh,tbf->hf", d_pre, x)
    return main, aux, [d_weight, d_pre.sum(axis=(0, 1)), d_recurrent, d_gate_bias, d_readout, np.array([d_pred.sum()])]


@dataclass
class TrainingEvent:
    steps: int
    main_loss: float  # the last batch's main loss
    aux_loss: float
    running_loss: float
    capped: bool


def train_until_converged(model: GatelessLSTM, adam: AdamState, buffer: LessonBuffer, cfg: RudderCreditConfig) -> TrainingEvent:
    """One training event: Adam steps on fresh uniform batches until the running main loss < threshold."""
    params = parameter_arrays(model)
    running = cfg.running_loss_init
    main = aux = float("nan")
    step = 0
    while running >= cfg.loss_threshold and step < cfg.max_steps_per_event:
        features, lengths, returns = buffer.sample(cfg.batch_size)
        main, aux, grads = loss_and_gradients(params, features, lengths, returns / cfg.reward_scale, cfg.aux_loss_weight)
        adam_step(params, grads, adam, cfg.learning_rate, cfg.weight_decay)
        running = cfg.running_loss_decay * running + (1.0 - cfg.running_loss_decay) * main
        step += 1
    return TrainingEvent(step, main, aux, running, running >= cfg.loss_threshold)


@torch.no_grad()
def redistribute(
    model: GatelessLSTM,
    features: np.ndarray | torch.Tensor,
    reward_scale: float = RudderLSTMConfig.reward_scale,
    lengths: np.ndarray | None = None,
) -> np.ndarray:
    """Eq. 5: r_t = R_scale (G_hat_t - G_hat_{t-1}), G_hat_{-1} = 0, for (B, T, F) or (T, F) features.

    Telescopes: sum_t r_t = R_scale * G_hat at the episode's last step. Steps at or past `lengths`
    (padding) get 0.
    """
    dtype = next(model.parameters()).dtype
    x = features.to(dtype) if torch.is_tensor(features) else torch.as_tensor(np.asarray(features), dtype=dtype)
    single = x.ndim == 2
    if single:
        x = x[None]
    predictions = model(x).double().numpy()
    rewards = reward_scale * np.diff(predictions, axis=1, prepend=0.0)
    if lengths is not None:
        rewards = np.where(np.arange(rewards.shape[1])[None, :] < np.asarray(lengths)[:, None], rewards, 0.0)
    return rewards[0] if single else rewards


class RudderRule(RewardRule):
    """RUDDER as a credit rule: observe(batch) trains the LSTM on schedule; advantages(batch) redistributes.

    `featurizer` maps the batch's `observations` (B, T, ...) and `actions` (B, T, ...) to the
    LSTM's per-step inputs (vcbm_gym/credit/features.py); `RudderRule.from_env(env)` takes the
    env's own (`credit_featurizer()`) or the flattened observation and action. Each episode's real
    steps are a prefix of its row (`mask`). Training-event statistics are kept in `last_event`.
    """

    name = "rudder"
    batch_needs = ("observations", "actions")

    def __init__(
        self, featurizer: Featurizer | None = None, *, config: RudderCreditConfig | None = None, seed: int = 0, **overrides: Any
    ) -> None:
        cfg = learned_rule_config("RudderRule", featurizer, config, RudderCreditConfig, overrides)
        self.config, self.featurizer = cfg, featurizer
        n_features = int(featurizer.n_features)
        self.model = GatelessLSTM(n_features, cfg.hidden_size, cfg.init_std, cfg.input_gate_bias_init, seed).double()
        self.adam = AdamState.zeros_like(parameter_arrays(self.model))
        self.buffer = LessonBuffer(cfg.buffer_capacity, 1, n_features, seed)
        self.episodes_seen = 0
        self.training_events = 0
        self.last_event: TrainingEvent | None = None

    @classmethod
    def from_env(cls, env: gym.Env, **kwargs: Any) -> RudderRule:
        """The rule on `env`'s features: its `credit_featurizer()` if it has one, else the flattened
        observation and action (the env contract, vcbm_gym/contract.py)."""
        return cls(episode_featurizer(env), **kwargs)

    @property
    def trained(self) -> bool:
        return self.training_events > 0

    def _features(self, batch: EpisodeBatch) -> tuple[np.ndarray, np.ndarray]:
        lengths, real = prefix_steps(batch, "RudderRule")
        features = self.featurizer(real(batch.observations), real(batch.actions))
        if features.shape[:2] != batch.mask.shape or features.shape[2] != self.model.cell_input.in_features:
            raise ValueError(
                f"featurizer output {features.shape}: expected {batch.mask.shape + (self.model.cell_input.in_features,)}"
            )
        return features, lengths

    def _training_due(self) -> bool:
        cfg = self.config
        return (
            self.episodes_seen % cfg.train_every == 0
            and len(self.buffer) > cfg.min_buffer_episodes
            and self.buffer.distinct_returns() > 1
        )

    def observe(self, batch: EpisodeBatch) -> None:
        """Add each episode to the lesson buffer; run a training event whenever the schedule says so."""
        features, lengths = self._features(batch)
        for feats, length, episode_return in zip(features, lengths, batch.returns):
            self.buffer.add(feats[:length], float(episode_return))
            self.episodes_seen += 1
            if self._training_due():
                self.last_event = train_until_converged(self.model, self.adam, self.buffer, self.config)
                self.training_events += 1

    def rewards(self, batch: EpisodeBatch) -> np.ndarray:
        """Redistributed per-step rewards (Eq. 5); the raw rewards until the LSTM has been trained once."""
        if not self.trained:
            return np.where(batch.mask, batch.rewards, 0.0)
        features, lengths = self._features(batch)
        return redistribute(self.model, features, self.config.reward_scale, lengths)

    def summary(self) -> dict[str, Any]:
        return {
            "n_features": int(self.featurizer.n_features),
            "episodes_seen": self.episodes_seen,
            "training_events": self.training_events,
        }

    def state_dict(self) -> dict[str, Any]:
        return {
            "config": asdict(self.config),
            "n_features": int(self.featurizer.n_features),
            "model": {k: v.detach().numpy().copy() for k, v in self.model.state_dict().items()},
            "optimizer": {
                "step": self.adam.step,
                "exp_avg": [m.copy() for m in self.adam.exp_avg],
                "exp_avg_sq": [v.copy() for v in self.adam.exp_avg_sq],
            },
            "buffer": self.buffer.state_dict(),
            "episodes_seen": self.episodes_seen,
            "training_events": self.training_events,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["config"] != asdict(self.config):
            raise ValueError("RudderRule.load_state_dict: the saved config differs from this rule's config")
        if state["n_features"] != self.featurizer.n_features:
            raise ValueError(
                f"RudderRule.load_state_dict: saved with {state['n_features']} features, "
                f"expected this rule's featurizer's {self.featurizer.n_features}"
            )
        self.model.load_state_dict({k: torch.as_tensor(np.asarray(v)) for k, v in state["model"].items()})
        optimizer = state["optimizer"]
        self.adam = AdamState(
            int(optimizer["step"]), [np.array(m) for m in optimizer["exp_avg"]], [np.array(v) for v in optimizer["exp_avg_sq"]]
        )
        self.buffer.load_state_dict(state["buffer"])
        self.episodes_seen = int(state["episodes_seen"])
        self.training_events = int(state["training_events"])
