"""The one interface every credit rule implements: a batch of episodes in, per-step advantages out.

A *step* is whatever the learner optimises per position: an env step for tabular and SB3 agents,
a generated token for LLM agents. Steps belong to *turns* (`step_turn`): for tabular agents every
step is its own turn; for an LLM, a turn is one model response, and its tokens share a turn id.
Turn-level metadata (e.g. `state_mutating`, the execution output text) is given per turn.
"""

from __future__ import annotations

import abc
import importlib
from dataclasses import dataclass, field
from typing import Any, ClassVar, Collection, Sequence

import numpy as np


@dataclass(frozen=True)
class EpisodeBatch:
    """B episodes padded to T steps.

    rewards:      (B, T) float, per-step rewards (0 on padding). An LLM episode puts its return
                  on its last generated step.
    mask:         (B, T) bool, True on steps that are trained (generated tokens, real env steps).
    group_ids:    (B,) int, episodes of the same task / prompt share an id (LOO, GRPO, GiGPO).
    step_turn:    (B, T) int turn index of every step (-1 on padding); default: turn = step.
    turn_flags:   name -> per-episode arrays over that episode's turns, e.g. "state_mutating".
    turn_texts:   per-episode lists of per-turn text, e.g. the execution output of each turn.
    final_texts:  per-episode terminal observation text (VCBM retrieval query, Eq. 13 of arXiv:2610.24032).
    observations: (B, T, ...) optional per-step observations (tabular rules, GiGPO anchors).
    actions:      (B, T) optional per-step actions.
    extras:       rule-specific inputs, documented by the rule that reads them.
    """

    rewards: np.ndarray
    mask: np.ndarray
    group_ids: np.ndarray | None = None
    step_turn: np.ndarray | None = None
    turn_flags: dict[str, Sequence[np.ndarray]] = field(default_factory=dict)
    turn_texts: Sequence[Sequence[str]] | None = None
    final_texts: Sequence[str] | None = None
    observations: np.ndarray | None = None
    actions: np.ndarray | None = None
    extras: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        rewards = np.asarray(self.rewards, dtype=np.float64)
        mask = np.asarray(self.mask, dtype=bool)
        if rewards.ndim != 2 or rewards.shape != mask.shape:
            raise ValueError(f"rewards {rewards.shape} and mask {mask.shape}: expected two equal (B, T) shapes")
        object.__setattr__(self, "rewards", rewards)
        object.__setattr__(self, "mask", mask)
        groups = np.zeros(len(rewards), dtype=np.int64) if self.group_ids is None else np.asarray(self.group_ids)
        if groups.shape != (len(rewards),):
            raise ValueError(f"group_ids shape {groups.shape}: expected ({len(rewards)},)")
        object.__setattr__(self, "group_ids", groups)
        if self.step_turn is None:
            turns = np.where(mask, np.arange(rewards.shape[1])[None, :], -1)
        else:
            turns = np.asarray(self.step_turn, dtype=np.int64)
            if turns.shape != rewards.shape:
                raise ValueError(f"step_turn shape {turns.shape}: expected {rewards.shape}")
        object.__setattr__(self, "step_turn", turns)

    @property
    def batch_size(self) -> int:
        return self.rewards.shape[0]

    @property
    def returns(self) -> np.ndarray:
        """(B,) undiscounted episode returns over the masked steps."""
        return np.where(self.mask, self.rewards, 0.0).sum(axis=1)

    def broadcast(self, per_episode: np.ndarray) -> np.ndarray:
        """(B,) -> (B, T): the same value on every masked step of an episode, 0 elsewhere."""
        return np.where(self.mask, np.asarray(per_episode, float)[:, None], 0.0)


