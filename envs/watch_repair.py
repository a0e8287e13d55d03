"""WatchRepair: one decision at t=0 decides a return paid 50 steps later.

The task of "Visual Causal-chain Bookmarking" (Selvakumar, 2026, arXiv:2610.24032, Sec. V-A1),
built on the watch-repair demonstration of RUDDER (Arjona-Medina et al., 2019, arXiv:1806.07857).
The paper calls the repair-cost spreads [2, 2, 2, 1] and the transport spread 1.5 *variances*,
but the public RUDDER demonstration code that produced its numbers passes them to the normal
sampler as *standard deviations*; we use standard deviations (docs/papers/vcbm.md, "WatchRepair").

The dynamics are written once, over arrays of episodes (`WatchRepairDynamics`), and serve both the
single `WatchRepairEnv` (a batch of one) and the numpy `WatchRepairVectorEnv`.
`WatchRepairFeaturizer` is the per-step input RUDDER's LSTM reads on this task (the env offers it
through `credit_featurizer()`, the env contract's hook).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, VectorEnv

from envs.snapshot import SnapshotMixin

REPAIR, KEEP = 0, 1
COMPONENT_NAMES = ("repaired_flag", "counter1", "counter2", "brand", "timestep")
GROUND_TRUTH_ROLES = ("controlled", "noise", "noise", "static", "clock")


# Each step replays a precomputed (T + 1, 5) trajectory: a horizon this long would only exhaust memory.
MAX_HORIZON = 100_000


def _check_reals(name: str, value: Any) -> None:
    """Finite real numbers (a scalar or a sequence), or one line naming the value."""
    try:
        array = np.asarray(value, dtype=float)
    except (TypeError, ValueError):
        array = None
    if array is None or array.ndim > 1 or not np.all(np.isfinite(array)) or np.asarray(value).dtype == bool:
        raise ValueError(f"{name}={value!r}: expected finite real numbers")


class InvalidActionError(ValueError):
    """An action outside {0 (repair), 1 (do not repair)}."""


@dataclass(frozen=True)
class WatchRepairParams:
    """Every constant of the task; defaults are the paper's setting."""

    horizon: int = 50
    brand_probs: Sequence[float] = (0.25, 0.25, 0.25, 0.25)
    repair_cost_mean: Sequence[float] = (1.0, 4.0, 5.0, 24.5)
    repair_cost_sd: Sequence[float] = (2.0, 2.0, 2.0, 1.0)
    price: Sequence[float] = (18.0, 28.0, 31.0, 59.0)
    transport_mean: Sequence[float] = (0.5, 2.5, 4.5, 18.0)
    transport_sd: float = 1.5
    counter_probs: Sequence[float] = (0.10, 0.05)
    counter_penalties: Sequence[float] = (0.1, 7.0)

    def __post_init__(self) -> None:
        if (
            isinstance(self.horizon, bool)
            or not isinstance(self.horizon, (int, np.integer))
            or not 1 <= self.horizon <= MAX_HORIZON
        ):
            raise ValueError(f"horizon={self.horizon!r}: expected an integer in [1, {MAX_HORIZON}]")
        for name in (
            "brand_probs",
            "repair_cost_mean",
            "repair_cost_sd",
            "price",
            "transport_mean",
            "counter_probs",
            "counter_penalties",
            "transport_sd",
        ):
            _check_reals(name, getattr(self, name))
        n_brands = len(self.brand_probs)
        if n_brands < 1:
            raise ValueError("brand_probs=(): expected at least one brand")
        for name in ("repair_cost_mean", "repair_cost_sd", "price", "transport_mean"):
            if len(getattr(self, name)) != n_brands:
                raise ValueError(
                    f"{name} has {len(getattr(self, name))} entries: expected one per brand "
                    f"({n_brands}, the length of brand_probs)"
                )
        probs = np.asarray(self.brand_probs, dtype=float)
        if np.any(probs < 0) or not np.isclose(probs.sum(), 1.0):
            raise ValueError(f"brand_probs={tuple(self.brand_probs)}: expected non-negative values summing to 1")
        if len(self.counter_probs) != 2 or len(self.counter_penalties) != 2:
            raise ValueError("counter_probs and counter_penalties: expected two entries each")
        for name, low, high in (("repair_cost_sd", 0, None), ("transport_sd", 0, None), ("counter_probs", 0, 1)):
            values = np.atleast_1d(np.asarray(getattr(self, name), dtype=float))
            if np.any(values < low) or (high is not None and np.any(values > high)):
                expected = f"values in [{low}, {high}]" if high is not None else f"values >= {low}"
                raise ValueError(f"{name}={getattr(self, name)!r}: expected {expected}")

    @property
    def n_brands(self) -> int:
        return len(self.brand_probs)

    def expected_repair_return(self) -> np.ndarray:
        """E[G | brand, repair] = price - E[cost] - E[transport] - sum_j penalty_j * p_j * T."""
        counters = sum(p * c * self.horizon for p, c in zip(self.counter_probs, self.counter_penalties))
        return (
            np.asarray(self.price, float)
            - np.asarray(self.repair_cost_mean, float)
            - np.asarray(self.transport_mean, float)
            - counters
        )

    def optimal_first_action(self) -> np.ndarray:
        """Per brand: repair (0) where repairing has positive expected return, else keep (1)."""
        return np.where(self.expected_repair_return() > 0, REPAIR, KEEP)


