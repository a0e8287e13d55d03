"""Credit-assignment rules: pure functions and small classes over arrays, no I/O.

A rule of your own: subclass `CreditRule` (or `RewardRule`), check it with `check_rule`, and make it available by
name with `register_rule` or an entry point of group `vcbm_gym.credit_rules` (docs/credit_rules.md).
"""

from vcbm_gym.credit.base import CreditRule, EpisodeBatch, RewardRule
from vcbm_gym.credit.check import RuleCheckError, check_rule
from vcbm_gym.credit.registry import RuleLookupError, make_rule, register_rule, rule_class, rule_names, unregister_rule

__all__ = [
    "CreditRule",
    "EpisodeBatch",
    "RewardRule",
    "RuleCheckError",
    "RuleLookupError",
    "check_rule",
    "make_rule",
    "register_rule",
    "rule_class",
    "rule_names",
    "unregister_rule",
]
