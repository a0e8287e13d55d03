"""LinearKeyToDoor-v0: COCOA's linear key-to-door conveyor (docs/papers/cocoa.md).

Meulemans et al., NeurIPS 2023, "Would I have gotten that reward? Long-term credit assignment by
counterfactual contribution analysis", arXiv:2306.16803 (the "treasure conveyor"; code seijin-kobayashi/cocoa,
`ccoa/envs/treasure_conveyor.py`, with the settings of `configs/canonical_conveyorlength_performance.py`).

The agent rides a conveyor of `length` cells, one cell per step, and acts once on each cell, so an episode is
`length` steps. Cell 0 holds the key, cells 1 .. length - 3 an apple (left or right, each with probability
distractor_prob / 2) or nothing, cell length - 2 the door, and the last cell holds the treasure if the door was
opened, else nothing. Actions: 0 pick key, 1 pick left apple, 2 pick right apple, 3 open door. On a cell:
- the key is taken by action 0 on cell 0 (any other action leaves it; the conveyor moves on);
- an apple is eaten by the action of its side (1 on a left apple, 2 on a right one) and pays 0.1 or 0.9 (equal
  odds, drawn at that step) times 23 / length;
- the door opens by action 3 on the door cell, and only with the key;
- the treasure, 0.2 x 23 / length, is paid on the last cell whatever the action there.
Any other action on a cell does nothing. The delay between the key (step 0) and the treasure (step length - 1)
is the point of the task: the apples' rewards in between are noise for the key's credit.

COCOA's canonical runs keep one apple layout for the whole run (`random_distractors=False`): the cells 1 .. L - 3
are drawn once, `numpy.random.default_rng(2022).choice([0, 1, 2], size=L - 3, p=...)`; `layout_seed` (default
2022) reproduces exactly that layout. `random_layout=True` draws a fresh layout at every reset instead (COCOA's
`random_distractors=True`). A reset seed fixes the episode: the apples' values, and the layout when random.

Observation: (position, cell content, has_key) as `MultiDiscrete([length + 1, 6, 2])`, the cell coded as
COCOA's THINGS (0 empty, 1 left apple, 2 right apple, 3 door, 4 key, 5 treasure). COCOA's network reads the
position (as a fraction), the cell one-hot and the key count; these are the same facts as integers, and they are
the state of the exact MDP of `vcbm_gym.exact_gradient.key_to_door_mdp`. After the last step the position is
`length` and the cell empty.

`info` on the last step: `first_decision_optimal` (the key was picked: the first decision is the one the
treasure depends on, and cell 0 holds no apple, so picking the key costs nothing) and `is_success` (the treasure
was paid); both evaluation only (the env contract, vcbm_gym/contract.py).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

LENGTHS = (23, 43, 63, 83, 103)  # COCOA's conveyor lengths (Meulemans et al. 2023, its length sweeps)
PICK_KEY, PICK_LEFT, PICK_RIGHT, OPEN_DOOR = 0, 1, 2, 3
EMPTY, APPLE_LEFT, APPLE_RIGHT, DOOR, KEY, TREASURE = 0, 1, 2, 3, 4, 5
N_CELLS = 6
COCOA_LAYOUT_SEED = 2022  # configs/canonical_conveyorlength_performance.py: config.seed
DISTRACTOR_PROB = 0.8
APPLE_VALUES = (0.1, 0.9)  # equal odds; times 23 / length
TREASURE_VALUE = 0.2  # times 23 / length
REFERENCE_LENGTH = 23  # the rewards' scale 23 / length keeps the apples' total comparable across lengths


def reward_scale(length: int) -> float:
    """COCOA's 23 / L: every reward is scaled so that a longer conveyor pays no more apples in all."""
    return REFERENCE_LENGTH / length


def cell_step(cell: int, has_key: bool, action: int) -> tuple[bool, bool, bool]:
    """The law of one cell: (apple eaten, key taken, door opened) for `action` on `cell`.

    One function for the env and for its exact MDP (vcbm_gym.exact_gradient), so the two cannot disagree.
    COCOA `treasure_conveyor.py` `__step`: get_distractor, remove_key, open_door.
    """
    apple = (cell == APPLE_LEFT and action == PICK_LEFT) or (cell == APPLE_RIGHT and action == PICK_RIGHT)
    key = cell == KEY and action == PICK_KEY
    door = cell == DOOR and has_key and action == OPEN_DOOR
    return apple, key, door


def middle_cell_probs(distractor_prob: float) -> np.ndarray:
    """P(empty), P(left apple), P(right apple) of a middle cell (COCOA's `p` for cells 1 .. L - 3)."""
    return np.array([1.0 - distractor_prob, distractor_prob / 2, distractor_prob / 2])


