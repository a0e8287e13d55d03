"""Sokoban-v0: the Sokoban setting of the EMPO paper as a multi-turn text environment.

"One Act, Many Masks: Effect-Marginal Policy Optimization for Long-Horizon Agents" (2026; docs/papers/empo.md)
evaluates on Sokoban as the LLM-agent benchmarks set it up (after gym-sokoban): a 6 x 6 board with walls all around,
one box, one target, at most 15 interactions. The agent reads the board as text and answers with one move, `up`,
`down`, `left` or `right`; the player walks one cell that way, pushing a box in front of it when the cell behind the
box is free. The legend is the agent benchmarks' text one: `#` wall, `_` floor, `O` target, `X` box, `√` box on
target, `P` player, `S` player on target. gym-sokoban is not used: it is written for gym, not
Gymnasium, and is reported to break under numpy 2.

Boards are drawn per episode from `reset(seed=...)` by reverse play, as gym-sokoban draws them: the boxes start on
their targets and the player walks at random, pulling a box behind it now and then; since every pull undone is a
push, the board is solvable by construction. The number of pulls is drawn uniformly from [`min_pushes`, `max_pushes`]
(the difficulty knob: 1 to 3 is a board a tiny model can learn), and after the last one the player walks on at random
without pulling. A board is kept only when its fewest pushes to solve equal the drawn number and its shortest
solution fits in `max_steps` moves; the breadth-first solver (`Solution`) decides both, over every state the board can
reach (a 4 x 4 interior with one box has at most 16 x 15 of them). Up to `max_inner_walls` (default 2) floor cells
inside the border become walls, keeping the floor connected.

Reward. gym-sokoban pays -0.1 per step, +1 for a box pushed onto a target,
-1 for one pushed off and +10 when every box is on a target. This project studies credit assignment from delayed
reward, so by default only the outcome is paid: `solve_reward` (1.0) on the step that solves the board, which ends
the episode (terminated), 0 on every other step; an episode that runs out of its `max_steps` moves ends truncated
with nothing. The return is then the success the papers report (EMPO: GRPO 72.7% -> 84.4%), on the scale of the
project's other text envs. `step_penalty` (default 0) subtracts a cost per move (gym-sokoban's is 0.1 with
`solve_reward` 10); the box shaping terms are left out, as they would hand out the credit this project assigns.

Parsing is lenient, as in the other text envs: the last of the four direction words in the answer wins, in any case,
inside any other text ("Thought: the box is left of the target. Action: right"; "push up", "up()" and "<action>Up
</action>" all parse to "up"). An answer naming none of them is an invalid action: it uses a turn and changes nothing.

Observations are a function of the board alone, so that GiGPO's anchor key (the observation a turn answers) joins
the turns of a task's rollouts that face the same board: the first observation states the task, the legend, the
moves and the turn budget, then the board; every later one is the board, and at the end a line saying how it ended.
What a move did is the step's `execution_output`. With `describe` (default off) each board is followed by one line
in words (`board_description`): where each box and target lie from the player, then what the four cells next to it
hold ("Box: 1 up, 2 right. Target: 3 right. Up: floor. Down: wall. Left: floor. Right: box."). It is the same board,
still a function of the board alone, for a small model that cannot find the player's row and column in the grid.

`info` per step (vcbm_gym/contract.py): `state_mutating` (the player or a box moved), `execution_output` (what the
move did, in words: the VCBM bookmark key), `effect` (EMPO's canonical effect: "push up", "move up", ..., "no-op
(blocked)" for a move into a wall or an immovable box, or "invalid"), `action_optimal` (the move was on a shortest
solution from the board it answered), `moves_to_solve` (after the move; -1 where the board can no longer be solved)
and on the last step `task_goal_completion` (1.0 solved, 0.0 not) and `is_success`, with `difficulty` (the board's
fewest pushes to solve), by which the LLM arm splits its completion rate. All but the first three are for
evaluation only. `turn_alternatives()` lists the four moves, `optimal_alternative()` the first of them (in that
order) on a shortest solution, or None on a board that cannot be solved any more; the replay reference
(`algorithms/credit_reference/`) branches over them. `snapshot()` / `restore()` (envs/snapshot.py) copy the whole
small state; a move's result is decided by the board alone, so an outcome seed changes nothing.
`reset(options={"board": text})` plays a board written in the legend (`parse_board`) instead of a drawn one; its
`difficulty` is -1 where it cannot be solved.
"""

