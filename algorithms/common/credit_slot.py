"""The credit slot: the one place a run names its credit rule, an arm checks that it fits, and a run builds it.

A run's config carries the recipe, `CreditSlot(credit, credit_kwargs)` (`credit_kwargs` keyed by rule name,
`{rrd: {bias_correction: true}}`, so that one config serves every `--credit`). The lifecycle is the same in
every arm:

1. `slot.check(arm.credit_fit(algo))` when the run is resolved, before anything is written: an unknown rule, malformed
   `credit_kwargs`, a rule whose class needs batch fields or env info keys the arm does not provide
   (`CreditRule.batch_needs`, `info_needs`), or one that emits a kind of credit the algorithm's learner does
   not take (`CreditRule.emits`; `Arm.consumes`) is one ConfigError line.
2. `slot.build(arm.credit_fit(algo), env=..., seed=...)` wherever the run needs the rule: the arm's `validate` builds it
   dry (a bad rule argument is one line before the log dir exists) and the run builds its own. A built
   rule's options can change what it needs and emits (vcbm_bookmark's `advantage: given`), so the built
   instance is checked again.
3. The run hands every batch to `assign_credit`: the rule's credit for the batch, then `observe` (the order
   CreditRule documents). An arm that discards a batch (the LLM arm's aborted iterations) calls
   `credit_of` and observes only the batches it keeps. The one exception, outside every slot, is the tabular `rudder`
   agent's observe-first order (`observe_then_credit`, which says why).

How an arm consumes each kind (`Arm.consumes`, in its `CreditFit`): *rewards* replace the env's reward for the learner's own
estimator (td and mc's targets, PPO/A2C's GAE and value targets, the replay buffer of DQN/SAC/TD3, which
relabels stored rewards as the rule learns); *advantages* replace the learner's advantage (PPO/A2C, LOOP).
"""

from __future__ import annotations

import argparse
import inspect
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from algorithms.common.errors import ConfigError, VcbmGymError
from vcbm_gym.contract import env_name
from vcbm_gym.credit.base import EMISSIONS, NO_CREDIT, REWARDS, CreditRule, EpisodeBatch, misfit_line, unmet_rule_needs
from vcbm_gym.credit.registry import (
    ENTRY_POINT_GROUP,
    RuleLookupError,
    is_rule,
    make_rule,
    rule_class,
    rule_names,
    rule_record,
    rule_source,
    unknown_rule_line,
)

CREDIT_RECORD = "credit_rule"  # config.yml's entry: the run's rule, and the distribution and version it came from


def resolvable_class(name: str) -> type[CreditRule] | None:
    """The class of rule `name`, or None when it does not resolve (claimed twice, its module broken): lists of the
    rules that fit leave it out, and naming it is the one line `rule_class` raises."""
    try:
        return rule_class(name)
    except RuleLookupError:
        return None


def rules_emitting(kind: str) -> list[str]:
    """The rules whose instances may emit `kind` (imports every rule's module)."""
    return [name for name in rule_names() if (cls := resolvable_class(name)) is not None and kind in cls.kinds()]


def kind_misfit(name: str, emitted: str, consumed: frozenset[str], learner: str) -> str | None:
    """One line when `learner` cannot take what rule `name` emits, else None."""
    if emitted in consumed:
        return None
    fitting = ", ".join(rule for kind in sorted(consumed) for rule in rules_emitting(kind))
    takes = " or ".join(sorted(consumed)) or "no credit rule"
    return (
        f"credit rule {name!r} emits {emitted}, and {learner} takes {takes}: "
        f"expected one of the rules that emit {takes} ({fitting or 'none'})"
    )


