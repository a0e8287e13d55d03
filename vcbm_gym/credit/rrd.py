"""RRD: randomized return decomposition, as a credit rule.

Ren, Guo, Zhou and Peng, "Learning Long-Term Reward Redistribution via Randomized Return
Decomposition", ICLR 2022, arXiv:2111.13485. A reward model r_theta(s_t, a_t) is fitted so that
the rewards of an episode add up to its return G. Least-squares return decomposition (the paper's
L_RD, Sec. 3) sums the model over all T steps of an episode:

    L_RD(theta) = E_tau [ (G - sum_{t < T} r_theta(s_t, a_t))^2 ].

RRD's surrogate (L_Rand-RD, Sec. 4.1) sums over a random subset I of the steps, drawn uniformly
without replacement, and rescales by T / |I|, so one gradient step reads K = |I| steps instead of T:

    L_Rand-RD(theta) = E_tau E_I [ (G - T/|I| sum_{t in I} r_theta(s_t, a_t))^2 ].

Since E_I[T/|I| sum_{t in I} r_t] = sum_t r_t, L_Rand-RD = L_RD + E_tau[Var_I(T/|I| sum_{t in I} r_t)]
(the paper's Proposition 1: the surrogate is an upper bound of L_RD, the gap being the Monte Carlo
variance, which favours smooth reward models). The bias-corrected loss subtracts an unbiased
estimate of that variance, so that its expectation over I is L_RD itself (the "RRD-L_RD" variant of
the paper's experiments; `bias_correction=True`). For sampling without replacement (the
finite-population correction; s_I^2 the sample variance of the r_t over I, with n - 1):

    Var_I(T/n sum_{t in I} r_t) = T^2 (1 - n/T) S^2 / n,   E_I[s_I^2] = S^2 (population variance with T - 1),
    L_corrected = (G - T/n sum_{t in I} r_t)^2 - T^2 (1 - n/T) s_I^2 / n.

The authors' code (github.com/Stilwell-Git/Randomized-Return-Decomposition, algorithm/rrd.py and
replay_buffer/mujoco_buffer/rrd_buffer.py) writes the same loss in per-step units (the mean of r over
I against G / T, with the coefficient 1 - K/T on s_I^2 / K), i.e. ours divided by T^2.

Choices where the paper is silent or tuned for MuJoCo:
- An episode shorter than K uses all of its steps (n = T): then the surrogate is L_RD exactly and
  the correction is 0 (the authors' code samples with replacement there).
- Features: the env's `credit_featurizer()` if it has one (WatchRepair's: the state as a difference
  from the previous step and the one-hot action, vcbm_gym/credit/features.py), else the flattened
  observation and action; the paper's MuJoCo model reads (s, a, s - s').
- Model: an MLP with ReLU hidden layers (`hidden_sizes`, default (64,); () is a linear model), in
  float64, initialised as torch's nn.Linear (seeded); the loss, its gradient and backpropagation are
  written in numpy (`rrd_loss`, `mlp_forward`, `mlp_backward`, tested against torch autograd) and
  the Adam step is `rudder.adam_step` (torch.optim.Adam's update, numpy state): autograd's per-op
  overhead made a step of this small model cost ~50 ms on two busy cores.
- `dtype: float32` (an option; float64 stays the default, so runs of an unchanged config compute what they
  did): the parameters, Adam's state and the MLP's products in float32, each layer one 2-D product over all
  rows (a (N, 1, F) stack of one-step episodes is N tiny products otherwise); the loss and its gradient with
  respect to the rewards stay float64. The same math to float32 rounding (tested against the float64 step);
  about half the time of the model's step and a quarter of the replay buffer's relabelling forward pass on the
  256-256 MuJoCo model; SAC + RRD on Hopper 1.2-1.5x faster end to end (benchmarks/sac_speed_levers.py).
- `backend: jax` (an option; numpy the default): the same model in JAX (vcbm_gym/credit/rrd_jax.py, imported only
  when chosen; jax comes with the `sbx` extra): the same parameters and initialisation, the same subsets (the rule's
  numpy rng), the same loss (`loss_terms`, written once for numpy and jax.numpy) with its gradient by jax.grad, and
  Adam's update by optax (torch.optim.Adam's maths); a step is one compiled XLA call. Both backends read and write
  the same state dict, so a run saved by one resumes on the other. Not the default under SBX either: a step of the
  256-256 MuJoCo model is a few dense products, compute-bound on one core, and XLA's took as long as numpy's BLAS
  (SAC + RRD on Hopper under sbx ran slower with it on a loaded two-core machine: benchmarks/sbx_speed.py's
  sac+rrd-jax against sac+rrd).
- Schedule: on each `observe`, the episodes enter a FIFO lesson buffer (`rudder.LessonBuffer`);
  once it holds `min_buffer_episodes`, `train_steps` Adam steps each on `episodes_per_step`
  buffer episodes, one random subset of K steps per episode.

The credit: A_t = r_theta(s_t, a_t), the learned proxy reward of every trained step (as the RUDDER
rule gives its redistributed reward); the raw rewards until the first training step.
"""