from __future__ import annotations

import math
import re
import string
from collections import deque
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from envs.snapshot import SnapshotMixin
from envs.text_watch_repair import _printable

DIRECTIONS = ("up", "down", "left", "right")
_DELTAS = {"up": (-1, 0), "down": (1, 0), "left": (0, -1), "right": (0, 1)}
_MOVE_PATTERN = re.compile(r"\b(up|down|left|right)\b", re.IGNORECASE)
WALL, FLOOR, TARGET, BOX, BOX_ON_TARGET, PLAYER, PLAYER_ON_TARGET = "#", "_", "O", "X", "√", "P", "S"
LEGEND = (
    f"{WALL} wall, {FLOOR} floor, {TARGET} target, {BOX} box, {BOX_ON_TARGET} box on target, {PLAYER} player, "
    f"{PLAYER_ON_TARGET} player on target"
)
BLOCKED = "no-op (blocked)"
INVALID = "invalid"
CHARSET = string.printable + BOX_ON_TARGET
MAX_TEXT = 8192
MAX_GENERATION_ATTEMPTS = 1000

Cell = tuple[int, int]
State = tuple[Cell, tuple[Cell, ...]]  # (player, boxes in sorted order)


def parse_move(text: str) -> str:
    """The canonical move of an answer: the last direction word it names, or "invalid"."""
    found = _MOVE_PATTERN.findall(text or "")
    return found[-1].casefold() if found else INVALID


def _step_state(walls: np.ndarray, state: State, move: str) -> tuple[State, str]:
    """The state after `move` and its kind: "move", "push" or "blocked"."""
    (r, c), boxes = state
    dr, dc = _DELTAS[move]
    ahead = (r + dr, c + dc)
    if walls[ahead]:
        return state, "blocked"
    if ahead not in boxes:
        return (ahead, boxes), "move"
    beyond = (r + 2 * dr, c + 2 * dc)
    if walls[beyond] or beyond in boxes:
        return state, "blocked"
    moved = tuple(sorted(beyond if b == ahead else b for b in boxes))
    return (ahead, moved), "push"


def _solved(state: State, targets: frozenset[Cell]) -> bool:
    return all(b in targets for b in state[1])


class Solution:
    """Breadth-first search over every state a board can reach from `start`: the fewest moves to solve from each
    reachable state (absent: it cannot be solved any more) and the fewest pushes to solve from `start`."""

    def __init__(self, walls: np.ndarray, targets: frozenset[Cell], start: State):
        edges: dict[State, list[tuple[str, State, str]]] = {}
        frontier, seen = deque([start]), {start}
        while frontier:
            state = frontier.popleft()
            edges[state] = []
            for move in DIRECTIONS:
                after, kind = _step_state(walls, state, move)
                edges[state].append((move, after, kind))
                if after not in seen:
                    seen.add(after)
                    frontier.append(after)
        reverse: dict[State, list[State]] = {s: [] for s in edges}
        for state, out in edges.items():
            for _, after, _ in out:
                reverse[after].append(state)
        self.moves_to_solve: dict[State, int] = {s: 0 for s in edges if _solved(s, targets)}
        queue = deque(self.moves_to_solve)
        while queue:
            state = queue.popleft()
            for before in reverse[state]:
                if before not in self.moves_to_solve:
                    self.moves_to_solve[before] = self.moves_to_solve[state] + 1
                    queue.append(before)
        self.edges = edges
        self.min_pushes = self._fewest_pushes(start, targets)

    def _fewest_pushes(self, start: State, targets: frozenset[Cell]) -> int | None:
        """0-1 breadth-first search: a push costs 1, a walk 0."""
        best, queue = {start: 0}, deque([start])
        while queue:
            state = queue.popleft()
            if _solved(state, targets):
                return best[state]
            for _, after, kind in self.edges[state]:
                cost = best[state] + (kind == "push")
                if cost < best.get(after, math.inf):
                    best[after] = cost
                    queue.appendleft(after) if kind != "push" else queue.append(after)
        return None

    def distance(self, state: State) -> int | None:
        return self.moves_to_solve.get(state)

    def optimal_moves(self, state: State) -> tuple[str, ...]:
        """The moves (in DIRECTIONS order) that start a shortest solution from `state`; () where none is left."""
        d = self.distance(state)
        if d is None or d == 0:
            return ()
        return tuple(m for m, after, _ in self.edges[state] if self.distance(after) == d - 1)

    def shortest_path(self, state: State) -> list[str]:
        """A shortest solution from `state` (the first optimal move at each step), [] where none is left."""
        path = []
        while self.optimal_moves(state):
            move = self.optimal_moves(state)[0]
            path.append(move)
            state = _step_state_from_edges(self.edges, state, move)
        return path


