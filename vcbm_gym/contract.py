"""The written contract between environments, credit rules and agents, and its checker.

An environment talks to this project through the Gymnasium API and, beyond it, through a few
`info` keys. `INFO_KEYS` lists every key a runner or a credit rule reads: its type, when it must
be present, what it means, who reads it, and whether it is *evaluation only* (never learned from).

- Evaluation-only keys are optional. Without `first_decision_optimal` a tabular or SB3 run has no
  convergence criterion: it trains for its episode budget and reports its return (and its success
  rate where the env reports SB3's `is_success`).
- A key that something needs in order to *learn* (VCBM-LOOP's bookmarks need `state_mutating`,
  EMPO's cells need `effect`, CASI needs `coalition_values`) is required by that consumer only: a
  credit rule declares its keys (`CreditRule.info_needs`), `NEEDS` maps the other consumers to theirs.
  Missing, it fails at the first step with one line naming the key and this contract (`require_info`).

An env may also offer `credit_featurizer()` on its unwrapped instance: the per-step features a
sequence credit model (RUDDER) reads, as a `vcbm_gym.credit.features.Featurizer`. Without it the
features are the flattened observation and action (`vcbm_gym.credit.features.episode_featurizer`).

Beyond `info`, two rules Gymnasium's API leaves implicit: every reward is a finite number (one NaN
makes every return and mean after it NaN), and an observation once returned is never changed by a
later `step` or `reset` (an agent keeps it as the previous state of a transition), so an env that
keeps its state in an array returns a copy of it.

An env whose action space does not enumerate a turn's choices (a Text action space) may offer
`turn_alternatives()` on its unwrapped instance: the finite actions the current turn offers, each a distinct
decision its parser accepts (TextWatchWorkshop's station tools, "repair()" / "skip()"), and with it
`optimal_alternative()`: the one it knows to be optimal at this turn, or None where it names none (evaluation
only). The replay reference (`algorithms/credit_reference/`) branches over them and its scripted policy takes
the optimal one.

An env may offer the snapshot protocol (`envs/snapshot.py`: `snapshot()` / `restore(state, outcome_seed)` on
its unwrapped instance, called through `envs.snapshot.snapshot(env)` / `restore(env, state)`, which also
capture the wrappers): a restored env continues exactly as the original would. `check_contract` checks it
where the env offers it (`check_snapshot`).

`check_contract(env, needs=...)` is the user-facing checker, in the spirit of Gymnasium's
`check_env` (which it runs first, after probing a few steps for a non-finite reward or a mutated
observation, which `check_env` would report as non-determinism): it plays a few episodes and
raises `ContractError`, one line, at the first key that is missing or has the wrong type, the
first non-finite reward, or the first observation changed in place. ARCHITECTURE.md ("The env
contract") has the same table in prose.
"""

from __future__ import annotations

import copy
import math
import pickle
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

from envs import snapshot as snapshots
from envs.contract_errors import CONTRACT, ContractError, env_name, non_finite_reward_message  # noqa: F401 (re-exported)
from vcbm_gym.info_keys import END, INFO_KEYS, NEEDS, STEP, InfoKey  # noqa: F401 (re-exported: the contract's table)

PROBE_MAX_STEPS = 100_000  # a probe episode (the contract checker's, the criterion probe's) longer than this decides nothing


def rule_info_needs(name: str) -> tuple[str, ...] | None:
    """The info keys credit rule `name` declares it learns from (CreditRule.info_needs), or None: no such rule."""
    from vcbm_gym.credit.registry import (
        is_rule,
        rule_class,  # the rule's module only, when a rule is named
    )

    return rule_class(name).info_needs if is_rule(name) else None


