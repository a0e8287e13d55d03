"""Scoring: every credit rule learns from episodes of the behaviour policy and gives its credit on the scored
episodes, which is compared with the replay reference (CASI's fidelity metrics, leakage after the decision step)
and summarised with bootstrap CIs over episodes or, where rollouts share a task, over tasks."""

from __future__ import annotations

import argparse
import time
from typing import Any

import gymnasium as gym
import numpy as np

from algorithms.common.credit_slot import assign_credit, credit_of
from algorithms.credit_fidelity import fidelity_metrics
from algorithms.credit_reference.replay import (
    RULE_KWARGS,
    SLOTS,
    BehaviourPolicy,
    Branching,
    Played,
    ReplayedEpisode,
    episode_batch,
    play,
    play_slots,
    replay_episode,
    replay_slots,
)
from algorithms.experiment.stats import BOOTSTRAP_SEED, CONFIDENCE, N_RESAMPLES, aggregate_estimates
from vcbm_gym.credit.base import unmet_rule_needs
from vcbm_gym.credit.registry import RuleLookupError, make_rule, rule_class
from vcbm_gym.credit.set_credit import set_credit

# The coalition rules of vcbm_gym/credit/set_credit.py, scored per slot on a set action (set_shapley is CASI's credit)
SET_RULES = {f"set_{name}": name for name in ("shapley", "singleton", "banzhaf", "loo", "broadcast")}
METRICS = ("sign_all", "sign_nz", "spearman", "top_action", "cosine", "leakage")
ZERO = 1e-12


def leakage_sums(credit: np.ndarray, decision_step: int) -> tuple[float, float]:
    """(sum of |credit| after `decision_step`, sum of |credit|) over the last axis (steps) and any others."""
    magnitude = np.abs(np.asarray(credit, float))
    return float(magnitude[..., decision_step + 1 :].sum()), float(magnitude.sum())


def episode_scores(credit: np.ndarray, reference: np.ndarray, decision_step: int | None) -> dict[str, float]:
    """CASI's fidelity metrics of one episode's step credit against the reference, and its leakage share."""
    scores = fidelity_metrics(np.asarray(credit, float), np.asarray(reference, float))
    after, total = leakage_sums(credit, decision_step) if decision_step is not None else (np.nan, 0.0)
    scores["leakage"] = after / total if total > ZERO else float("nan")
    return scores


def set_scores(credit: np.ndarray, reference: np.ndarray, centred: bool) -> dict[str, float]:
    """A set's fidelity metrics over its slots, as defined or with credit and reference each centred within the set
    (CASI's protocol, algorithms/credit_fidelity.py); no leakage (a set has no decision step)."""
    credit, reference = np.asarray(credit, float), np.asarray(reference, float)
    if centred:
        credit, reference = credit - credit.mean(), reference - reference.mean()
    return fidelity_metrics(credit, reference)


def summarise(per_episode: list[dict[str, float]], tasks: list[int] | None = None) -> dict[str, Any]:
    """Mean (median for cosine) of each metric over episodes with a bootstrap 95% CI; NaNs (undefined) left out.
    With `tasks` (episode -> its task, --group-size > 1) the bootstrap resamples whole tasks (`task_estimate`)."""
    summary: dict[str, Any] = {}
    for metric in METRICS:
        values = np.array([row.get(metric, np.nan) for row in per_episode], float)
        defined = np.isfinite(values)
        statistic = "median" if metric == "cosine" else "mean"
        if not defined.any():
            estimate = {"estimate": None, "ci_low": None, "ci_high": None}
        elif tasks is not None:
            estimate = task_estimate(values[defined], np.asarray(tasks)[defined], statistic)
        else:
            estimate = aggregate_estimates(values[defined])[statistic]
        summary[metric] = {**estimate, "statistic": statistic, "n_defined": int(defined.sum())}
    return summary


def task_estimate(values: np.ndarray, tasks: np.ndarray, statistic: str) -> dict[str, float | None]:
    """The mean or median over episodes with a percentile bootstrap 95% CI that resamples whole tasks with
    replacement (the cluster bootstrap): rollouts of one task share its request or outcome, so they are not
    independent and resampling episodes would understate the CI. Resamples and seed as algorithms/experiment/stats.py."""
    groups = [values[tasks == task] for task in np.unique(tasks)]
    point = float(np.median(values) if statistic == "median" else np.mean(values))
    if len(groups) < 2:
        return {"estimate": point, "ci_low": None, "ci_high": None}
    draws = np.random.default_rng(BOOTSTRAP_SEED).integers(len(groups), size=(N_RESAMPLES, len(groups)))
    if statistic == "median":
        resampled = [np.median(np.concatenate([groups[i] for i in row])) for row in draws]
    else:  # the mean of the pooled episodes, from each task's sum and count
        sums, counts = np.array([g.sum() for g in groups]), np.array([len(g) for g in groups])
        resampled = sums[draws].sum(axis=1) / counts[draws].sum(axis=1)
    low, high = np.percentile(resampled, [100 * (1 - CONFIDENCE) / 2, 100 * (1 + CONFIDENCE) / 2])
    return {"estimate": point, "ci_low": float(low), "ci_high": float(high)}


