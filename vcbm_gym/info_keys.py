"""The env contract's table of info keys: each key an env may report, its type check, and who reads it.

Data, apart from the small checks of each key's value; `vcbm_gym.contract` checks envs against it.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

import numpy as np

STEP, END = "every step", "the episode's last step"


def _is_bool(value: Any) -> bool:
    return isinstance(value, (bool, np.bool_))


def _is_bool_or_none(value: Any) -> bool:
    return value is None or _is_bool(value)


def _is_unit_number(value: Any) -> bool:
    return isinstance(value, (bool, int, float, np.bool_, np.integer, np.floating)) and 0.0 <= float(value) <= 1.0


def _is_finite_number(value: Any) -> bool:
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool) and np.isfinite(value)


def _is_effect(value: Any) -> bool:
    return value is None or isinstance(value, Hashable)


def _is_coalition_table(value: Any) -> bool:
    if not isinstance(value, (list, tuple, np.ndarray)):
        return False
    table = np.asarray(value)
    return table.ndim == 1 and len(table) >= 1 and (len(table) & (len(table) - 1)) == 0 and np.issubdtype(table.dtype, np.number)


@dataclass(frozen=True)
class InfoKey:
    name: str
    accepts: Callable[[Any], bool]  # is a value of the contract's type
    kind_text: str  # the type, for people
    when: str  # STEP or END
    meaning: str
    read_by: str
    evaluation_only: bool


INFO_KEYS: dict[str, InfoKey] = {
    key.name: key
    for key in (
        InfoKey(
            "first_decision_optimal", _is_bool, "bool", END,
            "the episode's first decision was the optimal one (known to the env, hidden from agents)",
            "tabular and SB3 runners: the convergence criterion (correct rate over the last 750 episodes >= 0.95)",
            evaluation_only=True,
        ),
        InfoKey(
            "is_success", _is_bool, "bool", END,
            "the episode reached its goal (Stable-Baselines3's own key)",
            "SB3 runner (SB3 logs rollout/success_rate) and tabular runner (train/success_rate); both summaries",
            evaluation_only=True,
        ),
        InfoKey(
            "task_goal_completion", _is_unit_number, "a number in [0, 1]", END,
            "how much of the task's goal the episode completed (1 = solved)",
            "LLM trainer: the task_goal_completion metric (AppWorld's `success` is read when it is absent)",
            evaluation_only=True,
        ),
        InfoKey(
            "is_decision_turn", _is_bool, "bool", STEP,
            "this turn made the decision that decides the return",
            "LLM trainer: the share of advantage mass on deciding turns",
            evaluation_only=True,
        ),
        InfoKey(
            "action_optimal", _is_bool_or_none, "bool, or None", STEP,
            "this step's action starts a shortest solution from the state it answered (known to the env); None where "
            "that state has no solution, so that no action could be optimal",
            "LLM trainer: the optimal_action_rate metric",
            evaluation_only=True,
        ),
        InfoKey(
            "withheld_reward", _is_finite_number, "a finite number", STEP,
            "the step's own reward, held back by envs.delayed_reward.DelayedReward (paid at the episode's end)",
            "SB3 replay buffer of a reward rule: the rule's fit to the dense reward (credit/reward_fit_corr)",
            evaluation_only=True,
        ),
        InfoKey(
            "state_mutating", _is_bool, "bool", STEP,
            "this step's action changed the environment's state: a VCBM bookmark",
            "vcbm-loop (credit rule vcbm_blend): which turns are bookmarks",
            evaluation_only=False,
        ),
        InfoKey(
            "execution_output", lambda value: isinstance(value, str), "str", STEP,
            "the text the environment returned for this action, the bookmark's memory key (the step's observation "
            "text when absent)",
            "vcbm-loop (credit rule vcbm_blend): the hashed embedding of a bookmark",
            evaluation_only=False,
        ),
        InfoKey(
            "effect", _is_effect, "a hashable value, or None for no executable effect", STEP,
            "the action's canonical executable effect: equal effects in equal contexts share an EMPO cell",
            "LLM trainer with --ratio-sharing effect (EMPO)",
            evaluation_only=False,
        ),
        InfoKey(
            "coalition_values", _is_coalition_table, "a 1-d array of 2^m numbers", END,
            "the set action's value for every subset of its m items, indexed by bitmask",
            "credit rule casi (through EpisodeBatch.extras['coalition_values'])",
            evaluation_only=False,
        ),
    )
}  # fmt: skip

# Who needs which keys to learn, beyond the credit rules (a consumer's name as the user types it -> keys). A
# credit rule declares its own keys (CreditRule.info_needs, vcbm_gym/credit/base.py); `required_keys` reads them.
NEEDS: dict[str, tuple[str, ...]] = {
    "vcbm-loop": ("state_mutating",),
    "--ratio-sharing effect": ("effect",),
}
