"""Credit between two agents: CCPO, SEPO and the Shapley form, as pure array functions.

Z. Li et al., arXiv 2603.21563: Counterfactual Credit for Policy Optimization (CCPO) and Self-Evaluated Credit
for Policy Optimization (SEPO), with the reference code bhai114/ccpo (its two-model trainers); the equations as
the paper gives them. A Thinker writes a thought, a Solver answers, a verifier scores the
answer R in {-1, +1}. Each function maps a batch of such episodes, one row each, to per-role rewards or
advantages; rows of one prompt share a group id (the prompt's n thoughts). docs/papers/ccpo.md lists where each
equation lives and the choices made where the paper or its code is ambiguous.

The rules `ccpo`, `sepo` and `shapley` of the registry (vcbm_gym/credit/registry.py) are built on them
(`RoleCreditRule`): they read each row's role and its joint and solo outcomes from the batch's extras, which only the
LLM arm's two-role trainer (`--algo ccpo`, algorithms/llm/two_role/trainer.py) provides. Its baseline, both roles
paid the shared R_joint, is the registry's `grpo` on that reward. Inputs are checked here, one ValueError line each.
"""

from __future__ import annotations

import abc
import re
from typing import Any, NamedTuple

import numpy as np

import vcbm_gym.credit.options as options
from vcbm_gym.credit.base import CreditRule, EpisodeBatch
from vcbm_gym.credit.grpo import group_relative_advantages

THINKER_BONUS_WEIGHT = 0.2  # CCPO's lambda: Thinker reward R_joint + lambda * bonus
BONUS_FORMS = ("event", "difference")  # helped - hurt, or (R_joint - baseline) / 2
BONUS = "event"  # the paper's bonus
SELF_WEIGHT = 0.3  # SEPO's eta: a role's own rating against its peer's (1 - eta)
SEPO_CREDIT_WEIGHT = 0.2  # SEPO: R + this * bonus when the answer is right
SEPO_BLAME_WEIGHT = 0.2  # SEPO: R - this * bonus when it is wrong
# SEPO's fixed (Thinker share, Solver share) pairs; every rating is one of them or falls back to (0.5, 0.5)
CREDIT_SPLITS: tuple[tuple[float, float], ...] = (
    (0.9, 0.1),
    (0.8, 0.2),
    (0.7, 0.3),
    (0.6, 0.4),
    (0.5, 0.5),
    (0.4, 0.6),
    (0.3, 0.7),
    (0.2, 0.8),
    (0.1, 0.9),
)
FALLBACK_SPLIT = (0.5, 0.5)
_SPLIT_TOLERANCE = 1e-6


# --- input checks ------------------------------------------------------------------------------------------
def _outcomes(name: str, values: Any, n: int | None = None) -> np.ndarray:
    """A 1-d array of verifier outcomes, each -1 or +1 (of length n when given)."""
    array = np.asarray(values, dtype=np.float64)
    if array.ndim != 1 or (n is not None and len(array) != n):
        raise ValueError(f"{name} shape {array.shape}: expected ({'n' if n is None else n},), one outcome per episode")
    bad = ~np.isin(array, (-1.0, 1.0))
    if bad.any():
        k = int(np.argmax(bad))
        raise ValueError(f"{name}[{k}]={float(array[k])!r}: expected -1 or +1 (the verifier's outcome)")
    return array


def _within_unit(name: str, values: Any, n: int) -> np.ndarray:
    """A 1-d array of n numbers in [-1, 1] (a mean of outcomes)."""
    array = np.asarray(values, dtype=np.float64)
    if array.shape != (n,):
        raise ValueError(f"{name} shape {array.shape}: expected ({n},), one value per episode")
    bad = ~(np.isfinite(array) & (np.abs(array) <= 1.0))
    if bad.any():
        k = int(np.argmax(bad))
        raise ValueError(f"{name}[{k}]={float(array[k])!r}: expected a number in [-1, 1] (a mean of -1 / +1 outcomes)")
    return array


def _group_ids(group_ids: Any, n: int) -> np.ndarray:
    groups = np.asarray(group_ids)
    if groups.shape != (n,):
        raise ValueError(f"group_ids shape {groups.shape}: expected ({n},), the prompt of each episode")
    return groups


