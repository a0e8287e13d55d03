"""RRD's JAX backend (vcbm_gym/credit/rrd_jax.py, `backend: jax`): the numpy backend's step by hand and on random
models, learning, the state both backends share, the missing-jax line, and the SB3 arm's thread settings for it."""

from __future__ import annotations

import copy
import json
import sys

import numpy as np
import pytest

pytest.importorskip("jax")
pytest.importorskip("optax")

import jax.numpy as jnp  # noqa: E402

from tests.helpers import run_without_xla_settings  # noqa: E402
from vcbm_gym.credit.base import EpisodeBatch  # noqa: E402
from vcbm_gym.credit.rrd import RRDConfig, RRDRule  # noqa: E402

BACKENDS = ("numpy", "jax")
# float32's unit roundoff is 2^-24; the longest sums of a step have a few hundred terms (tests/test_rrd_dtype.py)
RTOL32 = 256 * 2.0**-24


class Identity:
    """Featurizer: the observation's components are the features."""

    def __init__(self, n_features: int) -> None:
        self.n_features = n_features

    def __call__(self, observations: np.ndarray, actions: np.ndarray) -> np.ndarray:
        return np.asarray(observations, dtype=np.float32)


def _rules(n_features: int, **options) -> dict[str, RRDRule]:
    return {backend: RRDRule(Identity(n_features), seed=3, backend=backend, **options) for backend in BACKENDS}


def _set_params(rule: RRDRule, params: list[np.ndarray]) -> None:
    state = rule.state_dict()
    state["params"] = params
    rule.load_state_dict(state)


def _fill_buffers(rules: dict[str, RRDRule], n_episodes: int, seed: int) -> None:
    """The same random episodes (3 to 120 steps: some shorter than K, some longer) in every rule's buffer."""
    rng = np.random.default_rng(seed)
    n_features = next(iter(rules.values())).n_features
    for _ in range(n_episodes):
        features = rng.standard_normal((int(rng.integers(3, 120)), n_features)).astype(np.float32)
        episode_return = float(rng.normal(0.0, 20.0))
        for rule in rules.values():
            rule.buffer.add(features, episode_return)


@pytest.mark.parametrize("backend", BACKENDS)
def test_one_step_by_hand_on_a_linear_model(backend):
    """r = w x + b with w = 0.5, b = 0 on one episode x = (1, 2), G = 4, K = T = 2: the residual is
    4 - (0.5 + 1.0) = 2.5, the loss 6.25, d loss / d r_t = -2 * 2.5 = -5, so dw = -5 (1 + 2) = -15 and db = -10. Adam's
    first step moves each parameter by lr against its gradient's sign (m / sqrt(v) = g / |g| after bias correction):
    w = 0.5 + 0.1, b = 0 + 0.1. A step that ascended the loss would give 0.4 and -0.1."""
    rule = RRDRule(Identity(1), backend=backend, hidden_sizes=(), subsequence_size=2, episodes_per_step=1, learning_rate=0.1)
    _set_params(rule, [np.array([[0.5]]), np.array([0.0])])
    rule.buffer.add(np.array([[1.0], [2.0]], dtype=np.float32), 4.0)
    (loss, surrogate, correction), grads = rule.loss_and_gradients(*rule.buffer.sample(1))
    assert (loss, surrogate, correction) == pytest.approx((6.25, 6.25, 0.0))
    np.testing.assert_allclose(grads[0], [[-15.0]])
    np.testing.assert_allclose(grads[1], [-10.0])
    assert rule.train_step() == pytest.approx(6.25)
    np.testing.assert_allclose(rule.params[0], [[0.6]], atol=1e-8)
    np.testing.assert_allclose(rule.params[1], [0.1], atol=1e-8)
    assert rule.adam.step == 1 and rule.stats.steps == 1


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize(
    ("bias_correction", "per_step_loss", "subsequence_size"), [(False, False, 64), (True, True, 64), (False, True, 200)]
)
def test_jax_steps_equal_numpy_steps_on_a_random_model(dtype, bias_correction, per_step_loss, subsequence_size):
    """The same initial weights, subsets, loss, gradients and Adam steps: float64 agrees to float64 rounding, float32 to
    float32 rounding, after 5 steps of 8 episodes of 3 to 120 steps. K = 64 samples the longer ones and takes all of the
    shorter; K = 200 exceeds every episode, so the JAX step's columns are padded past the longest."""
    rules = _rules(
        7,
        hidden_sizes=(32, 32),
        subsequence_size=subsequence_size,
        episodes_per_step=8,
        dtype=dtype,
        bias_correction=bias_correction,
        per_step_loss=per_step_loss,
    )
    for p_np, p_jax in zip(rules["numpy"].params, rules["jax"].params):
        assert p_jax.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(p_np, p_jax)  # the same initialisation
    _fill_buffers(rules, 20, seed=0)
    rtol = 1e-10 if dtype == "float64" else RTOL32
    (loss_np, *_), grads_np = rules["numpy"].loss_and_gradients(*rules["numpy"].buffer.sample(8))
    (loss_jax, *_), grads_jax = rules["jax"].loss_and_gradients(*rules["jax"].buffer.sample(8))
    assert loss_np > 0 and loss_jax == pytest.approx(loss_np, rel=rtol)
    for g_np, g_jax in zip(grads_np, grads_jax):
        assert np.abs(g_jax - g_np).max() <= rtol * np.abs(g_np).max()
    for _ in range(5):
        losses = {backend: rule.train_step() for backend, rule in rules.items()}
        assert losses["jax"] == pytest.approx(losses["numpy"], rel=rtol)
    # each Adam step moves a weight by at most about lr = 3e-3; gradients that agree to rtol move it alike
    for p_np, p_jax in zip(rules["numpy"].params, rules["jax"].params):
        assert np.abs(p_jax - p_np).max() <= 5 * 3e-3 * (1e-9 if dtype == "float64" else 1e-3)
    for m_np, m_jax in zip(rules["numpy"].adam.exp_avg_sq, rules["jax"].adam.exp_avg_sq):
        assert np.abs(m_jax - m_np).max() <= rtol * np.abs(m_np).max()
    rng = np.random.default_rng(1)
    batch = EpisodeBatch(  # rewards of a padded (B, T) batch: 15 rows, a forward pass padded to 16
        np.zeros((3, 5)),
        np.arange(5)[None, :] < np.array([[5], [2], [4]]),
        observations=rng.standard_normal((3, 5, 7)),
        actions=np.zeros((3, 5)),
    )
    r_np, r_jax = (rule.model_rewards(batch) for rule in rules.values())
    assert r_jax.dtype == np.float64 and np.all(r_jax[1, 2:] == 0.0)
    assert np.abs(r_jax - r_np).max() <= max(rtol, 1e-12) * np.abs(r_np).max()