from __future__ import annotations

import importlib.util
from dataclasses import asdict, dataclass, replace
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn

import vcbm_gym.credit.options as options
from vcbm_gym.credit.base import EpisodeBatch, RewardRule
from vcbm_gym.credit.features import (
    Featurizer,
    TransitionFeaturizer,
    episode_featurizer,
    is_per_transition,
    prefix_steps,
)
from vcbm_gym.credit.model_training import AdamState, LessonBuffer, adam_step, learned_rule_config
from vcbm_gym.credit.rrd_math import loss_terms, mlp_forward

DTYPES = ("float64", "float32")
BACKENDS = ("numpy", "jax")


@dataclass
class RRDConfig:
    """The reward model and its training schedule."""

    hidden_sizes: tuple[int, ...] = (64,)
    subsequence_size: int = 16  # K = |I|, steps per sampled subset
    episodes_per_step: int = 32  # episodes (one subset each) per Adam step
    train_steps: int = 32  # Adam steps per observe() once the buffer is ready
    learning_rate: float = 3e-3
    buffer_capacity: int = 2048
    min_buffer_episodes: int = 32
    bias_correction: bool = False
    transition_features: bool = False  # the paper's MuJoCo input [s, a, s - s'] instead of the env's step features
    per_step_loss: bool = False  # the reference code's units: each episode's loss divided by T^2 (every length weighs alike)
    train_steps_per_env_step: float = 0.0  # more Adam steps per observe: this many per observed transition (reference: 1)
    dtype: str = "float64"  # the model's parameters and products: float64, or float32 (faster; see the docstring)
    backend: str = "numpy"  # what computes the model: numpy, or jax (rrd_jax.py; the sbx extra)

    def __post_init__(self) -> None:
        self.hidden_sizes = options.layer_widths("hidden_sizes", self.hidden_sizes)
        for name in ("subsequence_size", "episodes_per_step", "buffer_capacity", "min_buffer_episodes"):
            setattr(self, name, options.integer(name, getattr(self, name), 1))
        self.train_steps = options.integer("train_steps", self.train_steps, 0)
        self.learning_rate = options.number("learning_rate", self.learning_rate, above=0)
        self.bias_correction = options.flag("bias_correction", self.bias_correction)
        self.transition_features = options.flag("transition_features", self.transition_features)
        self.per_step_loss = options.flag("per_step_loss", self.per_step_loss)
        self.train_steps_per_env_step = options.number("train_steps_per_env_step", self.train_steps_per_env_step, 0)
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype={self.dtype!r}: expected one of {', '.join(DTYPES)}")
        if self.backend not in BACKENDS:
            raise ValueError(f"backend={self.backend!r}: expected one of {', '.join(BACKENDS)}")