def _step_state_from_edges(edges: dict, state: State, move: str) -> State:
    return next(after for m, after, _ in edges[state] if m == move)


def _connected(walls: np.ndarray) -> bool:
    cells = list(zip(*np.nonzero(~walls)))
    if not cells:
        return False
    seen, frontier = {cells[0]}, [cells[0]]
    while frontier:
        r, c = frontier.pop()
        for dr, dc in _DELTAS.values():
            nxt = (r + dr, c + dc)
            if not walls[nxt] and nxt not in seen:
                seen.add(nxt)
                frontier.append(nxt)
    return len(seen) == len(cells)


def generate_board(
    rng: np.random.Generator, dim: int, num_boxes: int, min_pushes: int, max_pushes: int, max_steps: int, max_inner_walls: int
) -> tuple[np.ndarray, frozenset[Cell], State, Solution]:
    """(walls, targets, start state, its solution) of a board drawn by reverse play (module docstring)."""
    goal_pulls = int(rng.integers(min_pushes, max_pushes + 1))  # drawn once: retries keep the difficulty uniform
    for _ in range(MAX_GENERATION_ATTEMPTS):
        walls = np.zeros((dim, dim), bool)
        walls[[0, -1], :] = walls[:, [0, -1]] = True
        inner = [(int(r), int(c)) for r, c in zip(*np.nonzero(~walls))]
        for i in rng.choice(len(inner), size=int(rng.integers(max_inner_walls + 1)), replace=False):
            walls[inner[int(i)]] = True
        if not _connected(walls):
            continue
        floor = [(int(r), int(c)) for r, c in zip(*np.nonzero(~walls))]
        if len(floor) < num_boxes + 1:
            continue
        picks = rng.choice(len(floor), size=num_boxes + 1, replace=False)
        targets = frozenset(floor[int(i)] for i in picks[:num_boxes])
        player, boxes = floor[int(picks[-1])], set(targets)
        pulls = 0
        # after the last pull the player walks on without pulling, so that it does not always stand behind the box
        walk = int(rng.integers(2 * dim))
        for _ in range(20 * dim * dim):
            if pulls >= goal_pulls:
                if walk == 0:
                    break
                walk -= 1
            dr, dc = _DELTAS[DIRECTIONS[int(rng.integers(4))]]
            ahead, behind = (player[0] + dr, player[1] + dc), (player[0] - dr, player[1] - dc)
            if walls[ahead] or ahead in boxes:
                continue
            if pulls < goal_pulls and behind in boxes and rng.random() < 0.5:  # undoes a push of that box from `player`
                boxes.remove(behind)
                boxes.add(player)
                pulls += 1
            player = ahead
        start: State = (player, tuple(sorted(boxes)))
        if _solved(start, targets):
            continue
        solution = Solution(walls, targets, start)
        distance = solution.distance(start)
        # the pulls may undo each other: the board's difficulty is its fewest pushes, kept only at the drawn number
        if distance is not None and distance <= max_steps and solution.min_pushes == goal_pulls:
            return walls, targets, start, solution
    raise ValueError(
        f"no board of dim={dim} with num_boxes={num_boxes} that needs {goal_pulls} pushes (of min_pushes={min_pushes} to "
        f"max_pushes={max_pushes}) and is solvable "
        f"within max_steps={max_steps} moves ({MAX_GENERATION_ATTEMPTS} boards drawn): expected easier settings"
    )