@dataclass
class EpisodeDraws:
    """The random parts of n episodes, drawn once at the first step (in `WatchRepairDynamics.draw`'s order)."""

    cost: np.ndarray  # (n,) repair cost, 0 where the watch was kept
    counter_events: np.ndarray  # (n, T, 2) bool: counter j goes up at step t
    transport: np.ndarray  # (n,) transport cost, 0 where the watch was kept


@dataclass
class WatchRepairDynamics:
    """The task's transition law over a batch of episodes; state is [flag, c1, c2, brand, t].

    Only the first action of an episode changes anything (repair at t = 0); every later step just
    moves the clock and the two counters. So the law is written per episode: `draw` takes the
    episode's random numbers from the generator(s) at its first step, in the order a step-by-step
    simulation would (repair cost, then 2 counter uniforms per step, then the transport cost), and
    `rollout` turns brand, first action and draws into the whole (T + 1)-state trajectory and the
    T rewards. The single env, the vector env and the text env replay those trajectories step by step.
    """

    params: WatchRepairParams = field(default_factory=WatchRepairParams)

    def __post_init__(self) -> None:
        p = self.params
        self._cost_mean = np.asarray(p.repair_cost_mean, float)
        self._cost_sd = np.asarray(p.repair_cost_sd, float)
        self._price = np.asarray(p.price, float)
        self._transport_mean = np.asarray(p.transport_mean, float)
        self._counter_probs = np.asarray(p.counter_probs, float)
        self._counter_penalties = np.asarray(p.counter_penalties, float)
        self._clock = np.arange(p.horizon + 1)
        cdf = np.asarray(p.brand_probs, float).cumsum()
        self._brand_cdf = cdf / cdf[-1]

    def reset(self, rng: np.random.Generator, n: int, brand: int | None = None) -> np.ndarray:
        """n initial states; the brand is drawn as `rng.choice(n_brands, n, p=brand_probs)` draws it
        (one uniform per episode, inverse CDF), unless fixed by `brand`."""
        state = np.zeros((n, 5), dtype=np.int64)
        if brand is None:
            state[:, 3] = self.brands(rng.random(n))
        else:
            if not 0 <= int(brand) < self.params.n_brands:
                raise ValueError(f"brand={brand}: expected an integer in [0, {self.params.n_brands - 1}]")
            state[:, 3] = int(brand)
        return state

    def brands(self, uniforms: np.ndarray) -> np.ndarray:
        """Brand from a uniform in [0, 1) by inverse CDF (what `Generator.choice(p=brand_probs)` does)."""
        return self._brand_cdf.searchsorted(uniforms, side="right")

    def draw(self, rngs: Sequence[np.random.Generator], brand: np.ndarray, first_action: np.ndarray) -> EpisodeDraws:
        """Episode i's random numbers from rngs[i] (one generator may appear many times)."""
        horizon = self.params.horizon
        n = len(brand)
        cost, transport = np.zeros(n), np.zeros(n)
        uniforms = np.empty((n, horizon, 2))
        for i, (rng, b, a) in enumerate(zip(rngs, brand.tolist(), first_action.tolist())):
            if a == REPAIR:
                cost[i] = rng.normal(self._cost_mean[b], self._cost_sd[b])
            uniforms[i] = rng.random((horizon, 2))
            if a == REPAIR:
                transport[i] = rng.normal(self._transport_mean[b], self.params.transport_sd)
        return EpisodeDraws(cost, uniforms < self._counter_probs, transport)

    def redraw_unrevealed(
        self, draws: EpisodeDraws, brand: int, first_action: int, t: int, rng: np.random.Generator
    ) -> tuple[EpisodeDraws, np.ndarray, np.ndarray]:
        """One episode's draws, trajectory (1, T + 1, 5) and rewards (1, T) after `t` steps, with what those
        steps have not revealed drawn afresh from `rng` (in `draw`'s order): the counter events of steps t..T-1
        and the transport cost (paid at the last step). The repair cost was paid at step 0 and stays."""
        events = draws.counter_events.copy()
        events[0, t:] = rng.random((self.params.horizon - t, 2)) < self._counter_probs
        transport = draws.transport.copy()
        if first_action == REPAIR:
            transport[0] = rng.normal(self._transport_mean[brand], self.params.transport_sd)
        redrawn = EpisodeDraws(draws.cost.copy(), events, transport)
        states, rewards = self.rollout(np.array([brand]), np.array([first_action]), redrawn)
        return redrawn, states, rewards

    def rollout(self, brand: np.ndarray, first_action: np.ndarray, draws: EpisodeDraws) -> tuple[np.ndarray, np.ndarray]:
        """The law: states (n, T + 1, 5) and rewards (n, T) of n episodes.

        Repairing at t = 0 sets the flag and costs the repair; each step each counter goes up with
        its probability and the clock ticks; at t = T a repaired watch pays
        price - transport - sum_j penalty_j * counter_j.
        """
        horizon = self.params.horizon
        brand = np.asarray(brand)
        repaired = np.asarray(first_action) == REPAIR
        states = np.empty((len(brand), horizon + 1, 5), dtype=np.int64)
        states[:, 0, :3] = 0
        states[:, 1:, 0] = repaired[:, None]
        np.cumsum(draws.counter_events, axis=1, out=states[:, 1:, 1:3])
        states[:, :, 3] = brand[:, None]
        states[:, :, 4] = self._clock
        rewards = np.zeros((len(brand), horizon))
        rewards[:, 0] = np.where(repaired, -draws.cost, 0.0)
        payout = self._price[brand] - draws.transport - states[:, horizon, 1:3] @ self._counter_penalties
        rewards[:, horizon - 1] += np.where(repaired, payout, 0.0)
        return states, rewards

    def observation_space(self) -> spaces.MultiDiscrete:
        t = self.params.horizon
        return spaces.MultiDiscrete([2, t + 1, t + 1, self.params.n_brands, t + 1], dtype=np.int64)


