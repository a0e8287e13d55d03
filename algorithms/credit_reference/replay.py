"""The replay engine: episodes of a behaviour policy, snapshots before every step, and the reference credit
Q(s_t, a_t) - V(s_t) from K restored continuations per alternative (or per slot of a one-step set action); the
batch a credit rule reads from those episodes. The method is the package docstring's."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np

from algorithms.common.errors import VcbmGymError
from algorithms.sb3.callbacks import group_ids_for
from envs.snapshot import restore, snapshot
from vcbm_gym.credit.base import EpisodeBatch

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