def parse_board(text: str) -> tuple[np.ndarray, frozenset[Cell], State]:
    """(walls, targets, state) of a board written in the legend, one row a line (spaces between cells optional);
    ValueError (one line) for a board that is not square, not walled all around, or without one player and as many
    boxes as targets."""
    rows = [line.replace(" ", "") for line in text.strip().splitlines()]
    dim = len(rows)
    if dim < 3 or any(len(row) != dim for row in rows):
        raise ValueError(f"board {text!r}: expected a square of at least 3 rows of equal length")
    walls, targets, boxes, players = np.zeros((dim, dim), bool), set(), [], []
    for r, row in enumerate(rows):
        for c, ch in enumerate(row):
            if ch not in (WALL, FLOOR, TARGET, BOX, BOX_ON_TARGET, PLAYER, PLAYER_ON_TARGET):
                raise ValueError(f"board cell {ch!r} at row {r}, column {c}: expected one of the legend's ({LEGEND})")
            walls[r, c] = ch == WALL
            if ch in (TARGET, BOX_ON_TARGET, PLAYER_ON_TARGET):
                targets.add((r, c))
            if ch in (BOX, BOX_ON_TARGET):
                boxes.append((r, c))
            if ch in (PLAYER, PLAYER_ON_TARGET):
                players.append((r, c))
    border = np.ones((dim, dim), bool)
    border[1:-1, 1:-1] = False
    if not walls[border].all():
        raise ValueError(f"board {text!r}: expected walls ({WALL}) all around")
    if len(players) != 1 or not boxes or len(boxes) != len(targets):
        raise ValueError(
            f"board {text!r}: {len(players)} players, {len(boxes)} boxes, {len(targets)} targets: expected one player "
            "and as many boxes as targets (at least one)"
        )
    return walls, frozenset(targets), (players[0], tuple(sorted(boxes)))