class RewardModel(nn.Module):
    """r_theta: per-step features (..., F) -> per-step rewards (...), an MLP with ReLU hidden layers."""

    def __init__(
        self, n_features: int, hidden_sizes: tuple[int, ...] = RRDConfig.hidden_sizes, seed: int = 0, dtype: str = RRDConfig.dtype
    ) -> None:
        super().__init__()
        widths = [int(n_features), *hidden_sizes]
        layers: list[nn.Module] = []
        with torch.random.fork_rng(devices=[]):  # seeded initialisation without touching the caller's torch RNG
            torch.manual_seed(int(seed))
            for fan_in, fan_out in zip(widths[:-1], widths[1:]):
                layers += [nn.Linear(fan_in, fan_out), nn.ReLU()]
            layers.append(nn.Linear(widths[-1], 1))
        self.net = nn.Sequential(*layers).to(getattr(torch, dtype))  # initialised in float32, then cast

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.net(features).squeeze(-1)


def rrd_loss(
    step_rewards: np.ndarray,
    sample_mask: np.ndarray,
    lengths: np.ndarray,
    returns: np.ndarray,
    bias_correction: bool = RRDConfig.bias_correction,
    per_step: bool = RRDConfig.per_step_loss,
) -> tuple[float, float, float, np.ndarray]:
    """L_Rand-RD on one sampled subset per episode, its bias correction, and the gradient:
    (loss, surrogate, correction, d loss / d step_rewards).

    step_rewards (B, K): r_theta on the sampled steps; sample_mask (B, K): the n_i = min(K, T_i) real
    samples of episode i; lengths (B,): T_i; returns (B,): G_i. Per episode
    surrogate_i = (G_i - T_i/n_i sum_{t in I_i} r_t)^2 and correction_i = T_i^2 (1 - n_i/T_i) s_i^2 / n_i
    (s_i^2 the sample variance of the sampled r_t, 0 when n_i < 2); loss = mean_i surrogate_i, minus
    mean_i correction_i with `bias_correction`. `per_step` divides episode i's terms by T_i^2, the units of the
    reference code: (mean_{t in I} r_t - G_i / T_i)^2 minus s_i^2 (1 - n_i / T_i) / n_i. Written out with its
    gradient (tested against torch autograd): a training step is a few small matrix products, which numpy runs
    without autograd's overhead.
    """
    r = np.asarray(step_rewards, dtype=np.float64)
    m = np.asarray(sample_mask, dtype=np.float64)
    t = np.asarray(lengths, dtype=np.float64)
    terms = loss_terms(r, m, t, np.asarray(returns, dtype=np.float64), per_step)
    batch = len(r)
    surrogate, correction = terms.surrogate.mean(), terms.correction.mean()
    grad = (-2.0 * terms.residual * t / terms.n * terms.weight)[:, None] * m / batch
    loss = float(surrogate)
    if bias_correction:
        loss -= float(correction)
        grad -= (2.0 * terms.coef / terms.dof)[:, None] * terms.centred / batch  # d s^2 / d r_k = 2 (r_k - mean) / (n - 1)
    return loss, float(surrogate), float(correction), grad


