"""The one interface every credit rule implements: a batch of episodes in, per-step advantages out.

A *step* is whatever the learner optimises per position: an env step for tabular and SB3 agents,
a generated token for LLM agents. Steps belong to *turns* (`step_turn`): for tabular agents every
step is its own turn; for an LLM, a turn is one model response, and its tokens share a turn id.
Turn-level metadata (e.g. `state_mutating`, the execution output text) is given per turn.
"""

from __future__ import annotations

import abc
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


ADVANTAGES = "advantages"  # the rule's output replaces the learner's advantage (PPO/A2C, LOOP)
REWARDS = "rewards"  # the rule's output replaces the env's reward: the learner's own estimator runs on it
EMISSIONS = (ADVANTAGES, REWARDS)


class CreditRule(abc.ABC):
    """Maps an EpisodeBatch to (B, T) per-step credit, 0 on unmasked steps.

    A rule declares what its credit is (`emits`): per-step *advantages* (broadcast, loo, grpo, gigpo,
    vcbm_blend, casi), which replace a learner's advantage, or per-step *rewards* (`RewardRule`: a return
    decomposition such as rudder, rrd, ircr), which a learner's own estimator takes in place of the env's
    reward (GAE and value targets, TD targets, replay-buffer rewards). Arms consume each kind as its
    papers do and refuse the kinds their learner cannot take (algorithms/common/credit_slot.py).

    The call order, the same in every arm (`algorithms.common.credit_slot.assign_credit`): a batch's
    credit first (`advantages(batch)` / `rewards(batch)`, from the rule's state after every earlier
    batch), then the rule learns from it (`observe(batch)`). A batch's credit is never fitted to that
    batch itself (VCBM's retrieval would find each bookmark in its own memory, a reward model would be
    scored on its own targets); an arm may skip `observe` for a batch it discards (the LLM arm's
    aborted iterations). `state_dict` / `load_state_dict`
    round-trip the rule's state as plain Python and numpy values; saving to disk is the caller's job
    (rules do no I/O).
    """

    name: ClassVar[str]
    emits: ClassVar[str] = ADVANTAGES
    # Every kind an instance may emit, for a check made before the rule is built: an option can turn a reward
    # rule's output into an advantage (IRCR's and vcbm_bookmark's baselines); `emission()` says which.
    may_emit: ClassVar[tuple[str, ...]] = ()
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

    def emission(self) -> str:
        """What this instance emits (default: the class's `emits`; an option may change it, e.g. a baseline)."""
        return self.emits

    @classmethod
    def kinds(cls) -> tuple[str, ...]:
        """The kinds an instance of this class may emit: `may_emit`, else just `emits`."""
        return cls.may_emit or (cls.emits,)

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


class RewardRule(CreditRule):
    """A rule whose credit is per-step rewards: a redistribution of the return (RUDDER, RRD, IRCR).

    `rewards(batch)` is the credit; learners take it as their reward. `advantages(batch)` returns the same
    array, for the tools that compare every rule's per-step credit (credit leakage, fidelity); no learner
    reads a reward rule's output as an advantage.
    """

    emits = REWARDS

    @abc.abstractmethod
    def rewards(self, batch: EpisodeBatch) -> np.ndarray:
        """(B, T) per-step rewards, 0 where `batch.mask` is False."""

    def advantages(self, batch: EpisodeBatch) -> np.ndarray:
        return self.rewards(batch)

    def transition_rewards(
        self, observations: np.ndarray, actions: np.ndarray, next_observations: np.ndarray, episode_returns: np.ndarray
    ) -> np.ndarray | None:
        """(N,) the current reward of N stored transitions, for a replay buffer that relabels what it samples as
        the rule learns (RRD's and IRCR's buffers); None (the default) when a step's reward depends on its whole
        episode (RUDDER's LSTM), so a buffer writes the episode's rewards once, when it ends."""
        return None

    def replay_elites(self) -> tuple[int, float]:
        """(k, fraction): a replay buffer keeps the k best episodes beside its FIFO and draws this fraction of every
        batch from them (IRCR's heap of the 10 best episodes, half of each batch); (0, 0.0): none."""
        return 0, 0.0


NO_CREDIT = "none"  # the credit-rule setting of a run that uses its algorithm's own credit assignment


def unmet_rule_needs(
    rule: CreditRule | type[CreditRule], batch_provides: Collection[str], info_provides: Collection[str]
) -> list[str]:
    """What `rule` (a built rule, or its class) needs that an arm does not provide: batch fields as written
    in `batch_needs`, info keys as "info['key']". Empty: the rule fits the arm."""
    needs = rule.needs() if isinstance(rule, CreditRule) else rule.batch_needs
    missing = unmet_needs(needs, set(batch_provides))
    return missing + [f"info[{key!r}]" for key in rule.info_needs if key not in info_provides]


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