def rule_misfit(name: str, env: gym.Env, fit: Branching) -> str | None:
    """Why rule `name` (a registered rule, or one of SET_RULES on a set action) cannot score episodes of `env`
    (one line), or None."""
    if name in SET_RULES:
        if fit.kind != SLOTS or "coalition_values" not in fit.info_provides:
            return "needs a set action whose env reports info['coalition_values'] (the snapshot's values of its subsets)"
        return None
    try:
        missing = unmet_rule_needs(rule_class(name), fit.batch_provides, fit.info_provides)  # before from_env's checks
    except RuleLookupError as exc:
        return str(exc)
    if not missing:
        try:
            rule = make_rule(name, env=env, **RULE_KWARGS.get(name, {}))
        except (TypeError, ValueError) as exc:
            return " ".join(str(exc).split())  # one line, whatever the space's repr holds
        missing = unmet_rule_needs(rule, fit.batch_provides, fit.info_provides)
    if not missing:
        return None
    return (
        f"needs {', '.join(missing)}, which these episodes do not give (their batch has: rewards, mask, "
        f"{', '.join(sorted(fit.batch_provides))}; the env reports: {', '.join(sorted(fit.info_provides)) or 'no info keys'})"
    )


def rule_credit(
    name: str, env: gym.Env, training: list[Played], batch_episodes: int, scored: list[Played], provides: frozenset[str]
) -> np.ndarray:
    """(B, T) a fresh rule's credit on the scored episodes after it has learned from the training episodes; a set
    rule's (SET_RULES, stateless) from each episode's coalition values."""
    if name in SET_RULES:
        return np.array([set_credit(SET_RULES[name], e.infos[-1]["coalition_values"]) for e in scored])
    rule = make_rule(name, env=env, **RULE_KWARGS.get(name, {}))
    for start in range(0, len(training) - batch_episodes + 1, batch_episodes):
        assign_credit(rule, episode_batch(training[start : start + batch_episodes], provides))
    return credit_of(rule, episode_batch(scored, provides))


def run_seed(
    env: gym.Env, policy: BehaviourPolicy, args: argparse.Namespace, seed: int, rules: list[str], fit: Branching
) -> dict[str, Any]:
    """One seed: training episodes, scored episodes with their reference, and every rule's per-episode scores."""
    root = np.random.SeedSequence([args.seed, seed])
    train_seeds, score_seeds = root.spawn(2)
    rng = np.random.default_rng(train_seeds)
    reset_base = (args.seed * 1_000 + seed) * 1_000_003  # env seeds apart per (run seed, seed)
    slots, size = fit.kind == SLOTS, fit.group_size  # rollouts of one task (reset seed) share it
    training = [
        (
            play_slots(env, policy, reset_base + i // size, rng)
            if slots
            else play(env, policy, reset_base + i // size, rng, keep_states=False)
        )["played"]
        for i in range(args.train_episodes)
    ]
    started = time.perf_counter()
    first = reset_base + args.train_episodes
    replayed = [
        replay_slots(env, policy, first + i // size, np.random.default_rng(s))
        if slots
        else replay_episode(env, policy, first + i // size, s, args.k, not args.independent_branches, args.decision_step)
        for i, s in enumerate(score_seeds.spawn(fit.episodes))
    ]
    reference_seconds = time.perf_counter() - started
    for i, played in [*enumerate(training), *enumerate(e.played for e in replayed)]:
        played.task = i // size if size > 1 else None
    scored = [episode.played for episode in replayed]
    result: dict[str, Any] = {"reference_seconds": reference_seconds, "episodes": replayed, "rules": {}}
    for name in rules:
        started = time.perf_counter()
        credit = rule_credit(name, env, training, args.batch_episodes, scored, fit.batch_provides)
        pairs = [(c[: len(e.credit)], e) for c, e in zip(credit, replayed)]
        result["rules"][name] = {
            "scores": [
                set_scores(c, e.credit, False) if slots else episode_scores(c, e.credit, e.decision_step) for c, e in pairs
            ],
            "seconds": time.perf_counter() - started,
        }
        if slots:
            result["rules"][name]["centred"] = [set_scores(c, e.credit, True) for c, e in pairs]
    return result


def reference_summary(episodes: list[ReplayedEpisode]) -> dict[str, Any]:
    """The reference's own leakage and precision: does its credit sit on the decision, and how noisy is it."""
    decided = [e for e in episodes if e.decision_step is not None]
    shares = [episode_scores(e.credit, e.credit, e.decision_step) for e in decided]
    at_decision = [e.credit[e.decision_step] / e.credit_se[e.decision_step] for e in decided if e.credit_se[e.decision_step] > 0]
    return {
        "leakage": summarise(shares)["leakage"] if shares else None,
        "mean_credit_se": float(np.mean(np.concatenate([e.credit_se for e in episodes]))),
        "mean_abs_z_at_decision": float(np.mean(np.abs(at_decision))) if at_decision else None,
        "steps": int(sum(len(e.credit) for e in episodes)),
        "share_nonzero": float(np.mean(np.abs(np.concatenate([e.credit for e in episodes])) > ZERO)),
    }