def _splits(name: str, values: Any, n: int | None = None) -> np.ndarray:
    """An (n, 2) array of (Thinker share, Solver share) rows, each one of CREDIT_SPLITS."""
    array = np.asarray(values, dtype=np.float64)
    if array.ndim != 2 or array.shape[1] != 2 or (n is not None and len(array) != n):
        rows = "n" if n is None else n
        raise ValueError(f"{name} shape {array.shape}: expected ({rows}, 2), a (Thinker, Solver) split per episode")
    fixed = np.asarray(CREDIT_SPLITS)
    known = (np.abs(array[:, None, :] - fixed[None, :, :]) <= _SPLIT_TOLERANCE).all(axis=2).any(axis=1)
    if not known.all():
        k = int(np.argmin(known))
        raise ValueError(
            f"{name}[{k}]={tuple(array[k].tolist())}: expected one of the nine splits (0.9, 0.1) ... (0.1, 0.9) "
            "(what parse_credit_split returns)"
        )
    return array


def _group_means(values: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """Each row's group mean of `values`."""
    _, inverse = np.unique(groups, return_inverse=True)
    inverse = inverse.reshape(-1)
    return (np.bincount(inverse, weights=values) / np.bincount(inverse))[inverse]


# --- CCPO --------------------------------------------------------------------------------------------------
def group_solo_baseline(r_solo: Any, group_ids: Any) -> np.ndarray:
    """CCPO's solo baseline: b_k = mean of R_solo over the rows of k's prompt group (Counterfactual Credit for Policy
    Optimization, Li et al., arXiv 2603.21563; docs/papers/ccpo.md, "The method"). R_solo is the Solver's verifier
    outcome on the problem alone, without the thought."""
    solo = _outcomes("r_solo", r_solo)
    return _group_means(solo, _group_ids(group_ids, len(solo)))


def ccpo_event_bonus(r_joint: Any, baseline: Any) -> np.ndarray:
    """CCPO's event bonus, helped - hurt: helped = (R_joint > 0 and b < 0), hurt = (R_joint < 0 and b > 0).

    The thought gets +1 where it turned a problem the Solver alone mostly fails into a right answer, -1 where it
    turned one the Solver alone mostly solves into a wrong one, and 0 otherwise (also where b = 0)."""
    joint = _outcomes("r_joint", r_joint)
    base = _within_unit("baseline", baseline, len(joint))
    helped = (joint > 0) & (base < 0)
    hurt = (joint < 0) & (base > 0)
    return helped.astype(np.float64) - hurt.astype(np.float64)


def ccpo_difference_bonus(r_joint: Any, baseline: Any) -> np.ndarray:
    """CCPO's alternative bonus, (R_joint - b) / 2: the joint outcome's gain over the solo baseline, in [-1, 1]."""
    joint = _outcomes("r_joint", r_joint)
    return (joint - _within_unit("baseline", baseline, len(joint))) / 2.0


def ccpo_rewards(
    r_joint: Any, baseline: Any, bonus: str = BONUS, lam: float = THINKER_BONUS_WEIGHT
) -> tuple[np.ndarray, np.ndarray]:
    """CCPO's role rewards: (Thinker R_joint + lam * bonus, Solver R_joint).

    `bonus`: "event" (`ccpo_event_bonus`) or "difference" (`ccpo_difference_bonus`); `baseline`: usually
    `group_solo_baseline`, or a row's own R_solo (the reference's counterfactual_use_group_solo_baseline=False).
    The Solver is paid the shared outcome alone: only the Thinker's contribution is counterfactual here."""
    if bonus not in BONUS_FORMS:
        raise ValueError(f"bonus={bonus!r}: expected one of {', '.join(BONUS_FORMS)}")
    lam = options.number("lam", lam, 0)
    shaping = ccpo_event_bonus(r_joint, baseline) if bonus == "event" else ccpo_difference_bonus(r_joint, baseline)
    joint = np.asarray(r_joint, dtype=np.float64)
    return joint + lam * shaping, joint.copy()


def group_advantages(rewards: Any, group_ids: Any) -> np.ndarray:
    """GRPO's advantage without std normalisation, as CCPO and SEPO train each role: A_k = r_k - mean_{g(k)} r.

    The project's `grpo.group_relative_advantages(normalise_std=False)`; a group of one gets 0 there (no baseline),
    where the reference's verl gives it r_k itself (docs/papers/ccpo.md)."""
    values = np.asarray(rewards, dtype=np.float64)
    if values.ndim != 1 or not np.isfinite(values).all():
        raise ValueError(f"rewards shape {values.shape}: expected (n,) finite rewards, one per episode")
    return group_relative_advantages(values, _group_ids(group_ids, len(values)), normalise_std=False)


# --- SEPO --------------------------------------------------------------------------------------------------
class CreditSplit(NamedTuple):
    """A rater's split of the credit: the Thinker's and the Solver's shares; `parsed` is False for the fallback."""

    thinker: float
    solver: float
    parsed: bool


# a decimal may carry spaces around its point: a word-level tokenizer decodes "0.7" as "0 . 7" (the tiny models' does)
_NUMBER = r"(\d*(?:\s*\.\s*)?\d+)\s*(%?)"
_SEPARATOR = r"\s*[,;/]\s*"
_PAIR_FORMS = (
    re.compile(r"[\[(]\s*" + _NUMBER + _SEPARATOR + _NUMBER + r"\s*[\])]"),
    re.compile(r"\b(?:pair|split)\b\s*[:=]\s*" + _NUMBER + _SEPARATOR + _NUMBER, re.IGNORECASE),
)
# the Thinker's share alone in brackets, "(0.7)": the nine splits sum to 1, so the Solver has the rest
_SHARE_FORM = re.compile(r"[\[(]\s*" + _NUMBER + r"\s*[\])]")


def _share(digits: str, percent: str) -> float:
    value = float("".join(digits.split()))
    return value / 100.0 if percent else value


def parse_credit_split(text: str) -> CreditSplit:
    """A rater's (Thinker share, Solver share) from its text; the fallback (0.5, 0.5) when none can be read.

    Accepted forms: two numbers separated by ",", ";" or "/" either inside brackets, "(0.7, 0.3)" or
    "[0.7, 0.3]" (so the JSON `{"pair": [0.7, 0.3]}` of the reference's prompt), or after "pair" or "split" and
    ":" or "=", as in "split: 0.7/0.3"; or the Thinker's share alone in brackets, "(0.7)", the Solver having the
    rest (what the two-role trainer's RATING_REQUEST asks for). A number is a decimal share ("0.7", ".7") or a
    percentage with its sign ("70%"); a bare number above 1 is no share. Spaces may surround a decimal point
    ("0 . 7", as a word-level tokenizer decodes "0.7"), never split the digits on one side of it ("0 . 7 5" is no
    number). The last such pair or share in the text is the rating (a rater may think aloud before it answers); it
    counts when it is one of the nine CREDIT_SPLITS, and anything else (no pair, a pair off the grid such as
    (0.75, 0.25) or (1, 0), a share off it such as (0.75)) falls back to (0.5, 0.5) with `parsed` False."""
    if not isinstance(text, str):
        raise ValueError(f"text={text!r}: expected a str (a rater's answer)")
    found = [match for form in (*_PAIR_FORMS, _SHARE_FORM) for match in form.finditer(text)]
    if not found:
        return CreditSplit(*FALLBACK_SPLIT, parsed=False)
    last = max(found, key=lambda match: match.start())
    thinker = _share(last.group(1), last.group(2))
    pair = (thinker, 1.0 - thinker) if last.re is _SHARE_FORM else (thinker, _share(last.group(3), last.group(4)))
    for fixed in CREDIT_SPLITS:
        if abs(pair[0] - fixed[0]) <= _SPLIT_TOLERANCE and abs(pair[1] - fixed[1]) <= _SPLIT_TOLERANCE:
            return CreditSplit(*fixed, parsed=True)
    return CreditSplit(*FALLBACK_SPLIT, parsed=False)


def sepo_scores(thinker_splits: Any, solver_splits: Any, eta: float = SELF_WEIGHT) -> tuple[np.ndarray, np.ndarray]:
    """SEPO's scores: s_1 = eta * self + (1 - eta) * peer for the Thinker, and symmetrically for the Solver.

    Both raters write (Thinker share, Solver share), as in the reference's prompt, so
    s_1 = eta * thinker_splits[:, 0] + (1 - eta) * solver_splits[:, 0] and
    s_2 = eta * solver_splits[:, 1] + (1 - eta) * thinker_splits[:, 1]."""
    own = _splits("thinker_splits", thinker_splits)
    peer = _splits("solver_splits", solver_splits, len(own))
    eta = options.number("eta", eta, 0, 1)
    return eta * own[:, 0] + (1 - eta) * peer[:, 0], eta * peer[:, 1] + (1 - eta) * own[:, 1]


def sepo_bonuses(s1: np.ndarray, s2: np.ndarray, group_ids: Any) -> tuple[np.ndarray, np.ndarray]:
    """SEPO's bonuses: w_i = s_i / (s_1 + s_2), centred in its group (w_i minus its group's mean of w_i).

    s_1 + s_2 = 1 + (2 eta - 1)(thinker's Thinker share - solver's Thinker share) >= 0.2 on the nine splits, so
    the division needs no guard (the reference clamps it at 1e-6)."""
    s1, s2 = np.asarray(s1, dtype=np.float64), np.asarray(s2, dtype=np.float64)
    if s1.ndim != 1 or s1.shape != s2.shape or not (np.isfinite(s1 + s2).all() and (s1 >= 0).all() and (s2 >= 0).all()):
        raise ValueError(f"s1 {s1.shape} and s2 {s2.shape}: expected two (n,) arrays of finite scores >= 0 (sepo_scores)")
    if not (s1 + s2 > 0).all():
        raise ValueError("s1 + s2 = 0 in some row: expected a positive total score (sepo_scores never gives 0)")
    w1 = s1 / (s1 + s2)
    groups = _group_ids(group_ids, len(w1))
    w2 = 1.0 - w1
    return w1 - _group_means(w1, groups), w2 - _group_means(w2, groups)


def sepo_rewards(
    r: Any,
    thinker_splits: Any,
    solver_splits: Any,
    group_ids: Any,
    eta: float = SELF_WEIGHT,
    credit_weight: float = SEPO_CREDIT_WEIGHT,
    blame_weight: float = SEPO_BLAME_WEIGHT,
) -> tuple[np.ndarray, np.ndarray]:
    """SEPO's role rewards (Thinker, Solver): R + credit_weight * bonus_i where R = +1, R - blame_weight * bonus_i
    where R = -1; bonus_i is role i's centred weight (`sepo_bonuses`).

    A role that claims (and is granted by its peer) more of the credit than its group's average gains more on a
    right answer and loses more on a wrong one: credit and blame follow the same share."""
    outcome = _outcomes("r", r)
    credit_weight = options.number("credit_weight", credit_weight, 0)
    blame_weight = options.number("blame_weight", blame_weight, 0)
    s1, s2 = sepo_scores(_splits("thinker_splits", thinker_splits, len(outcome)), solver_splits, eta)
    bonuses = sepo_bonuses(s1, s2, group_ids)
    weight = np.where(outcome > 0, credit_weight, -blame_weight)
    thinker, solver = (outcome + weight * bonus for bonus in bonuses)
    return thinker, solver


# --- the Shapley form --------------------------------------------------------------------------------------
def shapley_credit(r_joint: Any, r_solo: Any) -> tuple[np.ndarray, np.ndarray]:
    """The earlier version's Shapley form: phi_1 = (joint - solo) / 2 (Thinker), phi_2 = solo / 2 + joint / 2
    (Solver); phi_1 + phi_2 = R_joint.

    It is the two-player Shapley value of v(empty) = 0, v(Thinker alone) = 0 (a thought answers nothing),
    v(Solver alone) = solo, v(both) = joint. `r_solo`: the row's own solo outcome (the reference pairs joint
    rollout k with solo rollout k) or a baseline in [-1, 1]."""
    joint = _outcomes("r_joint", r_joint)
    solo = _within_unit("r_solo", r_solo, len(joint))
    return (joint - solo) / 2.0, solo / 2.0 + joint / 2.0


# --- the two-role rules ------------------------------------------------------------------------------------
ROLES = ("thinker", "solver")
ROLE_EXTRAS = ("role", "r_joint", "r_solo")  # per row: its trained role, R_joint, and the Solver's solo R_solo
SPLIT_EXTRAS = ("thinker_split", "solver_split")  # per row: each role's (Thinker share, Solver share) rating (SEPO)


class RoleCreditRule(CreditRule):
    """A rule of the registry that pays each row of a two-role batch its role's reward, then trains each role on
    GRPO's advantage without std: the role reward minus its mean over the rows of the same prompt and role (as CCPO
    and SEPO train each role), on every trained step of the row.

    A row is one episode of prompt group_ids[k] (a Thinker's thought and the Solver's joint answer to it) trained in
    role extras['role'][k] ("thinker" or "solver"); extras['r_joint'] and extras['r_solo'] hold the verifier's
    outcomes (-1 or +1) of the joint answer and of the Solver's answer to the problem alone. Only an arm that plays
    both roles and the solo turn fills these (the two-role LLM arm, `--algo ccpo`); every other arm is refused by
    `batch_needs`. The group baseline and SEPO's centring are over a prompt's rows, so all of them must be in the
    batch. Stateless: `observe` learns nothing."""

    batch_needs = ("group_ids", *(f"extras[{key!r}]" for key in ROLE_EXTRAS))

    @abc.abstractmethod
    def pay(self, batch: EpisodeBatch, joint: np.ndarray, solo: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(Thinker reward, Solver reward) of every row."""

    def role_rewards(self, batch: EpisodeBatch) -> np.ndarray:
        """(B,) each row's reward in its own role: the Thinker's on a "thinker" row, the Solver's on a "solver" row."""
        n = batch.batch_size
        joint = _outcomes("extras['r_joint']", batch.extras["r_joint"], n)
        solo = _outcomes("extras['r_solo']", batch.extras["r_solo"], n)
        role = np.asarray(list(batch.extras["role"]), dtype=object)
        if role.shape != (n,) or not np.isin(role, ROLES).all():
            raise ValueError(f"extras['role']: expected {n} of {ROLES}, one per episode; got {list(role)[:4]}...")
        thinker, solver = self.pay(batch, joint, solo)
        return np.where(role == "thinker", thinker, solver)

    def advantages(self, batch: EpisodeBatch) -> np.ndarray:
        reward = self.role_rewards(batch)
        keys = [f"{group}:{role}" for group, role in zip(batch.group_ids.tolist(), batch.extras["role"])]
        per_role = np.unique(np.array(keys, dtype=str), return_inverse=True)[1].reshape(-1)
        return batch.broadcast(group_advantages(reward, per_role))


class CCPORule(RoleCreditRule):
    """CCPO (`ccpo_rewards`): the Thinker paid R_joint + lam * bonus against the solo baseline (`group_solo_baseline`,
    or the row's own R_solo when group_baseline is False), the Solver R_joint."""

    name = "ccpo"

    def __init__(self, bonus: str = BONUS, lam: float = THINKER_BONUS_WEIGHT, group_baseline: bool = True) -> None:
        if bonus not in BONUS_FORMS:
            raise ValueError(f"bonus={bonus!r}: expected one of {', '.join(BONUS_FORMS)}")
        self.bonus = bonus
        self.lam = options.number("lam", lam, 0)
        self.group_baseline = options.flag("group_baseline", group_baseline)

    def pay(self, batch: EpisodeBatch, joint: np.ndarray, solo: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        baseline = group_solo_baseline(solo, batch.group_ids) if self.group_baseline else solo
        return ccpo_rewards(joint, baseline, bonus=self.bonus, lam=self.lam)


class SEPORule(RoleCreditRule):
    """SEPO (`sepo_rewards`): each role paid R shifted by its centred share of the credit, from the splits both roles
    wrote (extras['thinker_split'] and extras['solver_split']: a (Thinker share, Solver share) row per episode)."""

    name = "sepo"
    batch_needs = (*RoleCreditRule.batch_needs, *(f"extras[{key!r}]" for key in SPLIT_EXTRAS))

    def __init__(
        self, eta: float = SELF_WEIGHT, credit_weight: float = SEPO_CREDIT_WEIGHT, blame_weight: float = SEPO_BLAME_WEIGHT
    ) -> None:
        self.eta = options.number("eta", eta, 0, 1)
        self.credit_weight = options.number("credit_weight", credit_weight, 0)
        self.blame_weight = options.number("blame_weight", blame_weight, 0)

    def pay(self, batch: EpisodeBatch, joint: np.ndarray, solo: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        thinker_splits, solver_splits = (batch.extras[key] for key in SPLIT_EXTRAS)
        return sepo_rewards(
            joint, thinker_splits, solver_splits, batch.group_ids, self.eta, self.credit_weight, self.blame_weight
        )


class ShapleyRule(RoleCreditRule):
    """The Shapley form (`shapley_credit`) with the row's own R_solo (the reference pairs joint rollout k with solo
    rollout k): the two roles' rewards sum to R_joint."""

    name = "shapley"

    def pay(self, batch: EpisodeBatch, joint: np.ndarray, solo: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return shapley_credit(joint, solo)