def _positive_int(name: str, value: Any, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < least:
        raise ValueError(f"{name}={value!r}: expected an integer >= {least}")
    return int(value)


class SokobanEnv(SnapshotMixin, gym.Env):
    """Sokoban as text: observation and action are strings (gymnasium.spaces.Text)."""

    # reset(options=...) key: "board", a board in the legend (parse_board) played instead of a drawn one
    metadata = {"render_modes": ["ansi"], "render_fps": 1, "reset_options": ("board",)}
    snapshot_fields = ("_walls", "_targets", "_state", "_solution", "_turn", "_done", "_difficulty", "_last_obs")

    def __init__(
        self,
        dim: int = 6,
        num_boxes: int = 1,
        max_steps: int = 15,
        min_pushes: int = 1,
        max_pushes: int = 3,
        max_inner_walls: int = 2,
        solve_reward: float = 1.0,
        step_penalty: float = 0.0,
        describe: bool = False,
        render_mode: str | None = None,
    ):
        self.dim = _positive_int("dim", dim, 4)
        self.num_boxes = _positive_int("num_boxes", num_boxes, 1)
        self.max_steps = _positive_int("max_steps", max_steps, 1)
        self.min_pushes = _positive_int("min_pushes", min_pushes, 1)
        self.max_pushes = _positive_int("max_pushes", max_pushes, 1)
        self.max_inner_walls = _positive_int("max_inner_walls", max_inner_walls, 0)
        if self.max_pushes < self.min_pushes:
            raise ValueError(f"max_pushes={max_pushes}: expected an integer >= min_pushes={min_pushes}")
        interior = (self.dim - 2) ** 2
        if self.num_boxes + 1 + self.max_inner_walls > interior:
            raise ValueError(
                f"num_boxes={num_boxes}, max_inner_walls={max_inner_walls}: expected room for the boxes, the player and "
                f"the walls inside the {interior} interior cells of a {self.dim} x {self.dim} board"
            )
        for name, value in (("solve_reward", solve_reward), ("step_penalty", step_penalty)):
            if (
                isinstance(value, bool)
                or not isinstance(value, (int, float, np.integer, np.floating))
                or not math.isfinite(value)
            ):
                raise ValueError(f"{name}={value!r}: expected a finite number")
        if not solve_reward > 0 or step_penalty < 0:
            raise ValueError(
                f"solve_reward={solve_reward}, step_penalty={step_penalty}: expected solve_reward > 0 and step_penalty >= 0"
            )
        self.solve_reward, self.step_penalty = float(solve_reward), float(step_penalty)
        if not isinstance(describe, (bool, np.bool_)):
            raise ValueError(f"describe={describe!r}: expected true or false")
        self.describe = bool(describe)
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode={render_mode!r}: expected one of {self.metadata['render_modes']}")
        self.render_mode = render_mode
        self.observation_space = spaces.Text(max_length=MAX_TEXT, min_length=0, charset=CHARSET)
        self.action_space = spaces.Text(max_length=MAX_TEXT, min_length=0, charset=string.printable)
        self._state: State | None = None
        self._turn, self._done, self._last_obs = 0, True, ""

    def snapshot_identity(self) -> tuple:
        return (self.dim, self.num_boxes, self.max_steps, self.min_pushes, self.max_pushes, self.max_inner_walls,
                self.solve_reward, self.step_penalty, self.describe)  # fmt: skip

    def redraw_outcome(self, rng: np.random.Generator) -> None:
        """Nothing to redraw: a move's result is decided by the board alone."""

    # --- Gymnasium API -------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        board = (options or {}).get("board")
        if board is not None:
            self._walls, self._targets, self._state = parse_board(str(board))
            if self._walls.shape != (self.dim, self.dim) or len(self._targets) != self.num_boxes:
                raise ValueError(
                    f"board of {self._walls.shape[0]} rows and {len(self._targets)} boxes: expected dim={self.dim} rows "
                    f"and num_boxes={self.num_boxes}"
                )
            self._solution = Solution(self._walls, self._targets, self._state)
        else:
            self._walls, self._targets, self._state, self._solution = generate_board(
                self.np_random, self.dim, self.num_boxes, self.min_pushes, self.max_pushes, self.max_steps, self.max_inner_walls
            )
        self._difficulty = -1 if self._solution.min_pushes is None else int(self._solution.min_pushes)
        self._turn, self._done = 0, False
        box = "the box" if self.num_boxes == 1 else "every box"
        self._last_obs = (
            f"Sokoban: push {box} ({BOX}) onto a target ({TARGET}). Legend: {LEGEND}. Each turn answer with one move: "
            f"up, down, left or right. Walking into a box pushes it; a box cannot be pulled, and a box against a wall "
            f"or another box does not move. You have {self.max_steps} moves.\n{self.board_view()}"
        )
        distance = self._solution.distance(self._state)
        return self._last_obs, {"difficulty": self._difficulty, "moves_to_solve": -1 if distance is None else int(distance)}

    def step(self, action):
        if self._state is None or self._done:
            raise RuntimeError("step() called before reset() or after the episode ended")
        text = action if isinstance(action, str) else str(action)
        move = parse_move(text)
        before = self._state
        # a board with no solution left has no optimal move: None, so that its turns leave the optimal-move rate
        optimal = None if self._solution.distance(before) is None else move in self._solution.optimal_moves(before)
        if move == INVALID:
            effect, output = INVALID, f"invalid action {_printable(text)!r}: expected one of up, down, left, right."
        else:
            self._state, kind = _step_state(self._walls, before, move)
            if kind == "blocked":
                effect, output = BLOCKED, f"You cannot move {move}: the way is blocked. Nothing moves."
            elif kind == "push":
                effect, output = f"push {move}", f"You push the box {move}."
            else:
                effect, output = f"move {move}", f"You move {move}."
        self._turn += 1
        solved = _solved(self._state, self._targets)
        truncated = not solved and self._turn >= self.max_steps
        self._done = solved or truncated
        reward = (self.solve_reward if solved else 0.0) - self.step_penalty
        distance = self._solution.distance(self._state)
        obs = self.board_view()
        if solved:
            obs += f"\nSolved: {'the box is' if self.num_boxes == 1 else 'every box is'} on a target."
        elif truncated:
            obs += f"\nOut of moves: the board is not solved after {self.max_steps} moves."
        self._last_obs = obs
        info: dict[str, Any] = {
            "state_mutating": self._state != before,
            "execution_output": output,
            "effect": effect,
            "action_optimal": optimal,
            "moves_to_solve": -1 if distance is None else int(distance),
        }
        if self._done:
            info.update(task_goal_completion=float(solved), is_success=bool(solved), difficulty=self._difficulty)
        return obs, float(reward), bool(solved), bool(truncated), info

    def render(self):
        return self._last_obs if self.render_mode == "ansi" else None

    # --- the env contract's finite alternatives ------------------------------------------------
    def turn_alternatives(self) -> tuple[str, ...]:
        """The four moves: the turn's finite alternatives (vcbm_gym/contract.py)."""
        return DIRECTIONS

    def optimal_alternative(self) -> str | None:
        """The first move (in DIRECTIONS order) on a shortest solution, None where the board cannot be solved."""
        if self._state is None or self._done:
            raise RuntimeError("optimal_alternative() asked for before reset() or after the episode ended")
        moves = self._solution.optimal_moves(self._state)
        return moves[0] if moves else None

    # --- internals -----------------------------------------------------------------------------
    def board_view(self) -> str:
        """What an observation shows of the board: its text, and with `describe` its description below it."""
        return f"{self.board_text()}\n{self.board_description()}" if self.describe else self.board_text()

    def board_description(self) -> str:
        """The board from the player's place, in words: where each box and target lies from the player (rows, then
        columns), then what each of the four cells next to the player holds. For example
        "Box: 1 up, 2 right. Target: 1 up, 3 right. Up: floor. Down: wall. Left: floor. Right: floor."."""
        player, boxes = self._state
        names = {WALL: "wall", FLOOR: "floor", TARGET: "target", BOX: "box", BOX_ON_TARGET: "box on target"}

        def offset(cell: Cell) -> str:
            dr, dc = cell[0] - player[0], cell[1] - player[1]
            parts = [f"{abs(dr)} {'up' if dr < 0 else 'down'}"] if dr else []
            parts += [f"{abs(dc)} {'left' if dc < 0 else 'right'}"] if dc else []
            return ", ".join(parts) or "here"

        places = [f"Box: {offset(b)}." for b in boxes] + [f"Target: {offset(t)}." for t in sorted(self._targets)]
        neighbours = []
        for move in DIRECTIONS:
            cell = (player[0] + _DELTAS[move][0], player[1] + _DELTAS[move][1])
            neighbours.append(f"{move.capitalize()}: {names[self._cell_char(cell)]}.")
        return " ".join(places + neighbours)

    def _cell_char(self, cell: Cell) -> str:
        """The legend's character of a cell, the player left out."""
        on_target = cell in self._targets
        if self._walls[cell]:
            return WALL
        if cell in self._state[1]:
            return BOX_ON_TARGET if on_target else BOX
        return TARGET if on_target else FLOOR

    def board_text(self) -> str:
        """The board, one row a line, cells separated by spaces (so that a word-level tokenizer reads each cell)."""
        player = self._state[0]
        rows = []
        for r in range(self.dim):
            cells = []
            for c in range(self.dim):
                if (r, c) == player:
                    cells.append(PLAYER_ON_TARGET if (r, c) in self._targets else PLAYER)
                else:
                    cells.append(self._cell_char((r, c)))
            rows.append(" ".join(cells))
        return "\n".join(rows)