def check_actions(actions: np.ndarray) -> None:
    """One clear error for any action outside {0, 1} (or a non-integer dtype)."""
    if actions.size and (actions.min() < REPAIR or actions.max() > KEEP or not np.issubdtype(actions.dtype, np.integer)):
        bad = actions[(actions != REPAIR) & (actions != KEEP)]
        raise InvalidActionError(
            f"invalid action {bad[0].item() if len(bad) else actions.dtype!r}: expected 0 (repair) or 1 (do not repair)"
        )


class WatchRepairFeaturizer:
    """RUDDER's per-step input on WatchRepair: the state [flag, counter1, counter2, one-hot brand,
    t / horizon] as a difference from the previous step (the first step raw), then the one-hot action:
    3 + n_brands + 1 + n_actions features (10 on the paper's task). This is the input of the RUDDER
    demonstration code the task comes from (docs/papers/vcbm.md, "RUDDER").
    """

    def __init__(self, horizon: int = 50, n_brands: int = 4, n_actions: int = 2) -> None:
        for name, value in (("horizon", horizon), ("n_brands", n_brands), ("n_actions", n_actions)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"{name}={value!r}: expected an integer >= 1")
        self.horizon, self.n_brands, self.n_actions = int(horizon), int(n_brands), int(n_actions)
        self.n_features = 3 + self.n_brands + 1 + self.n_actions

    def __call__(self, observations: np.ndarray, actions: np.ndarray) -> np.ndarray:
        """(B, T, 5) observations and (B, T) actions -> (B, T, n_features) float32; one episode
        ((T, 5), (T,)) gives (T, n_features)."""
        obs, acts = np.asarray(observations), np.asarray(actions)
        single = obs.ndim == 2
        if single:
            obs, acts = obs[None], acts[None]
        if obs.ndim != 3 or obs.shape[-1] != 5 or acts.shape != obs.shape[:2]:
            raise ValueError(f"observations {obs.shape} and actions {acts.shape}: expected (B, T, 5) and (B, T)")
        brand = obs[..., 3].astype(np.int64)
        if brand.min(initial=0) < 0 or brand.max(initial=0) >= self.n_brands:
            raise ValueError(f"brand values outside [0, {self.n_brands - 1}] in the observations")
        if acts.min(initial=0) < 0 or acts.max(initial=0) >= self.n_actions:
            raise ValueError(f"action values outside [0, {self.n_actions - 1}]")
        state = np.concatenate(
            [
                obs[..., :3].astype(np.float32),
                np.eye(self.n_brands, dtype=np.float32)[brand],
                obs[..., 4:5].astype(np.float32) / self.horizon,
            ],
            axis=-1,
        )
        diffs = np.diff(state, axis=1, prepend=np.zeros_like(state[:, :1]))
        features = np.concatenate([diffs, np.eye(self.n_actions, dtype=np.float32)[acts.astype(np.int64)]], axis=-1)
        return features[0] if single else features