def required_keys(needs: Iterable[str]) -> dict[str, str]:
    """Consumer names (keys of NEEDS), credit rule names (their info_needs) or info key names -> {key: who needs it}."""
    out: dict[str, str] = {}
    for need in needs:
        if need in NEEDS:
            out.update({key: need for key in NEEDS[need] if key not in out})
        elif need in INFO_KEYS:
            out.setdefault(need, f"info[{need!r}]")
        elif (rule_keys := rule_info_needs(need)) is not None:
            out.update({key: f"credit rule {need}" for key in rule_keys if key not in out})
        else:
            raise ValueError(
                f"needs: unknown consumer, credit rule or key {need!r}; expected one of: {', '.join([*NEEDS, *INFO_KEYS])} "
                "or a credit rule's name"
            )
    return out


def missing_key_message(key: str, consumer: str, env_name: str, where: str) -> str:
    spec = INFO_KEYS[key]
    return (
        f"env {env_name} reports no info[{key!r}] at {where}; {consumer} needs it to learn "
        f"({spec.meaning}, {spec.kind_text}, on {spec.when}): see {CONTRACT}"
    )


def require_info(info: Mapping[str, Any], needs: Mapping[str, str], env_name: str, where: str = "step 1") -> None:
    """Raise ContractError (one line) for the first key of `needs` ({key: consumer}) absent from `info`."""
    for key, consumer in needs.items():
        if key not in info:
            raise ContractError(missing_key_message(key, consumer, env_name, where))


def check_value(key: str, value: Any, where: str) -> None:
    """ContractError unless `value` has the type the contract gives `key`."""
    spec = INFO_KEYS[key]
    if not spec.accepts(value):
        shown = repr(value)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        raise ContractError(
            f"info[{key!r}] at {where} is {shown} ({type(value).__name__}): expected {spec.kind_text} ({spec.meaning})"
        )


def check_reward(reward: Any, env_name: str, where: str) -> float:
    """The reward as a float; ContractError (one line naming `where`) unless it is a finite number."""
    try:
        value = float(reward)
    except (TypeError, ValueError):
        raise ContractError(
            f"env {env_name} returned reward {reward!r} ({type(reward).__name__}) at {where}: expected a finite number"
        ) from None
    if not math.isfinite(value):
        raise ContractError(non_finite_reward_message(env_name, reward, where))
    return value


def _equal_in_depth(a: Any, b: Any, leaf: Callable[[Any, Any], bool], coerce_arrays: bool) -> bool:
    """Arrays (same shape, dtype and values, NaN equal to NaN), mappings, lists and tuples compared in depth; any
    other pair by `leaf`. An array `a` needs an array `b`; with `coerce_arrays`, either side being an array makes
    both arrays (np.asarray) first."""
    if isinstance(a, np.ndarray) or (coerce_arrays and isinstance(b, np.ndarray)):
        if coerce_arrays:
            a, b = np.asarray(a), np.asarray(b)
        elif not isinstance(b, np.ndarray):
            return False
        if a.shape != b.shape or a.dtype != b.dtype:
            return False
        if a.dtype == object:
            return all(_equal_in_depth(x, y, leaf, coerce_arrays) for x, y in zip(a.flat, b.flat))
        return bool(np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"))
    if isinstance(a, Mapping):
        return (
            isinstance(b, Mapping) and a.keys() == b.keys() and all(_equal_in_depth(a[k], b[k], leaf, coerce_arrays) for k in a)
        )
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_equal_in_depth(x, y, leaf, coerce_arrays) for x, y in zip(a, b))
    return leaf(a, b)


def _unchanged(kept: Any, now: Any) -> bool:
    """Whether `now` (an observation object as it is now) still equals `kept` (a deep copy taken when it was
    returned): same types, shapes and values, NaN equal to NaN. Arrays, mappings, lists and tuples are compared
    (in depth); anything else is taken as unchanged: a number or string cannot change in place, and an object
    of another kind may compare by identity, which its copy never matches."""
    return _equal_in_depth(kept, now, lambda _kept, _now: True, coerce_arrays=False)


