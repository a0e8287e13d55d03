"""The credit slot of the tabular arm: `--algo td|mc --credit RULE` learns from a credit rule's rewards.

Any rule of vcbm_gym.credit.base.RULES whose inputs the tabular episode provides (TABULAR_BATCH_PROVIDES,
in the terms of CreditRule.batch_needs) plugs in; the others (casi's coalition values, vcbm_blend's
per-turn texts, loo/grpo/gigpo's episode groups) are refused in `resolve`, before the log dir exists.

The pattern is the one tabular RUDDER runs (algorithms/tabular/rudder.py), for any rule:

1. The agent buffers the episode (flattened int observations, actions numbered from 0, rewards, the
   next observations).
2. At its end, `EpisodeCredit.redistribute` builds a one-episode EpisodeBatch, lets the rule learn
   from it (`observe`), and turns its advantages into return-equivalent rewards r'_t = A_t +
   (G - sum_s A_s) / n (vcbm_gym/credit/redistribute.py), whose sum is the episode return.
3. The agent's update reads r' in place of the env's rewards (q_learning.py, mc.py say how).

Batch size: one episode, as in tabular RUDDER and SB3's EpisodeRedistributionBuffer. Each episode's
credit then comes from a rule that has seen every episode so far, this one included, and the agent
updates after every episode as it does without a rule; a rule's own schedule (RUDDER's lesson buffer
and LSTM training events, vcbm_bookmark's warm-up) decides how much history it pools.
"""

from __future__ import annotations

import argparse
import inspect
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np

from algorithms.common.errors import ConfigError, VcbmGymError
from vcbm_gym.credit.base import (
    NO_CREDIT,
    RULES,
    CreditRule,
    EpisodeBatch,
    make_rule,
    misfit,
    misfit_line,
    rule_class,
    unmet_rule_needs,
)
from vcbm_gym.credit.redistribute import redistribute

# What the tabular arm's EpisodeBatch holds beyond rewards and mask (EpisodeCredit.batch), in the terms
# of CreditRule.batch_needs. Every step is its own turn (the batch's default step_turn). No groups: one
# episode per batch. The agents never see the env's info, so no info key reaches a rule.
TABULAR_BATCH_PROVIDES = frozenset({"observations", "actions", "step_turn", "extras['next_observations']"})
TABULAR_INFO_PROVIDES: frozenset[str] = frozenset()


@dataclass
class CreditSlotConfig:
    """The slot's settings, recorded in config.yml beside the agent's: the rule and its constructor arguments,
    keyed by rule name as in the SB3 arm (`credit_kwargs: {vcbm_bookmark: {alpha: 0.01}}`)."""

    credit: str = NO_CREDIT  # set by --credit; a rule name in vcbm_gym.credit.base.RULES
    credit_kwargs: dict = field(default_factory=dict)  # rule name -> that rule's constructor kwargs


def has_credit_slot(agent_cls: type) -> bool:
    """Agents that learn from a rule's rewards take a `credit` constructor argument (td, mc)."""
    return "credit" in inspect.signature(agent_cls).parameters


def rule_refusal(name: str) -> str | None:
    """Why rule `name` cannot run in the tabular arm (one line), or None; from the class's declared needs."""
    return None if name == NO_CREDIT else misfit(name, "tabular", TABULAR_BATCH_PROVIDES, TABULAR_INFO_PROVIDES)


def credit_name(value: str) -> str:
    why = rule_refusal(value)
    if why is not None:
        raise argparse.ArgumentTypeError(why)
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    # Only the chosen rule's module is imported (to read its needs): a plain tabular run never imports torch.
    parser.add_argument(
        "--credit",
        type=credit_name,
        default=None,
        help=f"credit rule for td and mc: {NO_CREDIT} or a rule of {', '.join(RULES)} whose needs the tabular batch "
        "meets (its arguments: --hyperparams credit_kwargs=...)",
    )


def flag_hyperparams(args: argparse.Namespace) -> dict[str, Any]:
    """The --credit flag as a hyperparameter, so that the resolved config holds it."""
    return {} if getattr(args, "credit", None) is None else {"credit": args.credit}