def credit_of(rule: CreditRule, batch: EpisodeBatch) -> np.ndarray:
    """(B, T) the rule's credit for `batch`, of the kind it emits (`rewards` or `advantages`); learns nothing. A
    non-finite value on a trained step is one line naming the rule: a learner would turn it into NaN values far
    from here (a Q-table's argmax over NaNs, a NaN loss)."""
    credit = rule.rewards(batch) if rule.emission() == REWARDS else rule.advantages(batch)
    bad = batch.mask & ~np.isfinite(credit)
    if bad.any():
        episode, step = (int(i) for i in np.argwhere(bad)[0])
        raise VcbmGymError(
            f"credit rule {rule.name!r} gave {credit[episode, step]} at step {step} of episode {episode} of its batch "
            f"(episode returns {batch.returns.min():g} to {batch.returns.max():g}): expected finite {rule.emission()}; "
            "rewards this large overflow the rule's arithmetic (scale the env's rewards)"
        )
    return credit


def assign_credit(rule: CreditRule, batch: EpisodeBatch) -> np.ndarray:
    """The one call order of every arm: the batch's credit from the rule's state after every earlier batch,
    then the rule learns from the batch."""
    credit = credit_of(rule, batch)
    rule.observe(batch)
    return credit


def observe_then_credit(rule: CreditRule, batch: EpisodeBatch) -> np.ndarray:
    """The one exception to `assign_credit`'s order, for the tabular `rudder` agent alone (algorithms/tabular/rudder.py,
    an algo with no credit slot): its RudderRule learns from an episode before redistributing that episode's return,
    as the RUDDER demonstration code that agent reproduces does (the episode joins the lesson buffer, the LSTM trains
    on schedule, and the episode's return is redistributed by the LSTM just trained; docs/papers/vcbm.md, "RUDDER").
    A credit slot never uses it: a run with `--credit rudder` scores each batch before the rule learns from it."""
    rule.observe(batch)
    return credit_of(rule, batch)


def rule_summary(rule: CreditRule | None, component_names: Any = None) -> dict[str, Any]:
    """What summary.json records of the run's rule: its name, the causal roles it found (vcbm_bookmark, Eq. 9
    of arXiv:2610.24032) by component, and its own `summary()`."""
    if rule is None:
        return {}
    out: dict[str, Any] = {"credit": rule.name}
    roles = getattr(rule, "roles", None)
    if roles:
        names = component_names if component_names is not None else range(len(roles))
        out["credit_roles"] = {str(n): str(r) for n, r in zip(names, roles)}
    if rule.summary():
        out["credit_summary"] = rule.summary()
    return out


@dataclass(frozen=True)
class CreditFit:
    """What one learner gives a credit rule and takes from it: the batch fields and env info keys a rule can
    learn from (in the terms of CreditRule.batch_needs / info_needs), the kinds of credit it consumes, and the
    arm's own defaults for a rule's arguments. `Arm.credit_fit(algo)` says it for each algo."""

    arm: str  # how refusal lines name the arm ("tabular", "sb3", "llm")
    learner: str  # how they name the learner ("'dqn'", "the llm arm")
    batch_provides: frozenset[str]
    info_provides: frozenset[str]
    consumes: frozenset[str]
    rule_defaults: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    # whether the learner has a credit of its own, which "none" leaves it (the two-role trainer has none: a rule pays
    # its roles)
    own_credit: bool = True

    def misfit(self, name: str) -> str | None:
        """Why rule `name` (its class's declarations) cannot run here (one line), or None; imports that rule's module
        only (an unknown name imports every rule's, to list those that fit)."""
        if name == NO_CREDIT and self.own_credit:
            return None
        if name == NO_CREDIT:
            return (
                f"credit {name!r} for the {self.arm} arm: its learner has no credit of its own; "
                f"expected a rule, one of: {', '.join(self.fitting_rules())}"
            )
        if not is_rule(name):
            return unknown_rule_line(name, [NO_CREDIT, *self.fitting_rules()] if self.own_credit else self.fitting_rules())
        try:
            cls = rule_class(name)
        except RuleLookupError as exc:
            return str(exc)
        fitting = [kind for kind in cls.kinds() if kind in self.consumes]  # an option may choose the kind
        emitted = fitting[0] if fitting else cls.emits
        return self.instance_misfit(name, unmet_rule_needs(cls, self.batch_provides, self.info_provides), emitted)

    def fitting_rules(self) -> list[str]:
        """The registered rules that can run here (imports every rule's module)."""
        return [rule for rule in rule_names() if self.misfit(rule) is None]

    def instance_misfit(self, name: str, missing: list[str], emitted: str) -> str | None:
        why = misfit_line(name, missing, self.arm, self.batch_provides, self.info_provides)
        return why or kind_misfit(name, emitted, self.consumes, self.learner)