class ReturnedObservations:
    """Keeps a copy of the last observation an env returned and, after each later `reset` or `step`, checks
    that the object it returned still holds it: an env that writes its next state into the array it
    returned (`return self.state` then `self.state += ...`) silently rewrites the agent's last transition."""

    def __init__(self, env_name: str) -> None:
        self.env_name = env_name
        self._returned: Any = None
        self._kept: Any = None
        self._source = ""

    def returned(self, obs: Any, call: str) -> None:
        """`obs` was just returned by `call` (e.g. "step 4 of episode 1"): first check the one returned before it."""
        if self._source and not _unchanged(self._kept, self._returned):
            raise ContractError(
                f"env {self.env_name} mutates the observation array it returned: the observation of {self._source} "
                f"changed in place at {call}; an agent keeps the observations it is given (the previous state of a "
                f"transition), so return a copy (e.g. `return self.state.copy(), ...`) ({CONTRACT})"
            )
        self._returned, self._kept, self._source = obs, copy.deepcopy(obs), call


def probe_steps(env: gym.Env, name: str, seed: int, steps: int = 3) -> None:
    """reset(seed) and up to `steps` random steps of `env`: ContractError (one line) at a non-finite reward or an
    observation changed in place. Run before Gymnasium's `check_env`, whose determinism assertions would
    report either as non-determinism (NaN != NaN; two steps compared through one reused array)."""
    env.action_space.seed(seed)
    observations = ReturnedObservations(name)
    obs, _ = env.reset(seed=seed)
    observations.returned(obs, f"reset(seed={seed})")
    for t in range(1, steps + 1):
        where = f"step {t} after reset(seed={seed})"
        obs, reward, terminated, truncated, _ = env.step(env.action_space.sample())
        observations.returned(obs, where)
        check_reward(reward, name, where)
        if terminated or truncated:
            break
    observations.returned(env.reset(seed=seed)[0], f"the reset(seed={seed}) after {where}")


