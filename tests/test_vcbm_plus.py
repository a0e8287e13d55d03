"""vcbm-plus (beyond the VCBM paper, arXiv:2610.24032): the control-variate estimate and the sequential bookmark policy."""

import math

import numpy as np
import pytest

from algorithms.tabular.vcbm import VCBMPlusConfig, bookmark_action_plus
from vcbm_gym.credit.welford import RegressionWelford, Welford


def _fit(x, y):
    est = RegressionWelford(x.shape[1])
    for xi, yi in zip(x, y):
        est.update(xi, float(yi))
    return est


def test_adjusted_mean_is_the_least_squares_intercept_with_its_standard_error():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(60, 3))
    x[:, 2] = 4.0  # a covariate that never moves gets no weight
    y = 2.0 + x[:, :2] @ [1.5, -3.0] + 0.5 * rng.normal(size=60)
    mean, se = _fit(x, y).adjusted([0, 1, 2], np.array([0.0, 0.0, 4.0]))
    design = np.c_[np.ones(60), x[:, :2]]
    coef, residual, *_ = np.linalg.lstsq(design, y, rcond=None)
    cov = residual[0] / (60 - 3) * np.linalg.inv(design.T @ design)
    assert mean == pytest.approx(coef[0], abs=1e-9)
    assert se == pytest.approx(math.sqrt(cov[0, 0]), rel=1e-9)


def test_without_covariates_it_is_welfords_mean_and_standard_error():
    y = np.random.default_rng(1).normal(3.0, 2.0, size=25)
    plain = Welford()
    for v in y:
        plain.update(float(v))
    mean, se = _fit(np.zeros((25, 2)), y).adjusted([], np.zeros(2))
    assert mean == pytest.approx(plain.mean) and se == pytest.approx(plain.standard_error)


def test_control_variate_removes_the_noise_it_explains():
    rng = np.random.default_rng(2)
    noise = rng.binomial(50, 0.05, size=(400, 1)).astype(float)
    y = 3.5 - 7.0 * (noise[:, 0] - 2.5) + rng.normal(0.0, 2.0, size=400)
    mean, se = _fit(noise, y).adjusted([0], np.array([2.5]))
    raw = Welford()
    for v in y:
        raw.update(float(v))
    assert abs(mean - 3.5) < 3 * se and se < raw.standard_error / 3


class _Never:
    """An rng whose uniforms never trigger exploration; integers must not be needed."""

    def random(self):
        return 0.999

    def integers(self, n):
        raise AssertionError("no random tie-break expected")


def test_policy_balances_first_then_samples_the_uncertain_arm_until_decisive_then_greedy():
    cfg = VCBMPlusConfig(n_min=8, z_decide=3.0, epsilon_min=0.005)
    assert bookmark_action_plus(((3, 0.0, math.inf), (8, 0.0, 0.0)), cfg, _Never()) == 0  # balance to n_min
    # The trap case: arm 0's estimate is below arm 1's known value but not decisively (z = 1.5):
    # arm 0 is sampled again, not abandoned.
    assert bookmark_action_plus(((40, -1.5, 1.0), (8, 0.0, 0.0)), cfg, _Never()) == 0
    assert bookmark_action_plus(((40, -4.0, 1.0), (8, 0.0, 0.0)), cfg, _Never()) == 1  # z = 4: greedy
    assert bookmark_action_plus(((40, 4.0, 1.0), (8, 0.0, 0.0)), cfg, _Never()) == 0


@pytest.mark.parametrize("field, value", [("n_min", 1), ("z_decide", 0.0), ("epsilon_min", 1.5)])
def test_bad_vcbm_plus_settings_are_one_line_errors(field, value):
    # rejected where the value enters: the config, before any agent or log dir exists
    with pytest.raises(ValueError, match=rf"^hyperparameter {field}={value}: expected a finite number"):
        VCBMPlusConfig(**{field: value})