class AgentSpacesView(gym.Wrapper):
    """The env as the tabular agent sees it (flattened observations, actions from 0), for building a rule
    (`make_rule(name, env=view)`: RUDDER's and RRD's features, vcbm_bookmark's space check); never stepped.
    The env's own `credit_featurizer()` stays reachable through `unwrapped`."""

    def __init__(self, env: gym.Env, observation_space: gym.Space, action_space: gym.Space) -> None:
        super().__init__(env)
        self.observation_space, self.action_space = observation_space, action_space


def build_rule(config: CreditSlotConfig, view: gym.Env, seed: int) -> CreditRule | None:
    """The configured rule for the agent's spaces, or None; a bad name, argument or unmet need is one ConfigError line.
    A rule that takes a `seed` (rudder, rrd) gets the run's, unless credit_kwargs set one."""
    for name, kwargs in config.credit_kwargs.items():
        if name not in RULES or not isinstance(kwargs, dict):
            raise ConfigError(
                f"hyperparameter credit_kwargs[{name!r}]={kwargs!r}: expected rule name -> mapping of its arguments, "
                f"rule names: {', '.join(RULES)}"
            )
    why = rule_refusal(config.credit)
    if why is not None:
        raise ConfigError(why)
    if config.credit == NO_CREDIT:
        return None
    kwargs = dict(config.credit_kwargs.get(config.credit, {}))
    if "seed" in inspect.signature(rule_class(config.credit)).parameters:
        kwargs.setdefault("seed", seed)
    try:
        rule = make_rule(config.credit, env=view, **kwargs)
    except ModuleNotFoundError as exc:
        raise VcbmGymError(
            f"credit rule {config.credit!r} is registered as {RULES[config.credit]!r} but cannot be imported: {exc}"
        ) from None
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"credit rule {config.credit!r} (credit_kwargs {kwargs!r}) on the tabular spaces: {exc}") from None
    # an option can add needs (vcbm_bookmark's advantage="given"): the built rule is checked as well
    missing = unmet_rule_needs(rule, TABULAR_BATCH_PROVIDES, TABULAR_INFO_PROVIDES)
    why = misfit_line(config.credit, missing, "tabular", TABULAR_BATCH_PROVIDES, TABULAR_INFO_PROVIDES)
    if why is not None:
        raise ConfigError(why)
    return rule


class EpisodeCredit:
    """Buffers one episode's transitions and hands back the rule's return-equivalent rewards at its end."""

    def __init__(self, rule: CreditRule) -> None:
        self.rule = rule
        self.observations: list[np.ndarray] = []
        self.actions: list[int] = []
        self.rewards: list[float] = []
        self.next_observations: list[np.ndarray] = []
        self.dones: list[bool] = []

    def record(self, obs: np.ndarray, action: int, reward: float, next_obs: np.ndarray, done: bool) -> None:
        self.observations.append(np.asarray(obs).copy())
        self.actions.append(int(action))
        self.rewards.append(float(reward))
        self.next_observations.append(np.asarray(next_obs).copy())
        self.dones.append(bool(done))

    def batch(self) -> EpisodeBatch:
        """The buffered episode as a batch of one (what TABULAR_BATCH_PROVIDES declares)."""
        rewards = np.asarray(self.rewards, dtype=np.float64)[None]
        return EpisodeBatch(
            rewards=rewards,
            mask=np.ones_like(rewards, dtype=bool),
            observations=np.asarray(self.observations)[None],
            actions=np.asarray(self.actions, dtype=np.int64)[None],
            extras={"next_observations": np.asarray(self.next_observations)[None]},
        )

    def redistribute(self) -> np.ndarray:
        """(T,) r'_t for the buffered episode (the rule observes it first); empty for an empty episode."""
        if not self.rewards:
            return np.zeros(0)
        return redistribute(self.rule, self.batch())[0]

    def clear(self) -> None:
        self.observations, self.actions, self.rewards, self.next_observations, self.dones = [], [], [], [], []

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {"credit": self.rule.name}
        roles = getattr(self.rule, "roles", None)  # vcbm_bookmark: the causal roles it found (Eq. 9 of arXiv:2610.24032)
        if roles:
            out["credit_roles"] = [str(role) for role in roles]
        if self.rule.summary():
            out["credit_summary"] = self.rule.summary()
        return out