class CreditRule(abc.ABC):
    """Maps an EpisodeBatch to (B, T) advantages, 0 on unmasked steps.

    Rules that learn (RUDDER's model, VCBM's memories) update their state in `observe(batch)`;
    callers call `observe` on a new batch before `advantages` on it. `state_dict` /
    `load_state_dict` round-trip that state as plain Python and numpy values; saving to disk is
    the caller's job (rules do no I/O).
    """

    name: ClassVar[str]
    # What the rule reads beyond `rewards` and `mask`: EpisodeBatch field names ("observations"),
    # "extras['key']" / "turn_flags['key']" for a named entry, "a | b" for either of two. A caller
    # that cannot fill one (the LLM arm has no observations) refuses the rule before it runs.
    batch_needs: ClassVar[tuple[str, ...]] = ()
    # The env info keys (vcbm_gym.contract.INFO_KEYS) the rule learns from, per turn: a runner fills the
    # batch from them (vcbm_blend's bookmarks from info['state_mutating']); one that does not collect them
    # refuses the rule, and one that does checks that the env reports them before a run starts.
    info_needs: ClassVar[tuple[str, ...]] = ()

    def needs(self) -> tuple[str, ...]:
        """The batch inputs this instance reads (default: the class's `batch_needs`)."""
        return self.batch_needs

    def observe(self, batch: EpisodeBatch) -> None:
        """Learn from a batch (default: a stateless rule learns nothing)."""

    @abc.abstractmethod
    def advantages(self, batch: EpisodeBatch) -> np.ndarray:
        """(B, T) per-step advantages, 0 where `batch.mask` is False."""

    def summary(self) -> dict[str, Any]:
        """A few plain numbers on what the rule has learned, for a run's summary.json (default: none)."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state:
            raise ValueError(f"rule {self.name!r} keeps no state, got keys {sorted(state)}")


NO_CREDIT = "none"  # the credit-rule setting of a run that uses its algorithm's own credit assignment

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
}


def rule_class(name: str) -> type[CreditRule]:
    """The class registered as `name` (imported on first use)."""
    if name not in RULES:
        raise KeyError(f"unknown credit rule {name!r}; expected one of: {', '.join(RULES)}")
    module_name, _, cls_name = RULES[name].partition(":")
    return getattr(importlib.import_module(module_name), cls_name)


def unmet_rule_needs(
    rule: CreditRule | type[CreditRule], batch_provides: Collection[str], info_provides: Collection[str]
) -> list[str]:
    """What `rule` (a built rule, or its class) needs that an arm does not provide: batch fields as written
    in `batch_needs`, info keys as "info['key']". Empty: the rule fits the arm."""
    needs = rule.needs() if isinstance(rule, CreditRule) else rule.batch_needs
    missing = unmet_needs(needs, set(batch_provides))
    return missing + [f"info[{key!r}]" for key in rule.info_needs if key not in info_provides]


def misfit(name: str, arm: str, batch_provides: Collection[str], info_provides: Collection[str]) -> str | None:
    """One line saying what rule `name` (its class's declarations) needs that `arm` does not provide, or None
    when it fits; an unknown name is a line too (listing the rules that fit). Every arm refuses a rule with
    this line, from the rule's own `batch_needs` and `info_needs`: the one declaration of what a rule needs."""
    if name not in RULES:
        fitting = [rule for rule in RULES if not unmet_rule_needs(rule_class(rule), batch_provides, info_provides)]
        return f"unknown credit rule {name!r}; expected one of: {', '.join([NO_CREDIT, *fitting])}"
    return misfit_line(
        name, unmet_rule_needs(rule_class(name), batch_provides, info_provides), arm, batch_provides, info_provides
    )


def misfit_line(
    name: str, missing: Sequence[str], arm: str, batch_provides: Collection[str], info_provides: Collection[str]
) -> str | None:
    """The refusal line for `missing` (from `unmet_rule_needs`), or None when nothing is missing."""
    if not missing:
        return None
    return (
        f"credit rule {name!r} needs {', '.join(missing)}, which the {arm} arm does not provide "
        f"(its EpisodeBatch has: rewards, mask, {', '.join(sorted(batch_provides))}; "
        f"the env info keys it collects: {', '.join(sorted(info_provides)) or 'none'})"
    )


def unmet_needs(needs: Sequence[str], provided: set[str]) -> list[str]:
    """The entries of `needs` (see CreditRule.batch_needs) of which no alternative is in `provided`."""
    return [need for need in needs if not any(alt.strip() in provided for alt in need.split("|"))]


def make_rule(name: str, env: Any = None, **kwargs: Any) -> CreditRule:
    """Build a registered rule by name, e.g. `make_rule("loo")`.

    With `env` (a Gymnasium env), a rule whose inputs depend on the env (RUDDER's features) is
    built by its `from_env(env, **kwargs)`; the other rules ignore it.
    """
    if name not in RULES:
        raise KeyError(f"unknown credit rule {name!r}; expected one of: {', '.join(RULES)}")
    cls = rule_class(name)
    if env is not None and hasattr(cls, "from_env"):
        return cls.from_env(env, **kwargs)
    return cls(**kwargs)
