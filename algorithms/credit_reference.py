"""Replay-defined credit, the reference (issue 34, item 2; docs/papers/replay_credit.md).

    python -m algorithms.credit_reference [--env WatchRepair-v0,umbrella_length/9] [--policy uniform|scripted]
        [--rules broadcast,loo,...] [--seeds 3] [--episodes auto] [--train-episodes 512] [--batch-episodes 64]
        [--k 64] [--group-size auto] [--decision-step auto] [--independent-branches] [--seed 0]
        [--env-kwargs YAML]
        [--out benchmarks/results/credit_reference_{env}.json]

For each seed, episodes of a behaviour policy pi are played; before every step t the env is snapshotted
(envs/snapshot.py). From each snapshot s_t, for every alternative a of the turn, K continuations
are restored with a fresh outcome seed each (`restore(env, state, outcome_seed)`), take a first, then follow pi to
the episode's end. Their returns from t (the undiscounted sum of the rewards of steps t, t + 1, ... up to the
episode's termination or truncation) estimate

    Q(s_t, a) = mean_k G_k(a),   V(s_t) = sum_a pi(a | s_t) Q(s_t, a),   reference credit_t = Q(s_t, a_t) - V(s_t)

for the action a_t the episode took. Standard errors come from the per-continuation contrasts
d_k = G_k(a_t) - sum_a pi(a | s_t) G_k(a) (SE = std(d_k, ddof=1) / sqrt(K)), which are i.i.d. over k whether or
not the branches share random numbers. By default continuation k of every action shares its outcome seed and the
policy's random stream (common random numbers): where an action changes nothing (WatchRepair after its first step)
every branch replays the same future and the reference is exactly 0 rather than noise; `--independent-branches`
gives each (a, k) its own seeds.

A turn's alternatives: every action of a Discrete space; for an env whose action space does not enumerate them (a
Text space) the finite actions the env lists itself, `env.unwrapped.turn_alternatives()` (vcbm_gym/contract.py:
TextWatchWorkshop's station tools, "repair()" / "skip()" at the movement, "standard()" / "premium()" elsewhere; any
other answer is invalid and never taken). The decision step is the env's `is_decision_turn`.

A one-step set action (MultiDiscrete([P] * m), SetRetrieval) is scored per slot: its m slots are the "steps". With
a the submitted set and v the env's exact expected value of a set (info['set_value']; the reward is the imperfect
snapshot evaluator's, which the rules see), the reference credit of slot i is the replay-defined counterfactual

    credit_i = v(a) - sum_b pi(b) v(a with slot i := b)   over every pool item b (pi: each slot uniform over the pool)

each v(a with slot i := b) from `restore(state)` of the snapshot taken after reset and one step. The evaluation is
deterministic (no outcome noise to redraw, one evaluation per alternative), so K continuations are not needed and
the standard error is 0; there is no decision step, hence no leakage.

Every credit rule whose batch needs the episodes meet is built per seed with `make_rule`, fed `--train-episodes`
episodes of pi in batches of `--batch-episodes` in the arms' call order (`assign_credit`: credit, then observe),
and then gives its per-step credit (`credit_of`) on the scored episodes, which it never observed, as one batch.
What a batch holds (`Branching`):
for a Discrete env observations, actions and groups; for a text env groups, the observation texts (GiGPO's anchor
keys) and the final text, no observations or actions; for a set action groups, one step per slot with the reward on
the last, and CASI's coalition values; plus, per turn, the info keys the env reports on every step (state_mutating
-> turn_flags, execution_output -> turn_texts: VCBM-blend's bookmarks, as the LLM arm builds them) and at the end
(coalition_values). A rule that needs more is listed as refused with one line. Groups (loo, grpo, vcbm_blend's LOO,
CASI's base): `--group-size auto` plays 8 rollouts per task (reset seed) on text and set envs, the LLM arm's K;
on Discrete envs each episode is its own task and groups are episodes with the same initial observation. On a set
action the coalition rules of vcbm_gym/credit/set_credit.py (set_shapley, CASI's credit before shaping;
set_singleton, set_banzhaf, set_loo, set_broadcast) are scored too, from the snapshot's coalition values over the
slots, as algorithms/credit_fidelity.py computes them. Each scored episode's credit
vector over its steps is compared with the reference vector by CASI's `fidelity_metrics` (sign agreement over all
steps and over the steps with non-zero reference, Spearman, whether the rule's top step is a reference top step,
cosine; uncentred: a step's credit is relative to the policy's average at that step, not to the episode's other
steps) and, where the env declares its decision step, by leakage (the episode's share of |credit| after it,
credit_leakage's measure). The table gives the mean over scored episodes (pooled over seeds) and, for cosine, the
median (CASI's primary metric), each with a 95% percentile bootstrap CI (algorithms/experiment/stats.py). On a
set action a second table centres credit and reference within each set (CASI's fidelity protocol).

Policies: `uniform` (pi(a) = 1 / n over the turn's alternatives), `scripted` (the env's optimal decision with
probability 1, else uniform: on a Discrete env the first action named by its reset info `optimal_first_action`,
which WatchRepair offers and the bsuite adapter does not; on a text env the alternative its `optimal_alternative()`
names, TextWatchWorkshop's movement call; a set action names none and is refused). The tabular arm has no
checkpoint loader, so a trained policy is not offered.

Budget: a default run (WatchRepair-v0 and umbrella_length/9; 3 seeds x 32 scored episodes, K = 64, 512 training
episodes per seed, every rule that fits) is sized to about 4 minutes on one core, from measured costs: the reference
takes 0.026 s per scored episode and continuation on WatchRepair (50 steps x 2 actions) and 0.0075 s on
umbrella_length/9, i.e. ~160 s and ~46 s; the rules' training on 512 episodes takes ~1 s per seed (RUDDER's LSTM
starts after 256 of them). Cost grows linearly in seeds x episodes x K. K buys precision at the decision, episodes
buy the CI over episodes: at K = 64 the WatchRepair first decision's SE is ~0.7 (sd ~5.5 per contrast) against true
credits of +-0.75 (brands 0, 3) and +-1.75 (brands 1, 2) under the uniform policy.

Budget on the other envs, measured on tiny runs before any result was read (one core, shared): TextWatchWorkshop-v0
takes 0.0030 s per scored episode and continuation (8 turns x 2 alternatives); SetRetrieval-v0 0.006 s per scored
set (m x P = 50 evaluations). With groups of 8 rollouts per task the unit of the CIs is the task (the cluster
bootstrap, `task_estimate`), so `--episodes auto` buys tasks: 128 episodes per seed on a text env (16 tasks; 3 x 128
x 64 continuations ~ 75 s of reference, ~1.5 min in all; a first run at 32 episodes, 4 tasks per seed, gave CIs over
episodes that ignored the shared outcome of a task's rollouts, and was replaced before its numbers were used) and
256 sets per seed on a set action (32 requests; ~1 min in all, most of it the 512 training sets per seed). Both
stay inside 5 minutes; raise --k (workshop) or --episodes for tighter estimates.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import yaml

import vcbm_gym  # noqa: F401  (registers the envs)
from algorithms.common import cli, provenance
from algorithms.common.credit_slot import assign_credit, credit_of
from algorithms.common.errors import VcbmGymError
from algorithms.credit_fidelity import fidelity_metrics
from algorithms.experiment.stats import BOOTSTRAP_SEED, CONFIDENCE, N_RESAMPLES, aggregate_estimates, bootstrap_description
from algorithms.sb3.callbacks import group_ids_for
from envs.snapshot import restore, snapshot, snapshot_problem
from vcbm_gym.credit.base import EpisodeBatch, unmet_rule_needs
from vcbm_gym.credit.registry import HOW_TO_REGISTER, RuleLookupError, is_rule, make_rule, rule_class, rule_names
from vcbm_gym.credit.set_credit import set_credit

PROG = "python -m algorithms.credit_reference"
DEFAULT_ENVS = ("WatchRepair-v0", "umbrella_length/9")
DEFAULT_OUT = str(Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "credit_reference_{env}.json")
POLICIES = ("uniform", "scripted")
# Constructor arguments per rule: baselines that need no critic (there is none here); shared with credit_leakage.
RULE_KWARGS: dict[str, dict[str, Any]] = {"broadcast": {"baseline": "batch_mean"}, "vcbm_bookmark": {"baseline": "batch_mean"}}
BATCH_PROVIDES = frozenset({"observations", "actions", "group_ids", "step_turn"})  # what `episode_batch` fills
# What a batch of text episodes (an env that lists its turns' alternatives) or of a set action's slots always has;
# per-turn info keys the env reports add to either (`Branching`)
TEXT_BATCH_PROVIDES = frozenset({"group_ids", "step_turn", "final_texts", "extras['anchor_keys']"})
SLOT_BATCH_PROVIDES = frozenset({"group_ids", "step_turn"})
# info key -> the batch field it fills: per turn (every step reports it) or from the episode's last step
TURN_INFO_FIELDS = {"state_mutating": "turn_flags['state_mutating']", "execution_output": "turn_texts"}
END_INFO_FIELDS = {"coalition_values": "extras['coalition_values']"}
# The coalition rules of vcbm_gym/credit/set_credit.py, scored per slot on a set action (set_shapley is CASI's credit)
SET_RULES = {f"set_{name}": name for name in ("shapley", "singleton", "banzhaf", "loo", "broadcast")}
METRICS = ("sign_all", "sign_nz", "spearman", "top_action", "cosine", "leakage")
ZERO = 1e-12
# --group-size auto on text and set envs: the LLM arm's rollouts per task (algorithms/llm/config.py, num_generations)
AUTO_GROUP_SIZE = 8
AUTO_EPISODES = {"actions": 32, "alternatives": 128, "slots": 256}  # --episodes auto, per seed (module docstring: budget)
ACTIONS, ALTERNATIVES, SLOTS = "actions", "alternatives", "slots"  # how the reference branches (`Branching`)

Episode = tuple[np.ndarray, np.ndarray, np.ndarray]  # (observations, actions, rewards) of one episode


@dataclass
class Played:
    """One episode as the rules see it: per step the observation it answered, the env action, the reward and the
    step's info; the observation after the last step. A set action's episode has one step per slot (`play_slots`)."""

    observations: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    infos: list[dict[str, Any]] = field(default_factory=list)
    final_observation: Any = None
    task: int | None = None  # the episode's group of rollouts of one task (--group-size), None: its initial observation

    def as_episode(self) -> Episode:
        return self.observations, self.actions, self.rewards


@dataclass(frozen=True)
class Branching:
    """How the reference branches over an env (`kind`: every action of a Discrete space, the alternatives the env
    lists per turn, or every pool item per slot of a one-step set action) and what its episodes give a rule: batch
    fields (CreditRule.batch_needs' terms) and the info keys the env reports (CreditRule.info_needs')."""

    kind: str
    batch_provides: frozenset[str]
    info_provides: frozenset[str]
    episodes: int = 32  # scored episodes per seed (--episodes)
    group_size: int = 1  # rollouts per task (--group-size); 1: every episode its own task, grouped by initial observation


def episode_batch(episodes: list[Episode | Played], provides: frozenset[str] = BATCH_PROVIDES) -> EpisodeBatch:
    """Pad episodes to a prefix-masked batch with the fields in `provides`; padding repeats each episode's last
    observation and action (valid in any space). Groups: episodes with the same first observation (credit_group_by:
    initial_obs), or of one task where each has one (--group-size). Per-turn info keys fill turn flags and texts,
    the last step's coalition values CASI's extras."""
    played = [e if isinstance(e, Played) else Played(*e) for e in episodes]
    horizon = max(len(e.rewards) for e in played)
    mask = np.array([[t < len(e.rewards) for t in range(horizon)] for e in played])

    def pad(values: np.ndarray) -> np.ndarray:
        return np.concatenate([values, np.repeat(values[-1:], horizon - len(values), axis=0)])

    rewards = np.stack([np.concatenate([e.rewards, np.zeros(horizon - len(e.rewards))]) for e in played])
    fields: dict[str, Any] = {"turn_flags": {}, "extras": {}}
    if "observations" in provides:
        fields["observations"] = np.stack([pad(e.observations) for e in played])
        fields["actions"] = np.stack([pad(e.actions) for e in played])
    if TURN_INFO_FIELDS["state_mutating"] in provides:
        fields["turn_flags"]["state_mutating"] = [np.array([bool(i["state_mutating"]) for i in e.infos]) for e in played]
    if TURN_INFO_FIELDS["execution_output"] in provides:
        fields["turn_texts"] = [[str(i["execution_output"]) for i in e.infos] for e in played]
    if "final_texts" in provides:
        fields["final_texts"] = [str(e.final_observation) for e in played]
    if "extras['anchor_keys']" in provides:  # GiGPO's anchor: the observation the turn answers (the LLM arm's key)
        fields["extras"]["anchor_keys"] = [[str(o) for o in e.observations] for e in played]
    if END_INFO_FIELDS["coalition_values"] in provides:
        fields["extras"]["coalition_values"] = [np.asarray(e.infos[-1]["coalition_values"], float) for e in played]
    if all(e.task is not None for e in played):
        groups = np.unique([e.task for e in played], return_inverse=True)[1].astype(np.int64)
    else:
        groups = group_ids_for(np.stack([e.observations[0] for e in played]), "initial_obs")
    return EpisodeBatch(rewards, mask, groups, **fields)


def leakage_sums(credit: np.ndarray, decision_step: int) -> tuple[float, float]:
    """(sum of |credit| after `decision_step`, sum of |credit|) over the last axis (steps) and any others."""
    magnitude = np.abs(np.asarray(credit, float))
    return float(magnitude[..., decision_step + 1 :].sum()), float(magnitude.sum())


@dataclass(frozen=True)
class Turn:
    """A step's alternatives (the env actions the reference branches over) and the index of the one the env names
    optimal there (the scripted policy's choice), or None."""

    alternatives: tuple[Any, ...]
    optimal: int | None = None


def current_turn(env: gym.Env, t: int, reset_info: dict[str, Any]) -> Turn:
    """Step t's alternatives as the env stands: every action of a Discrete space (the optimal one at t = 0 from the
    reset info's `optimal_first_action`), else the env's own `turn_alternatives()` and `optimal_alternative()`
    (vcbm_gym/contract.py)."""
    space = env.action_space
    if isinstance(space, gym.spaces.Discrete):
        optimal = reset_info.get("optimal_first_action") if t == 0 else None
        return Turn(tuple(range(int(space.n))), None if optimal is None else int(optimal))
    base = env.unwrapped
    alternatives = tuple(base.turn_alternatives())
    best = base.optimal_alternative() if hasattr(base, "optimal_alternative") else None
    return Turn(alternatives, None if best is None else alternatives.index(best))


@dataclass(frozen=True)
class BehaviourPolicy:
    """pi over a turn's alternatives: uniform, or `scripted` (the env's optimal alternative where it names one with
    probability 1, else uniform)."""

    name: str

    def probabilities(self, turn: Turn) -> np.ndarray:
        n = len(turn.alternatives)
        if self.name == "scripted" and turn.optimal is not None:
            return np.eye(n)[turn.optimal]
        return np.full(n, 1.0 / n)

    def sample(self, turn: Turn, rng: np.random.Generator) -> int:
        """The index of an alternative."""
        cumulative = np.cumsum(self.probabilities(turn))
        # side="right" never picks an action of probability 0; the clip guards cumsum's rounding below 1
        return int(min(np.searchsorted(cumulative, rng.random() * cumulative[-1], side="right"), len(cumulative) - 1))


def finish_return(
    env: gym.Env, policy: BehaviourPolicy, t: int, turn: Turn, choice: int, reset_info: dict, rng: np.random.Generator
) -> float:
    """The undiscounted return from step t of the env as it stands: alternative `choice` of `turn` first, then pi to
    the episode's end."""
    total = 0.0
    while True:
        _, reward, terminated, truncated, _ = env.step(turn.alternatives[choice])
        total += float(reward)
        if terminated or truncated:
            return total
        t += 1
        turn = current_turn(env, t, reset_info)
        choice = policy.sample(turn, rng)


def replay_returns(
    env: gym.Env,
    state: Any,
    policy: BehaviourPolicy,
    t: int,
    turn: Turn,
    reset_info: dict[str, Any],
    k: int,
    seeds: np.random.SeedSequence,
    common: bool = True,
) -> np.ndarray:
    """(n alternatives, k) returns from step t of continuations restored from `state` with a forced first action.
    `common`: continuation j of every alternative shares its outcome seed and policy stream (module docstring)."""
    n = len(turn.alternatives)
    draws = seeds.generate_state(2 * k * (1 if common else n), dtype=np.uint32).reshape(-1, k, 2)
    returns = np.empty((n, k))
    for choice in range(n):
        outcome_seeds, policy_seeds = draws[0 if common else choice].T
        for j in range(k):
            restore(env, state, outcome_seed=int(outcome_seeds[j]))
            rng = np.random.default_rng(int(policy_seeds[j]))
            returns[choice, j] = finish_return(env, policy, t, turn, choice, reset_info, rng)
    return returns


def replay_estimates(returns: np.ndarray, probabilities: np.ndarray) -> dict[str, np.ndarray | float]:
    """Q(s, a), V(s) and the credit Q(s, a) - V(s) of every action, with standard errors, from (n, K) returns."""
    k = returns.shape[1]
    values = probabilities @ returns  # (K,): per continuation, V's contrast partner
    contrasts = returns - values[None, :]  # d_k(a) = G_k(a) - sum_b pi(b) G_k(b)
    q = returns.mean(axis=1)
    return {
        "q": q,
        "q_se": returns.std(axis=1, ddof=1) / np.sqrt(k),
        "v": float(probabilities @ q),
        "v_se": float(values.std(ddof=1) / np.sqrt(k)),
        "credit": q - probabilities @ q,
        "credit_se": contrasts.std(axis=1, ddof=1) / np.sqrt(k),
    }


@dataclass
class ReplayedEpisode:
    """One scored episode: what a rule sees (`played`) and the reference at each step (slot, for a set action)."""

    played: Played
    taken: np.ndarray  # (T,) index of the alternative taken at each step
    credit: np.ndarray  # (T,) Q(s_t, a_t) - V(s_t)
    credit_se: np.ndarray
    q: list[np.ndarray]  # per step, Q of each alternative
    v: np.ndarray  # (T,)
    decision_step: int | None

    @property
    def actions(self) -> np.ndarray:
        return self.played.actions

    def as_episode(self) -> Played:
        return self.played


def play(env: gym.Env, policy: BehaviourPolicy, reset_seed: int, rng: np.random.Generator, keep_states: bool) -> dict[str, Any]:
    """One episode of pi: the episode, its reset info, each step's turn and (optionally) a snapshot taken before
    every step."""
    obs, reset_info = env.reset(seed=reset_seed)
    observations, actions, taken, rewards, infos, turns, states, done = [], [], [], [], [], [], [], False
    while not done:
        if keep_states:
            states.append(snapshot(env))
        turn = current_turn(env, len(actions), reset_info)
        choice = policy.sample(turn, rng)
        observations.append(np.asarray(obs))
        actions.append(turn.alternatives[choice])
        taken.append(choice)
        turns.append(turn)
        obs, reward, terminated, truncated, info = env.step(turn.alternatives[choice])
        rewards.append(float(reward))
        infos.append(info)
        done = terminated or truncated
    played = Played(np.stack(observations), np.asarray(actions), np.asarray(rewards), infos, obs)
    return {"played": played, "taken": np.asarray(taken), "reset_info": reset_info, "turns": turns, "states": states}


def declared_decision_step(infos: list[dict[str, Any]]) -> int | None:
    """The step the env says decides the return: the first flagged `is_decision_turn`, else step 0 where the env
    reports `first_decision_optimal` (the first action decides), else None."""
    for t, info in enumerate(infos):
        if info.get("is_decision_turn"):
            return t
    return 0 if "first_decision_optimal" in infos[-1] else None


def replay_episode(
    env: gym.Env, policy: BehaviourPolicy, reset_seed: int, seeds: np.random.SeedSequence, k: int, common: bool, decision: Any
) -> ReplayedEpisode:
    """Play one episode of pi and estimate the reference credit at every one of its steps."""
    play_seed, branch_seed = seeds.spawn(2)
    episode = play(env, policy, reset_seed, np.random.default_rng(play_seed), keep_states=True)
    rows, step_seeds = [], branch_seed.spawn(len(episode["taken"]))
    for t, (state, turn, step_seed) in enumerate(zip(episode["states"], episode["turns"], step_seeds)):
        returns = replay_returns(env, state, policy, t, turn, episode["reset_info"], k, step_seed, common)
        rows.append(replay_estimates(returns, policy.probabilities(turn)))
    decision_step = declared_decision_step(episode["played"].infos) if decision == "auto" else decision
    return replayed(episode["played"], episode["taken"], rows, decision_step)


def replayed(played: Played, taken: np.ndarray, rows: list[dict[str, Any]], decision_step: int | None) -> ReplayedEpisode:
    """The reference of one episode from its per-step estimates (`replay_estimates`' keys)."""
    return ReplayedEpisode(
        played,
        taken,
        credit=np.array([row["credit"][a] for row, a in zip(rows, taken)]),
        credit_se=np.array([row["credit_se"][a] for row, a in zip(rows, taken)]),
        q=[row["q"] for row in rows],
        v=np.array([row["v"] for row in rows]),
        decision_step=decision_step,
    )


def slot_turns(env: gym.Env) -> list[Turn]:
    """A set action's slots as turns: every pool item at each slot of the MultiDiscrete space."""
    return [Turn(tuple(range(int(n)))) for n in np.asarray(env.action_space.nvec).ravel()]


def play_slots(env: gym.Env, policy: BehaviourPolicy, reset_seed: int, rng: np.random.Generator) -> dict[str, Any]:
    """One episode of a one-step set action, pi drawing each slot independently, as m slot steps: each answers the
    request's observation, takes its item; the set's reward and info sit on the last slot (where the LLM arm puts
    an episode's return), earlier slots get reward 0 and no info."""
    obs, _ = env.reset(seed=reset_seed)
    state = snapshot(env)
    turns = slot_turns(env)
    taken = np.array([policy.sample(turn, rng) for turn in turns])
    final, reward, terminated, truncated, info = env.step(taken.copy())
    if not (terminated or truncated):
        raise VcbmGymError(f"env {env.spec.id if env.spec else env}: a set action's episode must end after its one step")
    m = len(turns)
    rewards = np.zeros(m)
    rewards[-1] = float(reward)
    played = Played(np.stack([np.asarray(obs)] * m), taken.copy(), rewards, [{}] * (m - 1) + [info], final)
    return {"played": played, "taken": taken, "turns": turns, "state": state, "value": float(info["set_value"])}


def replay_slots(env: gym.Env, policy: BehaviourPolicy, reset_seed: int, rng: np.random.Generator) -> ReplayedEpisode:
    """Replay-defined counterfactual credit of each slot i of a one-step set action a (module docstring):
    Q_i(b) = v(a with slot i := b) for every pool item b, each from `restore(state)` and one step (the env's exact
    expected value, info['set_value'], is deterministic: no outcome seed, one evaluation), V_i = E_{b ~ pi} Q_i(b),
    credit_i = v(a) - V_i; standard error 0."""
    episode = play_slots(env, policy, reset_seed, rng)
    taken, rows = episode["taken"], []
    for i, turn in enumerate(episode["turns"]):
        q = np.empty(len(turn.alternatives))
        for b in range(len(q)):
            restore(env, episode["state"])
            changed = taken.copy()
            changed[i] = turn.alternatives[b]
            q[b] = float(env.step(changed)[4]["set_value"])
        probabilities = policy.probabilities(turn)
        rows.append({"q": q, "v": float(probabilities @ q), "credit": q - probabilities @ q, "credit_se": np.zeros(len(q))})
    return replayed(episode["played"], taken, rows, None)


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


TABLE_HEAD = [
    "| Rule | Sign all | Sign nz | Spearman | Top step | Median cosine | Leakage | Seconds per seed |",
    "| --- | --- | --- | --- | --- | --- | --- | --- |",
]


def markdown_table(result: dict[str, Any]) -> str:
    """One row per rule: fidelity to the replay reference and leakage, estimates with 95% bootstrap CIs (on a set
    action a second table: both centred within the set)."""
    s = result["settings"]
    groups = f", loo/grpo groups of {s['group_size']} rollouts per task" if s.get("group_size", 1) > 1 else ""
    if s.get("branching") == SLOTS:
        lines = [
            f"Replay-reference fidelity on {result['env']} per slot of the set action: behaviour policy {s['policy']} "
            f"(each slot uniform over the pool), {s['seeds']} seeds x {s['episodes']} scored sets{groups}; reference credit of "
            "slot i = v(a) - E_b v(a with slot i := b) over every pool item b, v the env's exact expected value "
            "(deterministic: one evaluation per alternative, no continuations); rules' credit from the snapshot "
            "evaluator; mean over sets (cosine: median), 95% bootstrap CI.",
            f"Share of slots with non-zero reference credit: {result['reference']['share_nonzero']:.3f}. "
            "Uncentred (as defined); the second table centres credit and reference within each set (CASI's protocol).",
        ]
    else:
        leak = result["reference"]["leakage"]
        per = "action" if s.get("branching", ACTIONS) == ACTIONS else "alternative"
        lines = [
            f"Replay-reference fidelity on {result['env']}: behaviour policy {s['policy']}, {s['seeds']} seeds x "
            f"{s['episodes']} scored episodes, K = {s['k']} continuations per {per} and step "
            f"({'common random numbers' if s['common_random_numbers'] else 'independent branches'}), rules trained on "
            f"{s['train_episodes']} episodes per seed{groups}; mean over episodes (cosine: median), 95% bootstrap CI.",
            f"The reference's mean standard error per step: {result['reference']['mean_credit_se']:.3g}; its own leakage: "
            + ("n/a (no decision step)" if not leak or leak["estimate"] is None else f"{leak['estimate']:.3f}")
            + _decision_precision(result["reference"].get("mean_abs_z_at_decision"))
            + ".",
        ]
    lines += ["", *TABLE_HEAD, *table_rows(result["rules"], "summary")]
    if s.get("branching") == SLOTS:
        lines += ["", "Centred within the set:", "", *TABLE_HEAD, *table_rows(result["rules"], "summary_centred")]
    return "\n".join(lines)


def _decision_precision(mean_abs_z: float | None) -> str:
    """How far the reference's credit at the decision stands from 0 in its own standard errors (none where every
    decision's SE is 0: then the reference is exact there)."""
    return "" if mean_abs_z is None else f"; its mean |credit / SE| at the decision: {mean_abs_z:.2f}"


def table_rows(rules: dict[str, Any], summary: str) -> list[str]:
    lines = []
    for name, row in rules.items():
        if "refused" in row:
            lines.append(f"| `{name}` | refused: {row['refused'].replace('|', '/')} | | | | | | |")  # no cell break
            continue
        cells = [_cell(row[summary][metric]) for metric in METRICS]
        lines.append(f"| `{name}` | " + " | ".join(cells) + f" | {row['seconds_per_seed']:.1f} |")
    return lines


def _cell(estimate: dict[str, Any]) -> str:
    if estimate["estimate"] is None:
        return "n/a"
    if estimate["ci_low"] is None:
        return f"{estimate['estimate']:.3f}"
    return f"{estimate['estimate']:.3f} [{estimate['ci_low']:.3f}, {estimate['ci_high']:.3f}]"


def env_slug(env_id: str) -> str:
    """A file-name form of an env id (umbrella_length/9 -> umbrella_length_9)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", env_id).strip("_")


def branching_kind(env: gym.Env) -> str | None:
    """How the reference branches over `env` (`Branching`), or None: no finite alternatives."""
    space = env.action_space
    if isinstance(space, gym.spaces.Discrete):
        return ACTIONS
    if hasattr(env.unwrapped, "turn_alternatives"):
        return ALTERNATIVES
    if isinstance(space, gym.spaces.MultiDiscrete) and np.asarray(space.nvec).ndim == 1:
        return SLOTS
    return None


def space_text(space: gym.Space) -> str:
    """A space on one line (a Text space's charset holds whitespace)."""
    return f"Text(max_length={space.max_length})" if isinstance(space, gym.spaces.Text) else " ".join(str(space).split())


def make_env(env_id: str, env_kwargs: dict[str, Any] | None = None) -> gym.Env | None:
    """The env (`gym.make(env_id, **env_kwargs)`), or None (with one line) where an optional package it needs is
    missing; one line for an env that cannot be branched over."""
    try:
        env = gym.make(env_id, **(env_kwargs or {}))
    except ModuleNotFoundError as exc:  # the bsuite adapter without bsuite: not this command's failure
        print(f"skip: env {env_id!r} needs a package that is not installed ({exc})", file=sys.stderr)
        return None
    except Exception as exc:  # noqa: BLE001  (gym.make's errors have no common class)
        raise VcbmGymError(f"--env {env_id!r}: cannot be made ({type(exc).__name__}: {exc})") from None
    if branching_kind(env) is None:
        raise VcbmGymError(
            f"--env {env_id!r}: action space {space_text(env.action_space)} has no finite alternatives to branch over: expected "
            "Discrete, an env that lists its turns' alternatives (turn_alternatives(), vcbm_gym/contract.py) or a "
            "one-step MultiDiscrete set action"
        )
    if isinstance(env.action_space, gym.spaces.Discrete) and int(env.action_space.start) != 0:
        raise VcbmGymError(f"--env {env_id!r}: action space {env.action_space} does not start at 0")  # rules read 0..n-1
    problem = snapshot_problem(env)
    if problem is not None:
        raise VcbmGymError(f"--env {env_id!r}: cannot be replayed: {problem}")
    return env


def probe_branching(env: gym.Env, env_id: str) -> Branching:
    """`env`'s Branching, from one episode of the uniform policy: the info keys it reports (per turn: on every step;
    a set action's: on its step), and the batch fields they fill."""
    kind = branching_kind(env)
    uniform, rng = BehaviourPolicy("uniform"), np.random.default_rng(0)
    if kind == SLOTS:
        infos = [play_slots(env, uniform, 0, rng)["played"].infos[-1]]
        if "set_value" not in infos[0]:
            raise VcbmGymError(
                f"--env {env_id!r}: a set action's reference needs info['set_value'] (the set's exact expected value), "
                "which the env does not report"
            )
    else:
        infos = play(env, uniform, 0, rng, keep_states=False)["played"].infos
    every, last = set.intersection(*(set(info) for info in infos)), set(infos[-1])
    provides = {ACTIONS: BATCH_PROVIDES, ALTERNATIVES: TEXT_BATCH_PROVIDES, SLOTS: SLOT_BATCH_PROVIDES}[kind]
    if kind != SLOTS:  # a slot is no turn of its own
        provides |= {fill for key, fill in TURN_INFO_FIELDS.items() if key in every}
    provides |= {fill for key, fill in END_INFO_FIELDS.items() if key in last}
    return Branching(kind, frozenset(provides), frozenset(every | last))


def check_setting(env: gym.Env, env_id: str, args: argparse.Namespace) -> tuple[BehaviourPolicy, Branching]:
    """The behaviour policy and Branching for `env`; one line for a policy or option the env cannot take."""
    fit = probe_branching(env, env_id)
    if args.policy == "scripted":
        if fit.kind == ACTIONS and "optimal_first_action" not in env.reset(seed=0)[1]:
            raise VcbmGymError(
                f"--policy scripted: env {env_id!r} does not report optimal_first_action in its reset info; use --policy uniform"
            )
        if fit.kind == ALTERNATIVES and not hasattr(env.unwrapped, "optimal_alternative"):
            raise VcbmGymError(
                f"--policy scripted: env {env_id!r} names no optimal alternative (optimal_alternative(), "
                "vcbm_gym/contract.py); use --policy uniform"
            )
        if fit.kind == SLOTS:
            raise VcbmGymError(
                f"--policy scripted: env {env_id!r} is a set action that names no optimal set; use --policy uniform"
            )
    if fit.kind == SLOTS and args.decision_step != "auto":
        raise VcbmGymError(
            f"--decision-step {args.decision_step}: env {env_id!r} is scored per slot of one set action, which has no "
            "decision step; leave it at 'auto'"
        )
    if fit.kind == SLOTS and args.independent_branches:
        raise VcbmGymError(
            f"--independent-branches: env {env_id!r}'s set reference is exact (no continuations to share random numbers)"
        )
    size = args.group_size if args.group_size != "auto" else (1 if fit.kind == ACTIONS else AUTO_GROUP_SIZE)
    episodes = args.episodes if args.episodes != "auto" else AUTO_EPISODES[fit.kind]
    return BehaviourPolicy(args.policy), replace(fit, group_size=size, episodes=episodes)


def parse(argv: list[str]) -> argparse.Namespace:
    parser = cli.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default=",".join(DEFAULT_ENVS), help="comma-separated Gymnasium ids (Discrete actions)")
    parser.add_argument("--policy", default="uniform", choices=POLICIES, help="behaviour policy (module docstring)")
    parser.add_argument(
        "--rules", default=",".join(rule_names()), help="comma-separated credit rules; those that cannot score are listed"
    )
    parser.add_argument("--seeds", type=int, default=3, help="independent repeats: training and scored episodes, rules")
    parser.add_argument(
        "--episodes",
        default="auto",
        help=f"scored episodes per seed (the reference at every step); 'auto': {AUTO_EPISODES[ACTIONS]} on a Discrete env, "
        f"{AUTO_EPISODES[ALTERNATIVES]} on a text env, {AUTO_EPISODES[SLOTS]} sets on a set action (module docstring)",
    )
    parser.add_argument("--train-episodes", type=int, default=512, help="episodes each rule learns from first, per seed")
    parser.add_argument("--batch-episodes", type=int, default=64, help="episodes per training batch (a PPO rollout)")
    parser.add_argument("--k", type=int, default=64, help="continuations per action and step")
    parser.add_argument(
        "--group-size",
        default="auto",
        help="rollouts per task (reset seed) for loo/grpo-style groups; 'auto': 1 on Discrete envs (groups by initial "
        f"observation), {AUTO_GROUP_SIZE} on text and set envs (the LLM arm's rollouts per task)",
    )
    parser.add_argument("--decision-step", default="auto", help="'auto' (what the env declares) or a step index")
    parser.add_argument("--independent-branches", action="store_true", help="no common random numbers across actions")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--env-kwargs",
        default="{}",
        help="YAML mapping of keyword arguments for every env's gym.make, e.g. '{integer_observations: true}' "
        "(bsuite's integer view, the one the SB3 sweeps and vcbm_bookmark read)",
    )
    parser.add_argument("--out", default=DEFAULT_OUT, help="JSON file; {env} becomes the env id; a .md table beside it")
    args = parser.parse_args(argv)
    return check_args(args)