class WatchRepairEnv(SnapshotMixin, gym.Env):
    """The paper's watch-repair task as a Gymnasium env.

    `info` carries `brand`, `optimal_first_action` and, once the first decision is made,
    `first_decision_optimal`; the last step also carries SB3's `is_success` (the same flag). All
    are for evaluation only (the env contract, vcbm_gym/contract.py): agents must not learn from them.
    `reset(options={"brand": b})` fixes the brand of that episode.
    The first step draws the episode (`WatchRepairDynamics.draw`, `rollout`); later steps replay it.
    `snapshot()` / `restore(state, outcome_seed)` (envs/snapshot.py): with an outcome seed, the rest of the
    episode (the decision's draws, or after it the counter events and transport not yet seen) comes from
    that seed, and np_random, which draws the next episodes' brands, is the snapshot's, not advanced by it.
    """

    metadata = {"render_modes": ["ansi"], "render_fps": 4}
    component_names = COMPONENT_NAMES  # for logs and reports only
    snapshot_fields = (
        "_states", "_observations", "_info", "_rewards", "_t", "_brand", "_first_action", "_draws", "_outcome_rng",
    )  # fmt: skip

    def __init__(self, render_mode: str | None = None, **params: Any) -> None:
        self.dynamics = WatchRepairDynamics(WatchRepairParams(**params))
        self.params = self.dynamics.params
        self.observation_space = self.dynamics.observation_space()
        self.action_space = spaces.Discrete(2)
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode={render_mode!r}: expected one of {self.metadata['render_modes']}")
        self.render_mode = render_mode
        self._optimal = self.params.optimal_first_action().tolist()
        self._horizon = self.params.horizon
        self._states: np.ndarray | None = None  # (T + 1, 5) once the first action is known
        self._observations: list[np.ndarray] = []  # what step() returns: rows of a copy of _states
        self._info: dict[str, Any] = {}  # step()'s info (copied per step) once the first action is known
        self._rewards: list[float] = []
        self._t = 0
        self._brand = 0
        self._first_action: int | None = None
        self._draws: EpisodeDraws | None = None
        self._outcome_rng: np.random.Generator | None = None  # set by an outcome-seeded restore, else np_random

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        brand = (options or {}).get("brand")
        state = self.dynamics.reset(self.np_random, 1, brand)
        self._brand, self._t, self._first_action, self._states = int(state[0, 3]), 0, None, state
        self._outcome_rng = None
        return state[0].copy(), {"brand": self._brand, "optimal_first_action": self._optimal[self._brand]}

    def step(self, action):
        if self._states is None or self._t >= self._horizon:
            raise RuntimeError("step() called before reset() or after the episode ended")
        if not (action.__class__ is int and 0 <= action <= 1) and not self.action_space.contains(action):
            raise InvalidActionError(f"invalid action {action!r}: expected 0 (repair) or 1 (do not repair)")
        t = self._t
        if t == 0:
            self._first_action = first = int(action)
            brand, first_action = np.array([self._brand]), np.array([first])
            rng = self.np_random if self._outcome_rng is None else self._outcome_rng
            self._draws = self.dynamics.draw([rng], brand, first_action)
            self._set_trajectory(*self.dynamics.rollout(brand, first_action, self._draws))
            # the info is the same at every step of the episode once the first decision is made
            optimal = self._optimal[self._brand]
            self._info = {"brand": self._brand, "optimal_first_action": optimal, "first_decision_optimal": first == optimal}
        self._t = t + 1
        info = self._info.copy()
        terminated = t + 1 >= self._horizon
        if terminated:
            info["is_success"] = info["first_decision_optimal"]
        return self._observations[t + 1], self._rewards[t], terminated, False, info

    def _set_trajectory(self, states: np.ndarray, rewards: np.ndarray) -> None:
        self._states, self._rewards = states[0], rewards[0].tolist()
        # The observations handed out are the rows of one copy per episode (not one copy per step):
        # a caller writing into one changes neither the env's trajectory nor another step's observation.
        self._observations = list(states[0].copy())

    def redraw_outcome(self, rng: np.random.Generator) -> None:
        """Before the decision the decision's draws come from `rng`; after it, what the steps so far did not reveal."""
        self._outcome_rng = rng
        if self._first_action is not None and self._t < self._horizon:
            self._draws, states, rewards = self.dynamics.redraw_unrevealed(
                self._draws, self._brand, self._first_action, self._t, rng
            )
            self._set_trajectory(states, rewards)

    def credit_featurizer(self) -> WatchRepairFeaturizer:
        """The env contract's hook: RUDDER's WatchRepair input features for this env's constants."""
        return WatchRepairFeaturizer(self._horizon, self.params.n_brands, int(self.action_space.n))

    def render(self):
        if self.render_mode == "ansi" and self._states is not None:
            return ", ".join(f"{n}={v}" for n, v in zip(COMPONENT_NAMES, self._states[min(self._t, len(self._states) - 1)]))
        return None


