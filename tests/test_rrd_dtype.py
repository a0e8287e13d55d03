"""RRD's `dtype: float32` option (vcbm_gym/credit/rrd.py): the same loss, gradients and relabelled rewards as the
float64 model to float32 rounding, on the MuJoCo reference model (256-256 on [s, a, s - s'] of Hopper)."""

from __future__ import annotations

import copy

import gymnasium as gym
import numpy as np
import pytest

import vcbm_gym  # noqa: F401  (registers EpisodicHopper-v5)
from vcbm_gym.credit.base import EpisodeBatch
from vcbm_gym.credit.rrd import RRDConfig, RRDRule

# zoo_configs/sac.yml's rrd entry
MUJOCO = dict(
    transition_features=True,
    per_step_loss=True,
    hidden_sizes=(256, 256),
    learning_rate=3e-4,
    episodes_per_step=4,
    subsequence_size=64,
    train_steps=0,
    train_steps_per_env_step=1.0,
    min_buffer_episodes=4,
    buffer_capacity=1000,
)
# float32's unit roundoff is u = 2^-24 = 6e-8. The longest sum in a step has 256 terms (a hidden layer's fan-in,
# and the 4 x 64 sampled rows a weight gradient adds up): its rounding error is at most about 256 u = 1.5e-5 of the
# summed magnitudes (random roundings give about sqrt(256) u = 1e-6: measured 1e-7 to 7e-7 here). A wrong float32
# path (a dropped ReLU mask, a transposed weight, a row mixed up by the reshape) is off by O(1).
RTOL = 256 * 2.0**-24


def _hopper_rules() -> tuple[RRDRule, RRDRule]:
    env = gym.make("EpisodicHopper-v5")
    rules = tuple(RRDRule.from_env(env, seed=5, dtype=dtype, **MUJOCO) for dtype in ("float64", "float32"))
    env.close()
    rng = np.random.default_rng(0)
    for _ in range(12):  # the same stored episodes (the buffer stores float32 features either way)
        length = int(rng.integers(20, 120))
        features = (rng.standard_normal((length, rules[0].n_features)) * 2.0).astype(np.float32)
        ret = float(rng.normal(0.0, 50.0))
        for rule in rules:
            rule.buffer.add(features, ret)
    return rules


def _relative_error(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(np.asarray(got, np.float64) - want).max() / np.abs(want).max())


def test_float32_starts_from_the_float64_models_weights():
    wide, narrow = _hopper_rules()
    assert [p.dtype for p in narrow.params] == [np.float32] * 6 and [a.dtype for a in narrow.adam.exp_avg] == [np.float32] * 6
    for p64, p32 in zip(wide.params, narrow.params):
        np.testing.assert_array_equal(p64, p32.astype(np.float64))  # nn.Linear initialises in float32: exact


def test_float32_loss_and_gradients_equal_float64_to_float32_rounding():
    wide, narrow = _hopper_rules()
    for _ in range(3):  # same buffer and subset rngs: the same episodes and steps in both
        (loss64, *_), grads64 = wide.loss_and_gradients(*wide.buffer.sample(4))
        (loss32, *_), grads32 = narrow.loss_and_gradients(*narrow.buffer.sample(4))
        assert loss64 > 0 and abs(loss32 - loss64) <= RTOL * loss64
        for g64, g32 in zip(grads64, grads32):
            assert g32.dtype == np.float32 and g32.shape == g64.shape
            assert _relative_error(g32, g64) <= RTOL


def test_float32_training_tracks_float64_and_relabels_the_same_rewards():
    """20 Adam steps side by side: each step moves a weight by at most about lr = 3e-4, and gradients that agree to
    RTOL move it alike, so the weights stay within a thousandth of 20 lr (measured 6e-8); the relabelled rewards
    of stored transitions agree to RTOL."""
    wide, narrow = _hopper_rules()
    for _ in range(20):
        wide.train_step()
        narrow.train_step()
    assert abs(narrow.stats.loss - wide.stats.loss) <= RTOL * wide.stats.loss
    for p64, p32 in zip(wide.params, narrow.params):
        assert np.abs(p32 - p64).max() <= 20 * 3e-4 * 1e-3
    rng = np.random.default_rng(1)
    obs, next_obs, actions = rng.standard_normal((256, 11)), rng.standard_normal((256, 11)), rng.uniform(-1, 1, (256, 3))
    r64 = wide.transition_rewards(obs, actions, next_obs, np.zeros(256))
    r32 = narrow.transition_rewards(obs, actions, next_obs, np.zeros(256))
    assert r32.dtype == np.float64 and r32.shape == (256,)
    assert _relative_error(r32, r64) <= RTOL
    episodes = EpisodeBatch(  # a padded (B, T) batch goes through the same float32 rows
        np.zeros((2, 5)),
        np.arange(5)[None, :] < np.array([[5], [3]]),
        observations=obs[:10].reshape(2, 5, 11),
        actions=actions[:10].reshape(2, 5, 3),
        extras={"next_observations": next_obs[:10].reshape(2, 5, 11)},
    )
    m64, m32 = wide.model_rewards(episodes), narrow.model_rewards(episodes)
    assert np.all(m32[1, 3:] == 0.0) and _relative_error(m32, m64) <= RTOL


def test_float32_state_round_trip_continues_identically():
    _, rule = _hopper_rules()
    for _ in range(3):
        rule.train_step()
    _, restored = _hopper_rules()
    restored.load_state_dict(copy.deepcopy(rule.state_dict()))
    assert [p.dtype for p in restored.params] == [np.float32] * 6
    assert [v.dtype for v in restored.adam.exp_avg_sq] == [np.float32] * 6
    for _ in range(3):
        assert restored.train_step() == rule.train_step()
    for a, b in zip(restored.params, rule.params):
        np.testing.assert_array_equal(a, b)


def test_bad_dtype_is_one_clear_error():
    assert RRDConfig().dtype == "float64"  # the default computes what it did before the option existed
    with pytest.raises(ValueError, match="dtype='float16': expected one of float64, float32"):
        RRDConfig(dtype="float16")