def mlp_backward(params: list[np.ndarray], activations: list[np.ndarray], d_rewards: np.ndarray) -> list[np.ndarray]:
    """Gradients of the parameters (in `params` order) given d loss / d rewards, by backpropagation through `mlp_forward`."""
    grads: list[np.ndarray] = [np.empty(0)] * len(params)
    d_h = d_rewards[..., None]
    for layer in range(len(params) - 2, -1, -2):
        if layer + 2 < len(params):
            d_h = d_h * (activations[layer // 2 + 1] > 0.0)  # through the ReLU
        inputs = activations[layer // 2]
        grads[layer] = d_h.reshape(-1, d_h.shape[-1]).T @ inputs.reshape(-1, inputs.shape[-1])
        grads[layer + 1] = d_h.reshape(-1, d_h.shape[-1]).sum(axis=0)
        d_h = d_h @ params[layer]
    return grads


def sample_subsets(rng: np.random.Generator, lengths: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """One uniform random subset of min(size, T_i) distinct steps of each episode: (indices (B, K), mask (B, K)),
    K = min(size, max T_i); masked-off columns hold index 0."""
    lengths = np.asarray(lengths, dtype=np.int64)
    horizon = int(lengths.max())
    keys = rng.random((len(lengths), horizon))
    keys[np.arange(horizon)[None, :] >= lengths[:, None]] = np.inf  # padding sorts last
    k = min(int(size), horizon)
    indices = np.argsort(keys, axis=1, kind="stable")[:, :k]
    mask = np.arange(k)[None, :] < np.minimum(lengths, k)[:, None]
    return np.where(mask, indices, 0), mask


def jax_backend() -> Any:
    """vcbm_gym.credit.rrd_jax, imported when a rule first chooses it (jax starts then: the SB3 arm has set XLA's
    threads before); a missing jax or optax is one ValueError line naming the extra that brings them."""
    for module in ("jax", "optax"):
        try:
            found = importlib.util.find_spec(module)
        except (ImportError, ValueError):  # set to None in sys.modules, or left half-imported
            found = None
        if found is None:
            raise ValueError(
                f"backend='jax' needs {module}, which is not installed: install the sbx extra "
                '(pip install -e ".[sbx]"), or expected backend numpy'
            )
    import vcbm_gym.credit.rrd_jax as rrd_jax

    return rrd_jax


@dataclass
class TrainingStats:
    steps: int = 0
    loss: float = float("nan")  # the last step's loss (the corrected one with bias_correction)
    surrogate: float = float("nan")
    correction: float = float("nan")


class RRDRule(RewardRule):
    """RRD as a credit rule: observe(batch) trains r_theta on random subsets; advantages(batch) = r_theta per step.

    `featurizer` maps the batch's observations and actions to per-step features (features.py);
    `RRDRule.from_env(env)` takes the env's own or the flattened observation and action. Each
    episode's real steps are a prefix of its row (`mask`).
    """

    name = "rrd"
    batch_needs = ("observations", "actions")

    def __init__(
        self, featurizer: Featurizer | None = None, *, config: RRDConfig | None = None, seed: int = 0, **overrides: Any
    ) -> None:
        cfg = learned_rule_config("RRDRule", featurizer, config, RRDConfig, overrides)
        self.config, self.featurizer = cfg, featurizer
        self.n_features = int(featurizer.n_features)
        model = RewardModel(self.n_features, cfg.hidden_sizes, seed, cfg.dtype)
        self.dtype = np.dtype(cfg.dtype)
        params = [p.detach().numpy() for p in model.parameters()]  # numpy views, updated in place by the numpy Adam
        self.jax = jax_backend().JaxRewardModel(params, cfg) if cfg.backend == "jax" else None
        self.model = model if self.jax is None else None  # the JAX backend keeps its own copy of the weights
        self._params, self._adam = (params, AdamState.zeros_like(params)) if self.jax is None else ([], AdamState(0, [], []))
        self.buffer = LessonBuffer(cfg.buffer_capacity, 1, self.n_features, seed)
        self.rng = np.random.default_rng(np.random.SeedSequence([seed, 0x44D]))
        self.episodes_seen = 0
        self.stats = TrainingStats()

    @classmethod
    def from_env(cls, env: gym.Env, **kwargs: Any) -> RRDRule:
        """The rule on `env`'s features: [s, a, s - s'] with `transition_features`, else its `credit_featurizer()`
        if it has one, else the flattened observation and action."""
        config = kwargs.get("config") or RRDConfig()
        if kwargs.get("transition_features", config.transition_features):
            try:
                return cls(TransitionFeaturizer(env.observation_space, env.action_space), **kwargs)
            except TypeError as exc:
                raise ValueError(f"transition_features=True: {exc}") from None
        return cls(episode_featurizer(env), **kwargs)

    def needs(self) -> tuple[str, ...]:
        extra = ("extras['next_observations']",) if getattr(self.featurizer, "uses_next_observations", False) else ()
        return self.batch_needs + extra

    @property
    def trained(self) -> bool:
        return self.stats.steps > 0

    @property
    def params(self) -> list[np.ndarray]:
        """[W_1, b_1, ..., W_L, b_L] in numpy: the numpy backend's own arrays, a copy of the JAX backend's."""
        return self._params if self.jax is None else self.jax.params()

    @property
    def adam(self) -> AdamState:
        """Adam's state in numpy: the numpy backend's own, a copy of the JAX backend's (optax's count and moments)."""
        return self._adam if self.jax is None else self.jax.adam()

    def _features(self, batch: EpisodeBatch) -> tuple[np.ndarray, np.ndarray]:
        lengths, real = prefix_steps(batch, "RRDRule")
        inputs = [real(batch.observations), real(batch.actions)]
        if getattr(self.featurizer, "uses_next_observations", False):
            inputs.append(real(batch.extras["next_observations"]))
        features = np.asarray(self.featurizer(*inputs), dtype=np.float64)
        if features.shape != batch.mask.shape + (self.n_features,):
            raise ValueError(f"featurizer output {features.shape}: expected {batch.mask.shape + (self.n_features,)}")
        return features, lengths

    def forward(self, features: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
        """`mlp_forward` of (..., F) features in the model's dtype; float32 runs it as one 2-D product per layer."""
        if self.dtype == np.float64:
            return mlp_forward(self.params, np.asarray(features, dtype=np.float64))
        rows = np.asarray(features, dtype=self.dtype).reshape(-1, self.n_features)
        rewards, activations = mlp_forward(self.params, rows)
        return rewards.reshape(np.shape(features)[:-1]), activations

    def sample(
        self, features: np.ndarray, lengths: np.ndarray, returns: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """One random subset of each episode's steps (the rule's rng, either backend): (features (B, K, F), mask (B, K),
        lengths, returns)."""
        indices, mask = sample_subsets(self.rng, lengths, self.config.subsequence_size)
        return np.take_along_axis(features, indices[:, :, None], axis=1), mask, lengths, returns

    def loss_and_gradients(
        self, features: np.ndarray, lengths: np.ndarray, returns: np.ndarray
    ) -> tuple[tuple[float, float, float], list[np.ndarray]]:
        """((loss, surrogate, correction), parameter gradients) on one random subset of each episode's steps."""
        cfg = self.config
        sampled, mask, lengths, returns = self.sample(features, lengths, returns)
        if self.jax is not None:
            return self.jax.loss_and_gradients(sampled, mask, lengths, returns)
        step_rewards, activations = self.forward(sampled)
        loss, surrogate, correction, d_rewards = rrd_loss(
            step_rewards, mask, lengths, returns, cfg.bias_correction, cfg.per_step_loss
        )
        d_rewards = d_rewards.astype(self.dtype).reshape(step_rewards.shape if self.dtype == np.float64 else -1)
        return (loss, surrogate, correction), mlp_backward(self.params, activations, d_rewards)

    def train_step(self) -> float:
        """One Adam step of the (corrected) surrogate on `episodes_per_step` buffer episodes; returns the loss."""
        cfg = self.config
        episodes = self.buffer.sample(cfg.episodes_per_step)
        if self.jax is not None:  # the gradient and the Adam update in one compiled call
            loss, surrogate, correction = self.jax.train_step(*self.sample(*episodes))
        else:
            (loss, surrogate, correction), grads = self.loss_and_gradients(*episodes)
            adam_step(self._params, grads, self._adam, cfg.learning_rate, 0.0)
        stats = self.stats
        stats.steps += 1
        stats.loss, stats.surrogate, stats.correction = loss, surrogate, correction
        return loss

    def observe(self, batch: EpisodeBatch) -> None:
        """Add the episodes to the lesson buffer; once it holds `min_buffer_episodes`, train `train_steps` steps plus
        `train_steps_per_env_step` per transition observed."""
        features, lengths = self._features(batch)
        for feats, length, episode_return in zip(features, lengths, batch.returns):
            self.buffer.add(feats[:length].astype(np.float32), float(episode_return))
            self.episodes_seen += 1
        if len(self.buffer) >= self.config.min_buffer_episodes:
            extra = round(self.config.train_steps_per_env_step * float(lengths.sum()))
            for _ in range(self.config.train_steps + extra):
                self.train_step()

    def model_rewards(self, batch: EpisodeBatch) -> np.ndarray:
        """(B, T) r_theta(s_t, a_t) on the trained steps, 0 elsewhere."""
        features, _ = self._features(batch)
        rewards = self.forward(features)[0] if self.jax is None else self.jax.rewards(features)
        return np.where(batch.mask, rewards.astype(np.float64), 0.0)

    def rewards(self, batch: EpisodeBatch) -> np.ndarray:
        """The learned proxy rewards r_theta(s_t, a_t); the raw rewards until the first training step."""
        if not self.trained:
            return np.where(batch.mask, batch.rewards, 0.0)
        return self.model_rewards(batch)

    def transition_rewards(self, observations, actions, next_observations, episode_returns) -> np.ndarray | None:
        """r_theta of N stored transitions (each as a one-step episode), where the features are per transition;
        None before the first training step (the buffer keeps the rewards it stored) or with sequence features."""
        if not self.trained or not is_per_transition(self.featurizer):
            return None
        one_step = EpisodeBatch(
            np.zeros((len(observations), 1)),
            np.ones((len(observations), 1), dtype=bool),
            observations=np.asarray(observations)[:, None],
            actions=np.asarray(actions)[:, None],
            extras={"next_observations": np.asarray(next_observations)[:, None]},
        )
        return self.model_rewards(one_step)[:, 0]

    def summary(self) -> dict[str, Any]:
        return {
            "n_features": self.n_features,
            "episodes_seen": self.episodes_seen,
            "train_steps": self.stats.steps,
            "last_loss": self.stats.loss,
        }

    def state_dict(self) -> dict[str, Any]:
        return {
            "config": asdict(self.config),
            "n_features": self.n_features,
            "params": [p.copy() for p in self.params],
            "optimizer": {
                "step": self.adam.step,
                "exp_avg": [m.copy() for m in self.adam.exp_avg],
                "exp_avg_sq": [v.copy() for v in self.adam.exp_avg_sq],
            },
            "buffer": self.buffer.state_dict(),
            "rng": self.rng.bit_generator.state,
            "episodes_seen": self.episodes_seen,
            "stats": {
                "steps": self.stats.steps,
                "loss": self.stats.loss,
                "surrogate": self.stats.surrogate,
                "correction": self.stats.correction,
            },
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        # the backend computes the same model: a state saved by one continues on the other
        if replace(RRDConfig(**state["config"]), backend=self.config.backend) != self.config:
            raise ValueError("RRDRule.load_state_dict: the saved config differs from this rule's config")
        if state["n_features"] != self.n_features:
            raise ValueError(f"RRDRule.load_state_dict: saved with {state['n_features']} features, expected {self.n_features}")
        params = [np.array(saved, dtype=self.dtype) for saved in state["params"]]
        optimizer = state["optimizer"]
        moments = [[np.array(m, dtype=self.dtype) for m in optimizer[key]] for key in ("exp_avg", "exp_avg_sq")]
        adam = AdamState(int(optimizer["step"]), *moments)
        if self.jax is not None:
            self.jax.load(params, adam)
        else:
            for param, saved in zip(self._params, params):
                param[...] = saved
            self._adam = adam
        self.buffer.load_state_dict(state["buffer"])
        self.rng.bit_generator.state = state["rng"]
        self.episodes_seen = int(state["episodes_seen"])
        self.stats = TrainingStats(**{k: (int(v) if k == "steps" else float(v)) for k, v in state["stats"].items()})
