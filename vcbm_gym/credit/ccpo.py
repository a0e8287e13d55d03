"""Credit between two agents: CCPO, SEPO and the Shapley form, as pure array functions.

Z. Li et al., arXiv 2603.21563: Counterfactual Credit for Policy Optimization (CCPO) and Self-Evaluated Credit
for Policy Optimization (SEPO), with the reference code bhai114/ccpo (its two-model trainers); the equations as
the paper gives them. A Thinker writes a thought, a Solver answers, a verifier scores the
answer R in {-1, +1}. Each function maps a batch of such episodes, one row each, to per-role rewards or
advantages; rows of one prompt share a group id (the prompt's n thoughts). docs/papers/ccpo.md lists where each
equation lives and the choices made where the paper or its code is ambiguous.

These functions are not rules of the `RULES` table (vcbm_gym/credit/registry.py): a rule there maps one EpisodeBatch
of single-agent episodes to credit, while these need each episode's counterfactual (solo) outcome and its role.
The LLM arm's two-role trainer (`--algo ccpo`, algorithms/llm/two_role/trainer.py) calls `role_rewards` on its trained rows.
Inputs are checked here, one ValueError line each.
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple

import numpy as np

import vcbm_gym.credit.options as options
from vcbm_gym.credit.grpo import group_relative_advantages

THINKER_BONUS_WEIGHT = 0.2  # CCPO's lambda: Thinker reward R_joint + lambda * bonus
BONUS_FORMS = ("event", "difference")  # helped - hurt, or (R_joint - baseline) / 2
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
    r_joint: Any, baseline: Any, bonus: str = "event", lam: float = THINKER_BONUS_WEIGHT
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


_NUMBER = r"(\d*\.?\d+)\s*(%?)"
_SEPARATOR = r"\s*[,;/]\s*"
_PAIR_FORMS = (
    re.compile(r"[\[(]\s*" + _NUMBER + _SEPARATOR + _NUMBER + r"\s*[\])]"),
    re.compile(r"\b(?:pair|split)\b\s*[:=]\s*" + _NUMBER + _SEPARATOR + _NUMBER, re.IGNORECASE),
)


def _share(digits: str, percent: str) -> float:
    return float(digits) / 100.0 if percent else float(digits)


def parse_credit_split(text: str) -> CreditSplit:
    """A rater's (Thinker share, Solver share) from its text; the fallback (0.5, 0.5) when none can be read.

    Accepted forms: two numbers separated by ",", ";" or "/" either inside brackets, "(0.7, 0.3)" or
    "[0.7, 0.3]" (so the JSON `{"pair": [0.7, 0.3]}` of the reference's prompt), or after "pair" or "split" and
    ":" or "=", as in "split: 0.7/0.3". A number is a decimal share ("0.7", ".7") or a percentage with its sign
    ("70%"); a bare number above 1 is no share. The last such pair in the text is the rating (a rater may think
    aloud before it answers); it counts when it is one of the nine CREDIT_SPLITS, and anything else (no pair, a
    pair off the grid such as (0.75, 0.25) or (1, 0)) falls back to (0.5, 0.5) with `parsed` False."""
    if not isinstance(text, str):
        raise ValueError(f"text={text!r}: expected a str (a rater's answer)")
    found = [match for form in _PAIR_FORMS for match in form.finditer(text)]
    if not found:
        return CreditSplit(*FALLBACK_SPLIT, parsed=False)
    last = max(found, key=lambda match: match.start())
    pair = (_share(last.group(1), last.group(2)), _share(last.group(3), last.group(4)))
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


# --- per-role rewards of a batch of trained rows -----------------------------------------------------------
TWO_ROLE_CREDITS = ("ccpo", "sepo", "shapley", "grpo")  # grpo: both roles paid the shared R_joint (the baseline)
ROLES = ("thinker", "solver")
CREDIT_ARGUMENTS = {
    "ccpo": {"bonus": "event", "lam": THINKER_BONUS_WEIGHT, "group_baseline": True},
    "sepo": {"eta": SELF_WEIGHT, "credit_weight": SEPO_CREDIT_WEIGHT, "blame_weight": SEPO_BLAME_WEIGHT},
    "shapley": {},
    "grpo": {},
}


def credit_arguments(credit: str, kwargs: Any = None) -> dict[str, Any]:
    """Rule `credit`'s arguments: CREDIT_ARGUMENTS[credit] updated by `kwargs`, each checked (one ValueError line)."""
    if credit not in TWO_ROLE_CREDITS:
        raise ValueError(f"credit={credit!r}: expected one of {', '.join(TWO_ROLE_CREDITS)} (the two-role credit rules)")
    given = dict(kwargs or {})
    unknown = sorted(set(given) - set(CREDIT_ARGUMENTS[credit]))
    if unknown:
        known = ", ".join(CREDIT_ARGUMENTS[credit]) or "none"
        raise ValueError(f"credit_kwargs[{credit!r}] has {unknown[0]!r}: expected only {known}")
    out = {**CREDIT_ARGUMENTS[credit], **given}
    if credit == "ccpo":
        if out["bonus"] not in BONUS_FORMS:
            raise ValueError(f"bonus={out['bonus']!r}: expected one of {', '.join(BONUS_FORMS)}")
        out["lam"] = options.number("lam", out["lam"], 0)
        out["group_baseline"] = options.flag("group_baseline", out["group_baseline"])
    elif credit == "sepo":
        out["eta"] = options.number("eta", out["eta"], 0, 1)
        out["credit_weight"] = options.number("credit_weight", out["credit_weight"], 0)
        out["blame_weight"] = options.number("blame_weight", out["blame_weight"], 0)
    return out


def role_rewards(
    credit: str,
    roles: Any,
    r_joint: Any,
    r_solo: Any,
    group_ids: Any,
    thinker_splits: Any = None,
    solver_splits: Any = None,
    **kwargs: Any,
) -> np.ndarray:
    """Each row's reward under two-role rule `credit`: the Thinker's reward on a "thinker" row, the Solver's on a
    "solver" row.

    Row k is one episode of prompt group_ids[k] (a Thinker's thought and the Solver's joint answer to it, R_joint,
    and the Solver's solo answer to the problem alone, R_solo), trained in role roles[k]:
    - ccpo: `ccpo_rewards` against `group_solo_baseline` (or the row's own R_solo when group_baseline is False);
    - sepo: `sepo_rewards` on the splits both roles wrote (rows of (Thinker share, Solver share));
    - shapley: `shapley_credit` with the row's own R_solo (the reference pairs joint rollout k with solo rollout k);
    - grpo: R_joint for both roles (plain GRPO on the shared reward, the baseline).
    The group baseline and SEPO's centring are over a group's rows, so a group's rows must all be in the batch."""
    args = credit_arguments(credit, kwargs)
    joint = _outcomes("r_joint", r_joint)
    solo = _outcomes("r_solo", r_solo, len(joint))
    groups = _group_ids(group_ids, len(joint))
    role = np.asarray(roles, dtype=object)
    if role.shape != joint.shape or not np.isin(role, ROLES).all():
        raise ValueError(f"roles: expected {len(joint)} of {ROLES}, one per episode; got {list(role)[:4]}...")
    if credit == "ccpo":
        baseline = group_solo_baseline(solo, groups) if args["group_baseline"] else solo
        thinker, solver = ccpo_rewards(joint, baseline, bonus=args["bonus"], lam=args["lam"])
    elif credit == "sepo":
        if thinker_splits is None or solver_splits is None:
            raise ValueError("credit='sepo': expected thinker_splits and solver_splits, an (n, 2) split per episode each")
        thinker, solver = sepo_rewards(
            joint, thinker_splits, solver_splits, groups, args["eta"], args["credit_weight"], args["blame_weight"]
        )
    elif credit == "shapley":
        thinker, solver = shapley_credit(joint, solo)
    else:
        thinker, solver = joint, joint
    return np.where(role == "thinker", thinker, solver)