@dataclass(frozen=True)
class CreditSlot:
    """A run's credit rule as a recipe: its name and every rule's constructor arguments, keyed by rule name."""

    credit: str = NO_CREDIT
    credit_kwargs: dict = field(default_factory=dict)  # rule name -> that rule's constructor kwargs

    @property
    def empty(self) -> bool:
        return self.credit == NO_CREDIT

    def check(self, fit: CreditFit) -> None:
        """Refuse (ConfigError, one line) malformed credit_kwargs, and a rule whose class cannot run with `fit`."""
        if not isinstance(self.credit_kwargs, Mapping):
            raise ConfigError(
                f"hyperparameter credit_kwargs={self.credit_kwargs!r}: expected rule name -> mapping of its arguments"
            )
        for name, kwargs in self.credit_kwargs.items():
            if not isinstance(name, str) or not is_rule(name) or not isinstance(kwargs, Mapping):
                raise ConfigError(
                    f"hyperparameter credit_kwargs[{name!r}]={kwargs!r}: expected rule name -> mapping of its arguments, "
                    f"rule names: {', '.join(rule_names())}"
                )
        why = fit.misfit(self.credit)
        if why is not None:
            raise ConfigError(why)

    def rule_kwargs(self, fit: CreditFit, seed: int | None = None) -> dict[str, Any]:
        """The rule's constructor arguments: the arm's defaults for it, then credit_kwargs[credit]; a rule that
        takes a `seed` (rudder, rrd) gets the run's unless credit_kwargs set one."""
        kwargs = {**fit.rule_defaults.get(self.credit, {}), **self.credit_kwargs.get(self.credit, {})}
        if seed is not None and "seed" in inspect.signature(rule_class(self.credit)).parameters:
            kwargs.setdefault("seed", seed)
        return kwargs

    def build(self, fit: CreditFit, env: Any = None, seed: int | None = None) -> CreditRule | None:
        """The rule (None for "none"), built for `env` (`make_rule(name, env=env)`); a bad argument, or a built
        instance that needs or emits what the learner cannot take, is one ConfigError line."""
        self.check(fit)
        if self.empty:
            return None
        kwargs = self.rule_kwargs(fit, seed)
        try:
            rule = make_rule(self.credit, env=env, **kwargs)
        except RuleLookupError as exc:
            raise ConfigError(str(exc)) from None
        except ModuleNotFoundError as exc:
            raise VcbmGymError(
                f"credit rule {self.credit!r} ({rule_source(self.credit).describe()}) cannot be imported: {exc}"
            ) from None
        except (TypeError, ValueError) as exc:
            where = "" if env is None else f" on {env_name(env)}"
            raise ConfigError(f"credit rule {self.credit!r} (credit_kwargs {kwargs!r}){where}: {exc}") from None
        # an option can change what a rule needs and emits (vcbm_bookmark's advantage="given")
        missing = unmet_rule_needs(rule, fit.batch_provides, fit.info_provides)
        why = fit.instance_misfit(self.credit, missing, rule.emission())
        if why is not None:
            raise ConfigError(why)
        return rule