def check_args(args: argparse.Namespace) -> argparse.Namespace:
    """Every bad value is one line here, before any env runs or any file is written."""
    args.envs = [name.strip() for name in args.env.split(",") if name.strip()]
    if not args.envs:
        raise VcbmGymError(f"--env {args.env!r}: expected one or more comma-separated Gymnasium ids")
    rules = [name.strip() for name in args.rules.split(",") if name.strip()]
    unknown = [name for name in rules if not is_rule(name)]
    if not rules or unknown:
        raise VcbmGymError(
            f"--rules {args.rules!r}: unknown {unknown or 'empty'}; expected names from: {', '.join(rule_names())} "
            f"({HOW_TO_REGISTER})"
        )
    args.rules = rules
    try:
        env_kwargs = yaml.safe_load(args.env_kwargs)
    except yaml.YAMLError:
        env_kwargs = None
    if not isinstance(env_kwargs, dict) or not all(isinstance(key, str) for key in env_kwargs):
        raise VcbmGymError(f"--env-kwargs {args.env_kwargs!r}: expected a YAML mapping of keyword names to values")
    args.env_kwargs = env_kwargs
    cli.check_seed(args.seed)
    cli.check_int(args.seeds, "--seeds", 1, 1000)
    if args.episodes != "auto":
        try:
            args.episodes = cli.check_int(int(args.episodes), "--episodes", 2, 1_000_000)
        except ValueError:
            raise VcbmGymError(f"--episodes {args.episodes!r}: expected 'auto' or an integer >= 2") from None
    cli.check_int(args.k, "--k", 2, 1_000_000)  # two continuations at least: a standard error needs them
    cli.check_int(args.batch_episodes, "--batch-episodes", 1)
    cli.check_int(args.train_episodes, "--train-episodes", 0, 10_000_000)
    if args.group_size != "auto":
        try:
            args.group_size = cli.check_int(int(args.group_size), "--group-size", 1, 1_000_000)
        except ValueError:
            raise VcbmGymError(f"--group-size {args.group_size!r}: expected 'auto' or an integer >= 1") from None
    if args.decision_step != "auto":
        try:
            args.decision_step = cli.check_int(int(args.decision_step), "--decision-step", 0)
        except ValueError:
            raise VcbmGymError(f"--decision-step {args.decision_step!r}: expected 'auto' or an integer >= 0") from None
    if len(args.envs) > 1 and "{env}" not in args.out:
        raise VcbmGymError(f"--out {args.out!r}: with several envs it must contain {{env}} (each env writes its own file)")
    for env_id in args.envs:
        out = Path(args.out.replace("{env}", env_slug(env_id)))
        if out.is_dir() or out.suffix != ".json":
            raise VcbmGymError(f"--out {str(out)!r}: expected a .json file path")
        cli.check_output_dir(out.parent, "--out's folder")
    return args


