"""Credit-rule options taken as given: an option of the wrong type or out of range is refused with one line naming
it and what was expected (no silent coercion, no infinite learning rate), and a training run refuses it before its
log dir exists."""

from __future__ import annotations

import math

import numpy as np
import pytest
from gymnasium import spaces

from tests.helpers import one_error_line
from vcbm_gym.credit.features import SpaceFeaturizer
from vcbm_gym.credit.registry import make_rule
from vcbm_gym.credit.rrd import RRDConfig


@pytest.mark.parametrize("rate", [math.inf, -math.inf, math.nan, 0.0, -1e-3, "3e-3", True])
def test_rrd_refuses_a_learning_rate_that_is_not_a_finite_positive_number(rate):
    with pytest.raises(ValueError, match=r"^learning_rate=.*: expected a finite number > 0$"):
        RRDConfig(learning_rate=rate)


@pytest.mark.parametrize(
    ("options", "needle"),
    [
        ({"bias_correction": "false"}, "bias_correction='false': expected true or false"),
        ({"bias_correction": 0}, "bias_correction=0: expected true or false"),
        ({"hidden_sizes": "64"}, "hidden_sizes='64': expected a list of integer layer widths >= 1"),
        ({"hidden_sizes": [2.9]}, "hidden_sizes=[2.9]: expected a list of integer layer widths >= 1"),
        ({"hidden_sizes": [True]}, "hidden_sizes=[True]"),
        ({"hidden_sizes": 0}, "hidden_sizes=0"),
        ({"subsequence_size": 2.5}, "subsequence_size=2.5: expected an integer >= 1"),
    ],
)
def test_rrd_refuses_options_of_the_wrong_type_instead_of_coercing_them(options, needle):
    with pytest.raises(ValueError) as excinfo:
        RRDConfig(**options)
    assert needle in str(excinfo.value) and "\n" not in str(excinfo.value)


def test_rrd_keeps_what_is_well_typed():
    assert RRDConfig(hidden_sizes=8).hidden_sizes == (8,)  # a bare integer: one layer
    assert RRDConfig(hidden_sizes=[64, np.int64(32)]).hidden_sizes == (64, 32)
    assert RRDConfig(hidden_sizes=[]).hidden_sizes == ()
    config = RRDConfig(bias_correction=np.bool_(True), learning_rate=1, train_steps=0)
    assert config.bias_correction is True and config.learning_rate == 1.0 and config.train_steps == 0


@pytest.mark.parametrize(
    "credit_kwargs",
    ["{rrd: {learning_rate: .inf}}", "{rrd: {bias_correction: 'false'}}", "{rrd: {hidden_sizes: '64'}}"],
)
def test_train_refuses_bad_rrd_options_in_one_line_before_the_log_dir_exists(tmp_path, capsys, credit_kwargs):
    from algorithms.train import main

    log_dir = tmp_path / "run"
    argv = ["--algo", "td", "--credit", "rrd", "--env", "WatchRepair-v0", "--max-episodes", "40", "--no-progress"]
    code = main([*argv, "--log-dir", str(log_dir), "--hyperparams", f"credit_kwargs={credit_kwargs}"])
    assert code == 2
    one_error_line(capsys, "credit rule 'rrd'", "expected")
    assert not log_dir.exists()


def _spaces_featurizer() -> SpaceFeaturizer:
    return SpaceFeaturizer(spaces.MultiDiscrete([3, 3]), spaces.Discrete(2))


@pytest.mark.parametrize(
    ("rule", "options", "needle"),
    [
        ("grpo", {"normalise_std": "false"}, "normalise_std='false': expected true or false"),
        ("grpo", {"eps": math.inf}, "eps=inf"),
        ("gigpo", {"normalise_std": "no"}, "normalise_std='no': expected true or false"),
        ("gigpo", {"step_weight": "2"}, "step_weight='2': expected a finite number"),
        ("gigpo", {"step_weight": math.inf}, "step_weight=inf"),
        ("vcbm_bookmark", {"warmup_transitions": 2.9}, "warmup_transitions=2.9: expected an integer >= 0"),
        ("vcbm_bookmark", {"z_thresh": "4"}, "z_thresh='4'"),
        ("vcbm_bookmark", {"eta_clock": math.inf}, "eta_clock=inf"),
        ("vcbm_blend", {"top_k": 2.5}, "top_k=2.5: expected an integer >= 1"),
        ("vcbm_blend", {"memory_capacity": 2.5}, "memory_capacity=2.5: expected null or an integer >= 1"),
        ("vcbm_blend", {"tau": math.inf}, "tau=inf"),
        ("casi", {"beta": "1"}, "beta='1': expected a finite number"),
        ("casi", {"bound": math.inf}, "bound=inf"),
        ("casi", {"base": "nope"}, "base='nope'"),
        ("casi", {"shaping_mode": "nope"}, "shaping_mode='nope'"),
        ("rudder", {"learning_rate": math.inf}, "learning_rate=inf: expected a finite number > 0"),
        ("rudder", {"hidden_size": 2.5}, "hidden_size=2.5: expected an integer >= 1"),
        ("rudder", {"reward_scale": 0}, "reward_scale=0"),
    ],
)
def test_every_rule_refuses_options_it_would_have_coerced_or_failed_on_later(rule, options, needle):
    if rule == "rudder":
        options = {"featurizer": _spaces_featurizer(), **options}
    with pytest.raises(ValueError) as excinfo:
        make_rule(rule, **options)
    assert needle in str(excinfo.value) and "\n" not in str(excinfo.value)