def draw_layout(length: int, distractor_prob: float, rng: np.random.Generator) -> np.ndarray:
    """The cells before the agent moves: key, apples, door, and an empty last cell (COCOA's grid at reset).

    The one draw `rng.choice([0, 1, 2], size=length - 3, p=...)` is COCOA's, so a generator seeded 2022 gives
    the canonical runs' layout.
    """
    grid = np.zeros(length, dtype=np.int64)
    grid[1:-2] = rng.choice(np.array([EMPTY, APPLE_LEFT, APPLE_RIGHT]), size=length - 3, p=middle_cell_probs(distractor_prob))
    grid[0], grid[-2], grid[-1] = KEY, DOOR, EMPTY
    return grid


class LinearKeyToDoorEnv(gym.Env):
    """The task of the module docstring; every constant is a constructor argument."""

    metadata = {"render_modes": ["ansi"], "render_fps": 4}

    def __init__(
        self,
        length: int = 23,
        distractor_prob: float = DISTRACTOR_PROB,
        layout_seed: int = COCOA_LAYOUT_SEED,
        random_layout: bool = False,
        render_mode: str | None = None,
    ) -> None:
        if isinstance(length, bool) or not isinstance(length, (int, np.integer)) or int(length) not in LENGTHS:
            raise ValueError(f"length={length!r}: expected one of COCOA's conveyor lengths {LENGTHS}")
        if isinstance(distractor_prob, bool) or not isinstance(distractor_prob, (int, float)) or not 0 <= distractor_prob <= 1:
            raise ValueError(f"distractor_prob={distractor_prob!r}: expected a number in [0, 1]")
        if isinstance(layout_seed, bool) or not isinstance(layout_seed, (int, np.integer)) or layout_seed < 0:
            raise ValueError(f"layout_seed={layout_seed!r}: expected an integer >= 0")
        if not isinstance(random_layout, (bool, np.bool_)):
            raise ValueError(f"random_layout={random_layout!r}: expected a bool")
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode={render_mode!r}: expected one of {self.metadata['render_modes']}")
        self.length, self.distractor_prob = int(length), float(distractor_prob)
        self.layout_seed, self.random_layout, self.render_mode = int(layout_seed), bool(random_layout), render_mode
        self.scale = reward_scale(self.length)
        self.fixed_layout = draw_layout(self.length, self.distractor_prob, np.random.default_rng(self.layout_seed))
        self.observation_space = spaces.MultiDiscrete([self.length + 1, N_CELLS, 2], dtype=np.int64)
        self.action_space = spaces.Discrete(4)
        self._grid = self.fixed_layout.copy()
        self._position, self._has_key, self._treasure = 0, False, False
        self._started = False

    def _cell(self) -> int:
        return int(self._grid[self._position]) if self._position < self.length else EMPTY

    def _observation(self) -> np.ndarray:
        return np.array([self._position, self._cell(), int(self._has_key)], dtype=np.int64)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self._grid = (
            draw_layout(self.length, self.distractor_prob, self.np_random) if self.random_layout else self.fixed_layout.copy()
        )
        self._position, self._has_key, self._treasure, self._started = 0, False, False, True
        return self._observation(), {}

    def step(self, action):
        if not self._started or self._position >= self.length:
            raise RuntimeError("step() called before reset() or after the episode ended")
        if isinstance(action, (bool, np.bool_)) or not self.action_space.contains(action):
            raise ValueError(f"invalid action {action!r}: expected 0 (key), 1 (left apple), 2 (right apple) or 3 (door)")
        cell = self._cell()
        apple, key, door = cell_step(cell, self._has_key, int(action))
        reward = 0.0
        if apple:
            reward += APPLE_VALUES[int(self.np_random.integers(len(APPLE_VALUES)))] * self.scale
        if cell == TREASURE:
            reward += TREASURE_VALUE * self.scale
            self._treasure = True
        self._has_key = self._has_key or key
        self._position += 1
        if door:
            # COCOA writes the treasure into the last cell when the agent leaves the door with it open.
            self._grid[-1] = TREASURE
        terminated = self._position == self.length
        info: dict[str, Any] = {}
        if terminated:
            info = {"first_decision_optimal": self._has_key, "is_success": self._treasure}
        return self._observation(), float(reward), terminated, False, info

    def render(self):
        if self.render_mode == "ansi" and self._started:
            return f"position={self._position}/{self.length}, cell={self._cell()}, has_key={int(self._has_key)}"
        return None