def run_env(
    env_id: str,
    env: gym.Env,
    setting: tuple[BehaviourPolicy, Branching],
    args: argparse.Namespace,
    argv: list[str],
    started: provenance.Start,
) -> dict[str, Any]:
    """Every seed on one env, the summary per rule, and the env's JSON and markdown table (written atomically)."""
    policy, fit = setting
    names = [*args.rules, *(SET_RULES if fit.kind == SLOTS else ())]
    misfits = {name: rule_misfit(name, env, fit) for name in names}
    fitting = [name for name in names if misfits[name] is None]
    seeds = [run_seed(env, policy, args, seed, fitting, fit) for seed in range(args.seeds)]
    episodes = [episode for seed in seeds for episode in seed["episodes"]]
    # the bootstrap's unit: a task (seed, group) where rollouts of one task share it, else the episode
    tasks = (
        [i * 1_000_000 + e.played.task for i, seed in enumerate(seeds) for e in seed["episodes"]] if fit.group_size > 1 else None
    )
    shortest = min(len(e.credit) for e in episodes)
    if any(e.decision_step is not None and e.decision_step >= len(e.credit) for e in episodes):
        raise VcbmGymError(f"--decision-step {args.decision_step}: expected a step inside every episode (shortest: {shortest})")
    rules: dict[str, Any] = {}
    for name in names:
        if misfits[name] is not None:
            rules[name] = {"refused": misfits[name]}
            continue
        per_episode = [score for seed in seeds for score in seed["rules"][name]["scores"]]
        rules[name] = {
            "summary": summarise(per_episode, tasks),
            "per_episode": columns(per_episode),
            "seconds_per_seed": float(np.mean([seed["rules"][name]["seconds"] for seed in seeds])),
        }
        if fit.kind == SLOTS:
            centred = [score for seed in seeds for score in seed["rules"][name]["centred"]]
            rules[name]["summary_centred"] = summarise(centred, tasks)
    result = {
        "env": env_id,
        "settings": {
            "policy": args.policy,
            "env_kwargs": args.env_kwargs,
            "seeds": args.seeds,
            "seed": args.seed,
            "episodes": fit.episodes,
            "train_episodes": args.train_episodes,
            "batch_episodes": args.batch_episodes,
            "k": args.k if fit.kind != SLOTS else None,
            "common_random_numbers": not args.independent_branches,
            "decision_step": args.decision_step,
            "branching": fit.kind,
            "group_size": fit.group_size,
            "groups": "episodes with the same initial observation"
            if fit.group_size == 1
            else "rollouts of one task (reset seed)",
            "return": (
                "the set's exact expected value info['set_value'] (the reward is the snapshot evaluator's)"
                if fit.kind == SLOTS
                else "undiscounted sum of rewards from step t to the episode's end (termination or truncation)"
            ),
        },
        "batch_provides": sorted(fit.batch_provides),
        "info_provides": sorted(fit.info_provides),
        "rule_kwargs": {name: RULE_KWARGS.get(name, {}) for name in names},
        "reference": {
            **reference_summary(episodes),
            "seconds_per_seed": float(np.mean([seed["reference_seconds"] for seed in seeds])),
        },
        "reference_episodes": [reference_record(e, fit.kind) for e in episodes],
        "rules": rules,
        "bootstrap": {
            **bootstrap_description(),
            "unit": "the task: whole groups of rollouts of one task resampled (cluster bootstrap, task_estimate)"
            if tasks is not None
            else "the scored episode",
        },
    }
    result["table"] = markdown_table(result)
    result["run"] = provenance.run_record(PROG, argv, started)
    out = Path(args.out.replace("{env}", env_slug(env_id)))
    cli.output_dir(out.parent, "--out's folder")
    cli.atomic_write_json(out, _plain(result), indent=None)  # one line: per-episode numbers would be 3 MB indented
    cli.atomic_write_text(out.with_suffix(".md"), result["table"] + "\n")
    print(result["table"])
    return result


