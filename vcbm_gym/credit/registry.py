"""The table of credit rules by name, each imported on first use (torch-based rules cost nothing otherwise).

Kept apart from `base` (the interface every rule module imports): this table names the rule modules, so it
sits above them.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

from vcbm_gym.credit.base import CreditRule

# name -> "module:Class"; imported on first use so that torch-based rules cost nothing otherwise.
RULES: dict[str, str] = {
    "broadcast": "vcbm_gym.credit.broadcast:BroadcastRule",
    "loo": "vcbm_gym.credit.loo:LeaveOneOutRule",
    "grpo": "vcbm_gym.credit.grpo:GroupMeanRule",
    "rudder": "vcbm_gym.credit.rudder:RudderRule",
    "vcbm_bookmark": "vcbm_gym.credit.vcbm_bookmark:VCBMBookmarkRule",
    "vcbm_blend": "vcbm_gym.credit.vcbm_blend:VCBMBlendRule",
    "gigpo": "vcbm_gym.credit.gigpo:GiGPORule",
    "casi": "vcbm_gym.credit.set_credit:CASIShapingRule",
    "ircr": "vcbm_gym.credit.ircr:IRCRRule",
    "rrd": "vcbm_gym.credit.rrd:RRDRule",
    "vineppo": "vcbm_gym.credit.vineppo:VinePPORule",
    "rice": "vcbm_gym.credit.rice:RICERule",
}


def rule_class(name: str) -> type[CreditRule]:
    """The class registered as `name` (imported on first use)."""
    if name not in RULES:
        raise KeyError(f"unknown credit rule {name!r}; expected one of: {', '.join(RULES)}")
    module_name, _, cls_name = RULES[name].partition(":")
    return getattr(importlib.import_module(module_name), cls_name)


def make_rule(name: str, env: Any = None, **kwargs: Any) -> CreditRule:
    """Build a registered rule by name, e.g. `make_rule("loo")`.

    With `env` (a Gymnasium env), a rule whose inputs depend on the env (RUDDER's features) is
    built by its `from_env(env, **kwargs)`; the other rules ignore it.
    """
    if name not in RULES:
        raise KeyError(f"unknown credit rule {name!r}; expected one of: {', '.join(RULES)}")
    cls = rule_class(name)
    if "rule_factory" in inspect.signature(cls).parameters:  # a rule built on another (casi's base rule)
        kwargs.setdefault("rule_factory", make_rule)
    if env is not None and hasattr(cls, "from_env"):
        return cls.from_env(env, **kwargs)
    return cls(**kwargs)