def _same_leaf(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return type(a) is type(b) and bool(a == b)


def same(a: Any, b: Any) -> bool:
    """Exact equality of two step results (arrays, mappings, sequences, numbers; NaN equal to NaN)."""
    return _equal_in_depth(a, b, _same_leaf, coerce_arrays=True)


STEP_PARTS = ("observation", "reward", "terminated", "truncated", "info")
RESET_PARTS = ("observation", "info")


def _play(env: gym.Env, actions: list[Any], obs: Any, act: Callable[[Any], Any] | None, max_steps: int) -> list[tuple]:
    """Step to the episode's end or `max_steps` steps: with `act`, its actions (appended to `actions`), else
    replaying `actions` (at most all of them); deep copies of the step results."""
    results: list[tuple] = []
    while len(results) < (max_steps if act is not None else min(max_steps, len(actions))):
        if act is not None:
            actions.append(act(obs))
        result = env.step(actions[len(results)])
        results.append(copy.deepcopy(result))
        obs = result[0]
        if result[2] or result[3]:
            break
    return results


def _branch(env: gym.Env, actions: list[Any], obs: Any, act: Callable[[Any], Any] | None, max_steps: int) -> list[tuple]:
    """`_play`, and where the episode ended the next `reset()` (unseeded: the generators' state shows in it)."""
    results = _play(env, actions, obs, act, max_steps)
    if results and (results[-1][2] or results[-1][3]):
        results.append(copy.deepcopy(env.reset()))
    return results


def _first_difference(original: list[tuple], replayed: list[tuple]) -> str | None:
    for t, (a, b) in enumerate(zip(original, replayed), start=1):
        where, parts = (f"step {t}", STEP_PARTS) if len(a) == len(STEP_PARTS) else ("the next reset()", RESET_PARTS)
        for part, x, y in zip(parts, a, b):
            if not same(x, y):
                return f"{where} after it: {part} {_shown(y)} where the first continuation had {_shown(x)}"
    if len(original) != len(replayed):
        return f"{len(replayed)} steps after it where the first continuation had {len(original)}"
    return None


def _shown(value: Any) -> str:
    text = repr(value).replace("\\n", " ")
    return text if len(text) <= 60 else text[:57] + "..."


def check_snapshot(
    env: gym.Env,
    seed: int = 0,
    policy: Callable[[Any], Any] | None = None,
    max_steps: int = PROBE_MAX_STEPS,
    reset_options: Mapping[str, Any] | None = None,
) -> None:
    """The snapshot protocol (envs/snapshot.py) on an env that offers it. Snapshot at a random step of an episode
    from `reset(seed=seed)`, play `policy` (default: seeded random actions) to the episode's end, then restore and
    replay the same actions: the same step results and the same next (unseeded) reset, exactly; again from a
    pickled copy of the snapshot (a second restore from one snapshot); and twice under one outcome seed (one
    seed, one redraw). ContractError, one line naming the env, the snapshot's step, the restore and the first
    step result that differed."""
    rng = np.random.default_rng(seed)
    env.action_space.seed(seed)
    act = policy or (lambda _obs: env.action_space.sample())
    options = dict(reset_options) if reset_options else None
    probe: list[Any] = []
    at = int(rng.integers(len(_play(env, probe, env.reset(seed=seed, options=options)[0], act, max_steps))))
    obs, _ = env.reset(seed=seed, options=options)
    prefix = _play(env, probe[:at], obs, None, max_steps)  # the probe's first steps again: mid-episode, not past it
    state = snapshots.snapshot(env)
    actions: list[Any] = []
    first = _branch(env, actions, prefix[-1][0] if prefix else obs, act, max_steps)
    where = f"env {env_name(env)} offers snapshot()/restore() but breaks it: snapshot at step {at} of the episode"
    where += f" from reset(seed={seed}), then"
    for how, restored in (
        ("restore(state)", state),
        ("a second restore, from a pickled copy of it", pickle.loads(pickle.dumps(state))),
    ):
        _replay_matches(env, restored, actions, max_steps, first, f"{where} {how}", None)
    # an outcome seed may change the continuation; the same seed twice may not
    outcome_seed = int(rng.integers(2**31))
    how = f"{where} restore(state, outcome_seed={outcome_seed})"
    seeded = _replay_matches(env, state, actions, max_steps, None, how, outcome_seed)
    _replay_matches(env, state, actions, max_steps, seeded, f"{how} twice", outcome_seed)


def _replay_matches(
    env: gym.Env,
    state: Any,
    actions: list[Any],
    max_steps: int,
    expected: list[tuple] | None,
    what: str,
    outcome_seed: int | None,
) -> list[tuple]:
    """Restore `state` and replay `actions`: their results, equal to `expected` where given (else ContractError,
    one line: `what`, and the first difference)."""
    try:
        snapshots.restore(env, state, outcome_seed=outcome_seed)
        replayed = _branch(env, actions, None, None, max_steps)
    except Exception as error:  # a restored env that refuses the original's actions breaks the protocol too
        raise ContractError(
            f"{what}, and the same actions raised {type(error).__name__}: {_shown(str(error))} ({CONTRACT})"
        ) from error
    difference = None if expected is None else _first_difference(expected, replayed)
    if difference is not None:
        raise ContractError(f"{what}, and the same actions: {difference} ({CONTRACT})")
    return replayed


@dataclass(frozen=True)
class ContractReport:
    """What `check_contract` saw: the contract keys reported on every episode, episodes and steps played."""

    reported: frozenset[str]
    episodes: int
    steps: int
    snapshot: str = "not checked"  # "checked", or why not (the env offers no snapshot protocol)

    def lines(self) -> list[str]:
        out = []
        for key in INFO_KEYS.values():
            status = "reported" if key.name in self.reported else "absent"
            out.append(f"{key.name}: {status} ({'evaluation only' if key.evaluation_only else 'to learn'}; {key.read_by})")
        out.append(f"snapshot/restore: {self.snapshot}")
        return out


def _check_episode(
    env: gym.Env,
    act: Callable[[Any], Any],
    episode: int,
    required: Mapping[str, str],
    observations: ReturnedObservations,
    **how: Any,
) -> tuple[int, Mapping[str, Any]]:
    """Play episode `episode` of `check_contract` (how: seed, max_steps, reset_options) and check every step of it;
    (its steps, its last info)."""
    name, max_steps, reset_options = observations.env_name, how["max_steps"], how["reset_options"]
    obs, _ = env.reset(seed=how["seed"] if episode == 1 else None, options=dict(reset_options) if reset_options else None)
    observations.returned(obs, f"the reset of episode {episode}")
    done, t, info = False, 0, {}
    while not done:
        if t >= max_steps:
            raise ContractError(
                f"env {name}: episode {episode} did not end within max_steps={max_steps}: "
                "expected episodes that terminate or truncate"
            )
        obs, reward, terminated, truncated, info = env.step(act(obs))
        t += 1
        done = bool(terminated or truncated)
        where = f"step {t} of episode {episode}"
        observations.returned(obs, where)
        check_reward(reward, name, where)
        for key, spec in INFO_KEYS.items():
            if key in info:
                check_value(key, info[key], where)
            elif key in required and (spec.when == STEP or done):
                raise ContractError(missing_key_message(key, required[key], name, where))
    return t, info


def check_contract(
    env: gym.Env,
    needs: Iterable[str] = (),
    episodes: int = 2,
    seed: int = 0,
    policy: Callable[[Any], Any] | None = None,
    max_steps: int = PROBE_MAX_STEPS,
    reset_options: Mapping[str, Any] | None = None,
    check_api: bool = True,
) -> ContractReport:
    """Check `env` against the contract; raise ContractError (one line) where it breaks it: a missing or
    mistyped info key, a NaN or infinite reward, an observation changed in place after it was returned, a
    restored snapshot that does not continue as the original did.

    `needs`: consumers (keys of NEEDS, e.g. "vcbm-loop"), credit rule names (e.g. "casi") or info key names
    that must be reported.
    Plays `episodes` episodes from `reset(seed=seed)` with `policy(observation)` (default: the
    action space's own seeded `sample()`), at most `max_steps` steps each. Checks that every needed
    key is present on every step (or last step) the contract says, that every contract key the env
    reports has the contract's type, and that an evaluation key reported at one episode's end is
    reported at every episode's end (the runners decide on the first episode), that every reward is
    finite and that no observation changes after it was returned, and, where the env offers the snapshot
    protocol through every wrapper (`envs.snapshot.supports_snapshot`), `check_snapshot`. With `check_api` Gymnasium's own
    `check_env` runs first, on `env.unwrapped` (after `probe_steps` on it, so that a NaN reward or a
    mutated observation is named as such); the contract is checked on `env` as given, wrappers
    included (a DelayedReward or TimeLimit changes what the runners see).
    """
    if episodes < 1 or max_steps < 1:
        raise ValueError(f"episodes={episodes}, max_steps={max_steps}: expected both >= 1")
    required = required_keys(needs)
    name = env_name(env)
    if check_api:
        from gymnasium.utils.env_checker import check_env

        probe_steps(env.unwrapped, env_name(env.unwrapped), seed)
        check_env(env.unwrapped, skip_render_check=True)  # Gymnasium's advice: check the unwrapped env
    env.action_space.seed(seed)
    act = policy or (lambda _obs: env.action_space.sample())
    at_end: set[str] | None = None
    steps = 0
    observations = ReturnedObservations(name)
    for episode in range(1, episodes + 1):
        t, info = _check_episode(
            env, act, episode, required, observations, seed=seed, max_steps=max_steps, reset_options=reset_options
        )
        steps += t
        ended = {key for key, spec in INFO_KEYS.items() if key in info and spec.when == END}
        if at_end is not None and ended != at_end:
            key = sorted(at_end ^ ended)[0]
            raise ContractError(
                f"env {name} reports info[{key!r}] at the end of some episodes but not of episode {episode}: "
                f"expected it on every episode's last step or on none ({CONTRACT})"
            )
        at_end = ended
    step_keys = {key for key, spec in INFO_KEYS.items() if spec.when == STEP and key in info}
    problem = snapshots.snapshot_problem(env)
    if problem is None:
        check_snapshot(env, seed, policy, max_steps, reset_options)
    return ContractReport(frozenset((at_end or set()) | step_keys), episodes, steps, problem or "checked")