def test_jax_training_lowers_the_loss_and_recovers_a_known_reward():
    """Ten-step episodes of 4 categories with a known per-step reward and the return at the end: the linear JAX model's
    L_RD on held-out episodes falls below 1% of its start and its rewards approach the true ones (ascending the loss,
    or a gradient of the wrong sign, would raise L_RD instead)."""
    true_reward = np.array([-1.0, 0.5, 2.0, 0.0])

    def episodes(rng: np.random.Generator, n: int) -> EpisodeBatch:
        categories = rng.integers(0, 4, size=(n, 10))
        rewards = np.zeros((n, 10))
        rewards[:, -1] = true_reward[categories].sum(axis=1)
        return EpisodeBatch(rewards, np.ones((n, 10), bool), observations=np.eye(4)[categories], actions=np.zeros((n, 10)))

    rule = RRDRule(
        Identity(4),
        backend="jax",
        hidden_sizes=(),
        subsequence_size=10,
        episodes_per_step=32,
        train_steps=100,
        learning_rate=0.02,
        min_buffer_episodes=64,
        seed=3,
    )
    held_out = episodes(np.random.default_rng(99), 200)

    def l_rd() -> float:
        return float(np.mean((held_out.returns - rule.model_rewards(held_out).sum(axis=1)) ** 2))

    before, rng = l_rd(), np.random.default_rng(7)
    for _ in range(8):
        rule.observe(episodes(rng, 64))
    assert rule.stats.steps == 800 and l_rd() < 0.01 * before
    one_of_each = EpisodeBatch(np.zeros((1, 4)), np.ones((1, 4), bool), observations=np.eye(4)[None], actions=np.zeros((1, 4)))
    np.testing.assert_allclose(rule.model_rewards(one_of_each)[0], true_reward, atol=1e-3)