def add_credit_argument(parser: argparse.ArgumentParser | Any, arm: Any) -> None:
    """`--credit RULE`, its value checked against `arm` (an algorithms.common.spec.Arm; only the named rule's
    module is imported)."""

    def credit_name(value: str) -> str:
        why = arm.credit_misfit(value)
        if why is not None:
            raise argparse.ArgumentTypeError(why)
        return value

    parser.add_argument(
        "--credit",
        type=credit_name,
        default=None,
        help=f"credit rule: {NO_CREDIT} or a rule of {', '.join(rule_names())} that the algo takes "
        f"(kinds: {', '.join(EMISSIONS)}; its arguments: --hyperparams credit_kwargs={{RULE: {{...}}}})",
    )


def credit_flag(args: argparse.Namespace) -> dict[str, Any]:
    """--credit as a hyperparameter, so that the resolved config holds it."""
    return {} if getattr(args, "credit", None) is None else {"credit": args.credit}


def run_slot(config: Any) -> CreditSlot | None:
    """The credit slot of a resolved run's typed config (`RunSpec.config`: the tabular arm's `credit`, the SB3 arm's
    `run.slot`, the LLM arm's `slot`), or None: the run's credit is its algorithm's own."""
    for holder in (config, getattr(config, "run", None)):
        for attr in ("slot", "credit"):
            value = getattr(holder, attr, None)
            if isinstance(value, CreditSlot):
                return value
    return None


def credit_record(config: Any) -> dict[str, Any]:
    """config.yml's entry for a run's rule (`RunSpec.config`): its name and the distribution and version it came from,
    so that a rerun from config.yml finds the same rule or says what to install; {} for a run without a rule."""
    slot = run_slot(config)
    if slot is None or slot.empty:
        return {}
    return {CREDIT_RECORD: rule_record(slot.credit)}


def check_recorded_rule(record: Any, path: str) -> None:
    """Before a run's config.yml (`path`) is rerun: its rule must resolve here, from the distribution it ran from
    (ConfigError, one line, saying what to install); another version of it runs, with one warning line."""
    if record is None:
        return
    if not isinstance(record, Mapping) or not isinstance(record.get("name"), str):
        raise ConfigError(f"malformed config file {path!r}: {CREDIT_RECORD}={record!r}; expected {{name, distribution, version}}")
    name, dist, version = record["name"], record.get("distribution"), record.get("version")
    if dist:
        origin, install = f"distribution {dist} {version}", f"pip install '{dist}=={version}'"
    else:
        origin = "a rule registered in-process"
        install = f"register it (vcbm_gym.credit.register_rule({name!r}, cls)) before rerunning"
    if not is_rule(name):
        raise ConfigError(
            f"config file {path!r} ran credit rule {name!r} of {origin}, which no installed distribution or "
            f"register_rule provides here: {install} (its entry point in group {ENTRY_POINT_GROUP!r} registers it)"
        )
    try:
        here = rule_record(name)
    except RuleLookupError as exc:
        raise ConfigError(str(exc)) from None
    if here["distribution"] != dist:
        raise ConfigError(
            f"config file {path!r} ran credit rule {name!r} of {origin}; here {name!r} is "
            f"{rule_source(name).describe()}: expected the same rule ({install})"
        )
    if here["version"] != version:
        print(
            f"warning: config file {path!r} ran credit rule {name!r} of {dist} {version}; rerunning it with {dist} "
            f"{here['version']}",
            file=sys.stderr,
        )


def rule_change(record: Mapping[str, Any] | None, config: Any) -> str | None:
    """How the rule of a run's config.yml (`record`) differs from the rule the same config resolves to now
    (`RunSpec.config`): the same name from another distribution or version is another rule, whose result a
    rerun must not reuse; None when they agree, or when the record predates the entry."""
    recorded = (record or {}).get(CREDIT_RECORD)
    current = credit_record(config).get(CREDIT_RECORD)
    if recorded is None or current is None or recorded == current:
        return None

    def origin(entry: Any) -> str:
        entry = entry if isinstance(entry, Mapping) else {}
        return f"{entry.get('name')!r} of {entry.get('distribution') or 'no distribution'} {entry.get('version') or ''}".strip()

    return f"credit rule was {origin(recorded)} and is now {origin(current)}"