def reference_record(episode: ReplayedEpisode, kind: str) -> dict[str, Any]:
    """One scored episode's reference for the JSON; a set's without its standard errors (0: exact) and decision step
    (none)."""
    record = {"credit": episode.credit, "credit_se": episode.credit_se, "q": episode.q, "v": episode.v}
    record.update(actions=episode.actions, decision_step=episode.decision_step)
    if kind == SLOTS:
        del record["credit_se"], record["decision_step"]
    return record


def columns(rows: list[dict[str, float]]) -> dict[str, list[float]]:
    """Per-episode score rows as one list per metric (in the rows' order): the JSON names each metric once."""
    return {metric: [row.get(metric) for row in rows] for metric in dict.fromkeys(key for row in rows for key in row)}


def _plain(value: Any) -> Any:
    """numpy arrays and scalars as lists and Python numbers, for the JSON."""
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value


def run(argv: list[str]) -> list[dict[str, Any]]:
    args = parse(argv)
    started = provenance.start()
    envs = {env_id: make_env(env_id, args.env_kwargs) for env_id in args.envs}  # every env checked before any runs
    settings = {env_id: check_setting(env, env_id, args) for env_id, env in envs.items() if env is not None}
    return [run_env(env_id, envs[env_id], setting, args, argv, started) for env_id, setting in settings.items()]


def main(argv: list[str] | None = None) -> int:
    return cli.main(run, argv)


if __name__ == "__main__":
    sys.exit(main())