@pytest.mark.parametrize(("saved_by", "resumed_by"), [("jax", "jax"), ("numpy", "jax"), ("jax", "numpy")])
def test_state_round_trip_continues_on_either_backend(saved_by, resumed_by):
    options = dict(hidden_sizes=(16,), subsequence_size=16, episodes_per_step=4)
    rules = {"saved": RRDRule(Identity(5), seed=1, backend=saved_by, **options)}
    rules["reference"] = RRDRule(Identity(5), seed=1, backend=resumed_by, **options)
    _fill_buffers(rules, 10, seed=2)
    for rule in rules.values():
        for _ in range(3):
            rule.train_step()
    state = copy.deepcopy(rules["saved"].state_dict())
    assert state["config"]["backend"] == saved_by and state["optimizer"]["step"] == 3
    assert all(isinstance(p, np.ndarray) and p.dtype == np.float64 for p in state["params"])
    state["config"] = json.loads(json.dumps(state["config"]))  # a config through JSON still matches
    resumed = RRDRule(Identity(5), seed=9, backend=resumed_by, **options)
    resumed.load_state_dict(state)
    for _ in range(3):
        assert resumed.train_step() == pytest.approx(rules["reference"].train_step(), rel=1e-10)
    for a, b in zip(resumed.params, rules["reference"].params):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-12)
    with pytest.raises(ValueError, match="saved config differs"):
        RRDRule(Identity(5), backend=resumed_by, hidden_sizes=(8,)).load_state_dict(state)


def test_float64_jax_model_leaves_jax_default_precision_alone():
    rule = RRDRule(Identity(3), backend="jax", hidden_sizes=(4,))
    assert rule.params[0].dtype == np.float64
    rule.model_rewards(
        EpisodeBatch(np.zeros((1, 2)), np.ones((1, 2), bool), observations=np.ones((1, 2, 3)), actions=np.zeros((1, 2)))
    )
    assert jnp.asarray(np.ones(2)).dtype == jnp.float32  # SBX's networks in the same process keep float32


def test_bad_backend_and_missing_jax_are_one_clear_line(monkeypatch):
    assert RRDConfig().backend == "numpy"
    with pytest.raises(ValueError, match="backend='torch': expected one of numpy, jax"):
        RRDConfig(backend="torch")
    monkeypatch.setitem(sys.modules, "jax", None)
    with pytest.raises(ValueError, match=r"backend='jax' needs jax, which is not installed: install the sbx extra") as info:
        RRDRule(Identity(2), backend="jax")
    assert "\n" not in str(info.value)
    from algorithms.common.credit_slot import CreditSlot
    from algorithms.common.errors import ConfigError
    from algorithms.sb3.runner import ARM

    with pytest.raises(ConfigError, match=r"credit rule 'rrd' .*backend='jax' needs jax"):
        CreditSlot("rrd", {"rrd": {"backend": "jax"}}).build(ARM.credit_fit("sac"), env=_watch_repair())


def _watch_repair():
    import gymnasium as gym

    import vcbm_gym  # noqa: F401  (registers WatchRepair-v0)

    return gym.make("WatchRepair-v0")


def test_sb3_arm_sets_xla_threads_before_a_jax_rrd_rule_imports_jax():
    """A run whose RRD computes in JAX, under engine sb3 too, starts jax with the run's thread settings (torch_threads 1:
    XLA single-threaded), set before anything imports jax; fresh process: XLA reads them once."""
    script = (
        "import os, sys\n"
        "from algorithms.train import resolve_spec\n"
        "assert 'jax' not in sys.modules\n"
        "spec = resolve_spec('dqn', 'WatchRepair-v0', 0, {'credit': 'rrd', 'credit_kwargs': {'rrd': {'backend': 'jax'}},"
        " 'learning_starts': 100})\n"
        "assert 'jax' in sys.modules and 'vcbm_gym.credit.rrd_jax' in sys.modules\n"
        "print(os.environ['XLA_FLAGS'], os.environ['JAX_PLATFORMS'])\n"
    )
    done = run_without_xla_settings(script)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["--xla_cpu_multi_thread_eigen=false", "intra_op_parallelism_threads=1", "cpu"]


@pytest.mark.parametrize(
    ("engine", "options", "backend"),
    [("sbx", {}, None), ("sbx", {"backend": "jax"}, "jax"), ("sb3", {}, None), ("sb3", {"backend": "jax"}, "jax")],
)
def test_rrd_computes_in_numpy_under_either_engine_unless_credit_kwargs_choose_jax(engine, options, backend):
    pytest.importorskip("sbx")
    from algorithms.sb3.runner import ARM
    from algorithms.train import resolve_spec

    overrides = {"engine": engine, "credit": "rrd", "learning_starts": 100, "credit_kwargs": {"rrd": options}}
    spec = resolve_spec("dqn", "WatchRepair-v0", 0, overrides)
    assert spec.hyperparams["credit_kwargs"]["rrd"].get("backend") == backend  # the resolved config as written
    rule = spec.config.run.slot.build(ARM.credit_fit("dqn"), env=_watch_repair())
    assert rule.config.backend == (backend or "numpy") and (rule.jax is not None) == (backend == "jax")