class WatchRepairVectorEnv(VectorEnv):
    """`num_envs` watch-repair episodes stepped together in numpy (next-step autoreset).

    Infos are dicts of arrays in Gymnasium's vector layout: `brand`, `optimal_first_action`,
    `first_action` (-1 before the first decision), and the single env's evaluation keys
    `first_decision_optimal` (valid where its mask `_first_decision_optimal` is True: once decided)
    and `is_success` (valid where `_is_success` is True: on the step that ends an episode).

    `reset(seed=k)` seeds one generator shared by all sub-envs; `reset(seed=[k_0, ..., k_{n-1}])`
    gives sub-env i its own generator, seeded as `WatchRepairEnv.reset(seed=k_i)` seeds it, so that
    sub-env i replays exactly the episodes of a single env with seed k_i under the same actions.
    """

    metadata = {"autoreset_mode": AutoresetMode.NEXT_STEP}

    def __init__(self, num_envs: int, **params: Any) -> None:
        if isinstance(num_envs, bool) or not isinstance(num_envs, (int, np.integer)):
            raise ValueError(f"num_envs={num_envs!r}: expected an integer >= 1")
        self.num_envs = int(num_envs)
        if self.num_envs < 1:
            raise ValueError(f"num_envs={num_envs}: expected an integer >= 1")
        self.dynamics = WatchRepairDynamics(WatchRepairParams(**params))
        self.horizon = self.dynamics.params.horizon
        self.single_observation_space = self.dynamics.observation_space()
        self.single_action_space = spaces.Discrete(2)
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, self.num_envs)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, self.num_envs)
        self._optimal = self.dynamics.params.optimal_first_action()
        self._rngs: list[np.random.Generator] | None = None  # per-env generators, or None: the shared one
        self._states = np.zeros((self.num_envs, self.horizon + 1, 5), dtype=np.int64)  # planned trajectories
        self._rewards = np.zeros((self.num_envs, self.horizon))
        self._t = np.zeros(self.num_envs, dtype=np.int64)
        self._first_action = np.full(self.num_envs, -1)
        self._brand_option: int | None = None
        self._started = False

    def generators(self, index: np.ndarray) -> list[np.random.Generator]:
        """The generator of each sub-env in `index` (the shared one repeated if there are no per-env ones)."""
        if self._rngs is None:
            return [self.np_random] * len(index)
        return [self._rngs[i] for i in index.tolist()]

    def reset(self, *, seed: int | Sequence[int] | None = None, options: dict | None = None):
        if seed is not None and not isinstance(seed, (int, np.integer)):
            seeds = list(seed)
            if len(seeds) != self.num_envs:
                raise ValueError(f"{len(seeds)} seeds: expected one int or num_envs={self.num_envs} ints")
            self._rngs = [gym.utils.seeding.np_random(int(k))[0] for k in seeds]
        elif seed is not None:
            self._np_random, self._np_random_seed = gym.utils.seeding.np_random(int(seed))
            self._rngs = None
        self._brand_option = (options or {}).get("brand")
        self._start(np.arange(self.num_envs))
        self._started = True
        return self._states[:, 0].copy(), self._infos()

    def _start(self, index: np.ndarray) -> None:
        """New episodes in sub-envs `index`: a brand from each one's generator, t = 0."""
        if self._rngs is None or self._brand_option is not None:
            brand = self.dynamics.reset(self.np_random, len(index), self._brand_option)[:, 3]
        else:  # one uniform from each sub-env's own generator, as its single env would draw it
            brand = self.dynamics.brands(np.array([rng.random() for rng in self.generators(index)]))
        self._states[index] = 0
        self._states[index, 0, 3] = brand
        self._t[index] = 0
        self._first_action[index] = -1

    def step(self, actions):
        if not self._started:
            raise RuntimeError("step() called before reset()")
        actions = np.asarray(actions).reshape(self.num_envs)
        reward = np.zeros(self.num_envs)
        done = self._t >= self.horizon
        live = ~done
        check_actions(actions[live])
        first = np.flatnonzero(live & (self._t == 0))
        if len(first):
            self._first_action[first] = actions[first]
            brand, first_action = self._states[first, 0, 3], actions[first]
            draws = self.dynamics.draw(self.generators(first), brand, first_action)
            self._states[first], self._rewards[first] = self.dynamics.rollout(brand, first_action, draws)
        if done.any():
            self._start(np.flatnonzero(done))
        t = self._t
        reward[live] = self._rewards[live, t[live]]
        t[live] += 1
        terminated = live & (t >= self.horizon)
        obs = self._states[np.arange(self.num_envs), t]
        return obs, reward, terminated, np.zeros(self.num_envs, dtype=bool), self._infos(obs, terminated)

    def _infos(self, obs: np.ndarray | None = None, ended: np.ndarray | None = None) -> dict[str, np.ndarray]:
        brand = (self._states[:, 0, 3] if obs is None else obs[:, 3]).copy()
        optimal = self._optimal[brand]
        decided = self._first_action >= 0
        correct = decided & (self._first_action == optimal)
        ended = np.zeros(self.num_envs, dtype=bool) if ended is None else ended.copy()
        return {
            "brand": brand,
            "optimal_first_action": optimal,
            "first_action": self._first_action.copy(),
            "first_decision_optimal": correct,
            "_first_decision_optimal": decided,
            "is_success": correct & ended,
            "_is_success": ended,
        }
