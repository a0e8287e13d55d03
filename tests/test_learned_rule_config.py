"""The learned-credit rules (RRD's reward model, RUDDER's LSTM) take their config the same way
(vcbm_gym/credit/model_training.py:learned_rule_config): a featurizer that gives no per-step features, and an option
that is no field of the rule's config, are one line naming the value, the rule and what was expected; a known
option overrides the given config, whose other fields are kept."""

from __future__ import annotations

import pytest
from gymnasium import spaces

from vcbm_gym.credit.features import SpaceFeaturizer
from vcbm_gym.credit.rrd import RRDConfig, RRDRule
from vcbm_gym.credit.rudder import RudderCreditConfig, RudderRule

# (rule, its config, an option to override, its value, another field set in the given config, that field's value)
RULES = [
    (RRDRule, RRDConfig, "train_steps", 3, "buffer_capacity", 64),
    (RudderRule, RudderCreditConfig, "batch_size", 3, "buffer_capacity", 64),
]


def featurizer() -> SpaceFeaturizer:
    return SpaceFeaturizer(spaces.Box(-1.0, 1.0, (2,)), spaces.Discrete(3))


@pytest.mark.parametrize(("rule", "config", "field", "value", "other", "other_value"), RULES)
def test_a_featurizer_without_per_step_features_is_one_line_naming_the_rules_from_env(
    rule, config, field, value, other, other_value
):
    with pytest.raises(ValueError) as refused:
        rule("not a featurizer")
    line = str(refused.value)
    assert "\n" not in line and line.startswith("featurizer='not a featurizer': expected per-step features")
    assert f"{rule.__name__}.from_env(env)" in line


@pytest.mark.parametrize(("rule", "config", "field", "value", "other", "other_value"), RULES)
def test_an_unknown_option_is_one_line_naming_the_rule_and_its_config_fields(rule, config, field, value, other, other_value):
    with pytest.raises(ValueError) as refused:
        rule(featurizer(), no_such_option=1)
    line = str(refused.value)
    assert "\n" not in line
    assert line.startswith(f"unknown {rule.__name__} option(s) ['no_such_option']; expected fields of {config.__name__}: [")
    assert repr(field) in line


@pytest.mark.parametrize(("rule", "config", "field", "value", "other", "other_value"), RULES)
def test_an_option_overrides_the_given_config_and_keeps_its_other_fields(rule, config, field, value, other, other_value):
    given = config(**{other: other_value})
    built = rule(featurizer(), config=given, **{field: value})
    assert type(built.config) is config and getattr(built.config, field) == value != getattr(config(), field)
    assert getattr(built.config, other) == other_value  # the given config's other fields are kept
    assert rule(featurizer(), config=given).config is given  # no option: the given config itself
