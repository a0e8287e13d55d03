"""WatchRepair: one decision at t=0 decides a return paid 50 steps later (SPEC section 1).

The paper (000, Sec. V-A1) calls the repair-cost spreads [2, 2, 2, 1] and the transport spread
1.5 *variances*, but the public RUDDER demonstration code that produced its numbers passes them to
the normal sampler as *standard deviations*. The SPEC settles on standard deviations; so do we.

The dynamics are written once, over arrays of episodes (`WatchRepairDynamics`), and serve both the
single `WatchRepairEnv` (a batch of one) and the numpy `WatchRepairVectorEnv`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, VectorEnv

REPAIR, KEEP = 0, 1
COMPONENT_NAMES = ("repaired_flag", "counter1", "counter2", "brand", "timestep")
GROUND_TRUTH_ROLES = ("controlled", "noise", "noise", "static", "clock")


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
        if self.horizon < 1:
            raise ValueError(f"horizon={self.horizon}: expected an integer >= 1")
        n_brands = len(self.brand_probs)
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
class WatchRepairDynamics:
    """The task's transition law over a batch of episodes; state is [flag, c1, c2, brand, t]."""

    params: WatchRepairParams = field(default_factory=WatchRepairParams)

    def __post_init__(self) -> None:
        p = self.params
        self._cost_mean = np.asarray(p.repair_cost_mean, float)
        self._cost_sd = np.asarray(p.repair_cost_sd, float)
        self._price = np.asarray(p.price, float)
        self._transport_mean = np.asarray(p.transport_mean, float)
        self._counter_probs = np.asarray(p.counter_probs, float)
        self._counter_penalties = np.asarray(p.counter_penalties, float)
        self._brand_probs = np.asarray(p.brand_probs, float)

    def reset(self, rng: np.random.Generator, n: int, brand: int | None = None) -> np.ndarray:
        state = np.zeros((n, 5), dtype=np.int64)
        if brand is None:
            state[:, 3] = rng.choice(self.params.n_brands, size=n, p=self._brand_probs)
        else:
            if not 0 <= int(brand) < self.params.n_brands:
                raise ValueError(f"brand={brand}: expected an integer in [0, {self.params.n_brands - 1}]")
            state[:, 3] = int(brand)
        return state

    def step(
        self, rng: np.random.Generator, state: np.ndarray, actions: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Advance every episode one step; returns (next_state, reward, terminated).

        The caller guarantees that no episode in the batch has finished.
        """
        p = self.params
        actions = np.asarray(actions)
        if actions.min() < REPAIR or actions.max() > KEEP or not np.issubdtype(actions.dtype, np.integer):
            bad = actions[(actions != REPAIR) & (actions != KEEP)]
            raise InvalidActionError(
                f"invalid action {bad[0].item() if len(bad) else actions.dtype!r}: "
                "expected 0 (repair) or 1 (do not repair)"
            )
        state = state.copy()
        n = len(state)
        brand = state[:, 3]
        reward = np.zeros(n, dtype=np.float64)

        repairs = (state[:, 4] == 0) & (actions == REPAIR)
        if repairs.any():
            cost = rng.normal(self._cost_mean[brand[repairs]], self._cost_sd[brand[repairs]])
            reward[repairs] -= cost
            state[repairs, 0] = 1

        state[:, 1:3] += rng.random((n, 2)) < self._counter_probs
        state[:, 4] += 1

        terminated = state[:, 4] >= p.horizon
        paid = terminated & (state[:, 0] == 1)
        if paid.any():
            b = brand[paid]
            transport = rng.normal(self._transport_mean[b], p.transport_sd)
            reward[paid] += self._price[b] - transport - state[paid, 1:3] @ self._counter_penalties
        return state, reward, terminated

    def observation_space(self) -> spaces.MultiDiscrete:
        t = self.params.horizon
        return spaces.MultiDiscrete([2, t + 1, t + 1, self.params.n_brands, t + 1], dtype=np.int64)


class WatchRepairEnv(gym.Env):
    """The paper's watch-repair task as a Gymnasium env (SPEC section 1).

    `info` carries `brand`, `optimal_first_action` and, once the first decision is made,
    `first_decision_optimal`: for evaluation only; agents must not learn from it.
    `reset(options={"brand": b})` fixes the brand of that episode.
    """

    metadata = {"render_modes": ["ansi"], "render_fps": 4}
    component_names = COMPONENT_NAMES  # for logs and reports only

    def __init__(self, render_mode: str | None = None, **params: Any) -> None:
        self.dynamics = WatchRepairDynamics(WatchRepairParams(**params))
        self.params = self.dynamics.params
        self.observation_space = self.dynamics.observation_space()
        self.action_space = spaces.Discrete(2)
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode={render_mode!r}: expected one of {self.metadata['render_modes']}")
        self.render_mode = render_mode
        self._optimal = self.params.optimal_first_action()
        self._state: np.ndarray | None = None
        self._first_action: int | None = None

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        brand = (options or {}).get("brand")
        self._state = self.dynamics.reset(self.np_random, 1, brand)
        self._first_action = None
        return self._state[0].copy(), self._info()

    def step(self, action):
        if self._state is None or self._state[0, 4] >= self.params.horizon:
            raise RuntimeError("step() called before reset() or after the episode ended")
        if not self.action_space.contains(action):
            raise InvalidActionError(f"invalid action {action!r}: expected 0 (repair) or 1 (do not repair)")
        if self._state[0, 4] == 0:
            self._first_action = int(action)
        self._state, reward, terminated = self.dynamics.step(self.np_random, self._state, np.array([int(action)]))
        return self._state[0].copy(), float(reward[0]), bool(terminated[0]), False, self._info()

    def _info(self) -> dict[str, Any]:
        brand = int(self._state[0, 3])
        info: dict[str, Any] = {"brand": brand, "optimal_first_action": int(self._optimal[brand])}
        if self._first_action is not None:
            info["first_decision_optimal"] = self._first_action == int(self._optimal[brand])
        return info

    def render(self):
        if self.render_mode == "ansi" and self._state is not None:
            return ", ".join(f"{n}={v}" for n, v in zip(COMPONENT_NAMES, self._state[0]))
        return None


class WatchRepairVectorEnv(VectorEnv):
    """`num_envs` watch-repair episodes stepped together in numpy (next-step autoreset).

    Infos are dicts of arrays: `brand`, `optimal_first_action`, and `first_action`
    (-1 before the first decision).
    """

    metadata = {"autoreset_mode": AutoresetMode.NEXT_STEP}

    def __init__(self, num_envs: int, **params: Any) -> None:
        self.num_envs = int(num_envs)
        self.dynamics = WatchRepairDynamics(WatchRepairParams(**params))
        self.single_observation_space = self.dynamics.observation_space()
        self.single_action_space = spaces.Discrete(2)
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, self.num_envs)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, self.num_envs)
        self._optimal = self.dynamics.params.optimal_first_action()
        self._state = np.zeros((self.num_envs, 5), dtype=np.int64)
        self._first_action = np.full(self.num_envs, -1)
        self._needs_reset = np.zeros(self.num_envs, dtype=bool)
        self._brand_option: int | None = None

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        if seed is not None:
            self._np_random, self._np_random_seed = gym.utils.seeding.np_random(seed)
        self._brand_option = (options or {}).get("brand")
        self._state = self.dynamics.reset(self.np_random, self.num_envs, self._brand_option)
        self._first_action[:] = -1
        self._needs_reset[:] = False
        return self._state.copy(), self._infos()

    def step(self, actions):
        actions = np.asarray(actions).reshape(self.num_envs)
        reward = np.zeros(self.num_envs)
        terminated = np.zeros(self.num_envs, dtype=bool)
        live = ~self._needs_reset
        if (~live).any():
            self._state[~live] = self.dynamics.reset(self.np_random, int((~live).sum()), self._brand_option)
            self._first_action[~live] = -1
        if live.any():
            first = live & (self._state[:, 4] == 0)
            self._first_action[first] = actions[first]
            self._state[live], reward[live], terminated[live] = self.dynamics.step(
                self.np_random, self._state[live], actions[live]
            )
        self._needs_reset = terminated.copy()
        return self._state.copy(), reward, terminated, np.zeros(self.num_envs, dtype=bool), self._infos()

    def _infos(self) -> dict[str, np.ndarray]:
        brand = self._state[:, 3].copy()
        return {"brand": brand, "optimal_first_action": self._optimal[brand], "first_action": self._first_action.copy()}
