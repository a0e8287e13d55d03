"""TextWorldExpress's eight games (Jansen & Côté 2023, the `textworld-express` package) as Gymnasium text envs.

`TextWorldExpressEnv(game="coin", game_params="numLocations=3", game_fold="train", max_turns=50)` plays one of
TextWorldExpress's games (`GAMES`: cookingworld, twc, coin, mapreader, arithmetic, sorting, simonsays,
peckingorder) on the package's own Java engine; `TextWorldExpress-<game>-v0` (e.g. `TextWorldExpress-coin-v0`) is
the same with `game` fixed. `game_params` are the game's generation parameters, as TextWorldExpress spells them
("numLocations=3,includeDoors=0", or a mapping {numLocations: 3}); each must be one the game knows, and the
engine must take its value (a parameter it ignores would silently play another game), else one ValueError line
naming it and the game's parameters. `reset(seed=s)` generates the game of seed s (modulo 2^31: the engine's seed is a
Java int) in `game_fold` (the engine's train / dev / test item sets); an unseeded reset draws the game's seed from the
env's generator.

What every text game of this project shares (`CommandGameEnv`, also the base of envs/textworld_game.py):

- Observation: the game's text, then the turn's valid commands ("Valid actions: ..."). No turn counter, so that
  the same game state reads the same in every rollout: the observation is GiGPO's anchor (the LLM arm anchors a
  turn on the observation it answers, algorithms/llm/training/batch.py).
- Action: text. ReAct answers work: the command is what follows the last "Action:" (else the last non-empty line),
  compared with the valid commands without regard to case, spacing, quotes, a trailing "()" or period. A command
  that is not valid this turn is answered with one "invalid action" line and the valid commands, is not sent to
  the game and changes nothing; the turn still counts.
- Reward: the change of the game's score; the episode terminates when the game is won or lost and is truncated
  after `max_turns` turns.
- `info` per step: `effect` (the executed valid command, None for an invalid answer: no executable effect),
  `state_mutating` (the game state's fingerprint changed, `GameView.fingerprint`; here the room
  description, the inventory, the raw score, the success and failure flags and the set of valid commands: the
  observation alone would also change on read-only commands such as "inventory" or "look around"),
  `execution_output` (the game's answer to the command), `valid_actions` (the next turn's valid commands, as
  `turn_alternatives()` gives them, vcbm_gym/contract.py), `score`; on the last step `is_success` and
  `task_goal_completion` (the game was won; evaluation only).
- Snapshot/restore (envs/snapshot.py): a game engine here cannot hand out its state as a picklable value, so a
  snapshot is the game's seed and the commands executed since reset (with the env's own counters and generator),
  and `restore` resets the game to that seed and replays the commands. The games are deterministic given their
  seed and commands, so this is an exact snapshot (TextWorldExpress's own `clone()` works the same way; a replay
  step costs ~0.4 ms here). There is nothing unrevealed to draw: an outcome seed changes nothing.

The Java engine: one JVM per process, shared by every env of the process (each env has its own game on it); py4j
starts it with `die_on_exit`, so it ends with the Python process. Without Java on PATH, or without the package
(the `textworld` extra), making the env is one line naming what is missing.
"""

from __future__ import annotations

import os
import re
import shutil
import string
import threading
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from envs.snapshot import SnapshotMixin

GAMES = ("cookingworld", "twc", "coin", "mapreader", "arithmetic", "sorting", "simonsays", "peckingorder")
FOLDS = ("train", "dev", "test")
CHARSET = frozenset(string.printable)
MAX_TEXT = 32768  # observations list every valid command: a cooking game's can run to a few thousand characters
MAX_SEED = 2**31 - 1  # the engine's seed is a Java int
INSTALL_HINT = "pip install -e '.[textworld]'"
JAVA_HINT = "TextWorldExpress runs on Java: install a Java runtime (e.g. OpenJDK 17: apt-get install openjdk-17-jre-headless)"
_ACTION = re.compile(r"action\s*:", re.IGNORECASE)
_SYSTEM_PROMPT = (
    "You are an agent playing a text game. Each turn you read the latest observation, which ends with the valid "
    "actions, think briefly, then choose exactly one of them. Answer in two lines:\n"
    "Thought: your reasoning in one or two sentences\n"
    "Action: one valid action, written exactly as listed, for example take coin\n"
    "Only the action line changes anything. An action that is not listed is answered with an error and wastes a turn."
)


def system_prompt(one_shot: bool = False) -> str:
    """The LLM arm's system prompt for the text games (`system_prompt: textgame`, algorithms.llm.generation.prompting)."""
    return _SYSTEM_PROMPT


class TextGameUnavailable(ValueError):
    """A text game cannot start on this machine (a system dependency such as Java is missing): one line. A ValueError,
    so that a CLI that turns an env constructor's ValueError into one line (algorithms.common.config.make_env) does."""


class TextGameNotInstalled(ModuleNotFoundError, TextGameUnavailable):
    """The `textworld` extra's package is missing (as bsuite's adapter reports bsuite: an import error to Python)."""


def require_java() -> None:
    if shutil.which("java") is None:
        raise TextGameUnavailable(f"no `java` executable on PATH: {JAVA_HINT}")


def _normal(command: str) -> str:
    return " ".join(command.casefold().split())


def parse_command(text: str, valid: tuple[str, ...]) -> str | None:
    """The valid command an answer names (module docstring), or None."""
    text = text or ""
    found = list(_ACTION.finditer(text))
    if found:
        line = text[found[-1].end() :].strip().splitlines()
        candidate = line[0] if line else ""
    else:
        lines = [line for line in text.splitlines() if line.strip()]
        candidate = lines[-1] if lines else ""
    candidate = candidate.strip().strip("`'\"").strip()
    candidate = candidate.removesuffix("()").rstrip(".").strip().strip("`'\"")
    wanted = _normal(candidate)
    for command in valid:
        if _normal(command) == wanted:
            return command
    return None


def printable(text: str, limit: int = MAX_TEXT) -> str:
    """`text` inside the Text space's charset and length: other characters become '?'."""
    clean = "".join(ch if ch in CHARSET else "?" for ch in text)
    return clean if len(clean) <= limit else clean[: limit - 3] + "..."


@dataclass(frozen=True)
class GameView:
    """What a game engine shows after a reset or a command."""

    text: str  # the game's answer (after a reset: the task and the opening scene)
    valid: tuple[str, ...]  # the valid commands now, sorted and distinct
    score: float
    won: bool
    lost: bool
    fingerprint: Hashable  # the game state's fingerprint: equal before and after a command that changed nothing


class CommandGameEnv(SnapshotMixin, gym.Env):
    """A text game whose engine takes commands (module docstring). A subclass starts its engine (`_engine_reset`,
    `_engine_step`) and names what a snapshot must match (`snapshot_identity`)."""

    metadata = {"render_modes": ["ansi"], "render_fps": 1}
    snapshot_fields = ("_game_seed", "_history", "_turn", "_last_obs", "_done")

    def __init__(self, max_turns: int, render_mode: str | None):
        if isinstance(max_turns, bool) or not isinstance(max_turns, (int, np.integer)) or max_turns < 1:
            raise ValueError(f"max_turns={max_turns!r}: expected an integer >= 1")
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode={render_mode!r}: expected one of {self.metadata['render_modes']}")
        self.max_turns, self.render_mode = int(max_turns), render_mode
        self.observation_space = spaces.Text(max_length=MAX_TEXT, min_length=0, charset=string.printable)
        self.action_space = spaces.Text(max_length=MAX_TEXT, min_length=0, charset=string.printable)
        self._view: GameView | None = None
        self._game_seed: int | None = None
        self._history: list[str] = []
        self._turn, self._last_obs, self._done = 0, "", True

    @property
    def game_seed(self) -> int | None:
        """The seed of the game being played (None before the first reset)."""
        return self._game_seed

    @property
    def game_view(self) -> GameView | None:
        """What the engine shows now: text, valid commands, score, flags and the state's fingerprint (None before the
        first reset)."""
        return self._view

    # --- what a game engine provides -----------------------------------------------------------
    def _engine_reset(self, game_seed: int) -> GameView:
        raise NotImplementedError

    def _engine_step(self, command: str) -> GameView:
        raise NotImplementedError

    # --- Gymnasium API -------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self._game_seed = int(seed) % (MAX_SEED + 1) if seed is not None else int(self.np_random.integers(MAX_SEED + 1))
        self._view = self._engine_reset(self._game_seed)
        self._history, self._turn, self._done = [], 0, False
        self._last_obs = self._observation(self._view.text)
        return self._last_obs, {"valid_actions": self._view.valid, "score": self._view.score}

    def step(self, action):
        if self._view is None or self._done:
            raise RuntimeError("step() called before reset() or after the episode ended")
        text = action if isinstance(action, str) else str(action)
        before = self._view
        command = parse_command(text, before.valid)
        self._turn += 1
        if command is None:
            output = f"invalid action {printable(text, 80)!r}: expected one of the valid actions listed."
        else:
            self._view = self._engine_step(command)
            self._history.append(command)
            output = self._view.text
        view = self._view
        terminated = bool(view.won or view.lost)
        truncated = not terminated and self._turn >= self.max_turns
        self._done = terminated or truncated
        self._last_obs = self._observation(output)
        info: dict[str, Any] = {
            "effect": command,
            "state_mutating": command is not None and view.fingerprint != before.fingerprint,
            "execution_output": printable(output),
            "valid_actions": view.valid,
            "score": view.score,
        }
        if self._done:
            info["is_success"] = bool(view.won)
            info["task_goal_completion"] = float(view.won)
        return self._last_obs, float(view.score - before.score), terminated, truncated, info

    def render(self):
        return self._last_obs if self.render_mode == "ansi" else None

    def turn_alternatives(self) -> tuple[str, ...]:
        """The valid commands of this turn (vcbm_gym/contract.py): each a distinct command the parser accepts."""
        if self._view is None or self._done:
            raise RuntimeError("turn_alternatives() called before reset() or after the episode ended")
        return self._view.valid

    # --- snapshot protocol: the seed and the commands, replayed ---------------------------------
    def restore_state(self, fields: dict[str, Any]) -> None:
        super().restore_state(fields)
        if self._game_seed is None:  # a snapshot taken before the first reset
            self._view = None
            return
        self._view = self._engine_reset(self._game_seed)
        for command in self._history:
            self._view = self._engine_step(command)

    def redraw_outcome(self, rng: np.random.Generator) -> None:
        """Nothing to redraw: the game is deterministic given its seed and the commands (module docstring)."""

    # --- internals -----------------------------------------------------------------------------
    def _observation(self, text: str) -> str:
        valid = ", ".join(self._view.valid) if self._view.valid else "(none)"
        return printable(f"{text.strip()}\n\nValid actions: {valid}")


def _game_params(game: str, game_params: str | Mapping[str, Any] | None) -> dict[str, int]:
    """{name: value} of `game_params` ("k=v,k=v" or a mapping of integer values); one ValueError line otherwise."""
    if game_params is None or game_params == "":
        return {}
    if isinstance(game_params, str):
        pairs = [part.split("=", 1) for part in game_params.split(",") if part.strip()]
        if any(len(pair) != 2 for pair in pairs):
            raise ValueError(f"game_params={game_params!r}: expected 'name=value' pairs separated by commas")
        items = [(name.strip(), value.strip()) for name, value in pairs]
    elif isinstance(game_params, Mapping):
        items = list(game_params.items())
    else:
        raise ValueError(f"game_params={game_params!r}: expected a 'name=value,...' string or a mapping")
    out: dict[str, int] = {}
    for name, value in items:
        try:
            number = int(value)
        except (TypeError, ValueError):
            number = None
        if number is None or isinstance(value, bool) or (isinstance(value, float) and value != number):
            raise ValueError(f"game_params {name}={value!r} for {game}: expected an integer value")
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z]\w*", name):
            raise ValueError(f"game_params {name!r} for {game}: expected a parameter name such as numLocations")
        out[name] = number
    return out


class _Engine:
    """The process's one TextWorldExpress JVM (py4j gateway), started on first use; a child process (after fork)
    starts its own, since a gateway's socket cannot be shared across processes."""

    _lock = threading.Lock()
    _holder: Any = None
    _pid: int | None = None

    @classmethod
    def game_interface(cls) -> Any:
        """A fresh game of the engine (textworldexpress.runtime.PythonInterface): one per env."""
        with cls._lock:
            if cls._holder is None or cls._pid != os.getpid():
                try:
                    from textworld_express import TextWorldExpressEnv
                except ImportError as exc:
                    raise TextGameNotInstalled(f"textworld-express is not installed: {INSTALL_HINT} ({exc})") from None
                require_java()
                # the package's own launcher (die_on_exit: the JVM ends with this process); its gateway serves
                # every env of the process, each with a game of its own
                cls._holder, cls._pid = TextWorldExpressEnv(), os.getpid()
            return cls._holder._gateway.jvm.textworldexpress.runtime.PythonInterface()


def _json(text: str) -> dict[str, Any]:
    import json

    return json.loads(text)


class TextWorldExpressEnv(CommandGameEnv):
    """One TextWorldExpress game as a Gymnasium text env (module docstring)."""

    def __init__(
        self,
        game: str = "coin",
        game_params: str | Mapping[str, Any] | None = None,
        game_fold: str = "train",
        max_turns: int = 50,
        render_mode: str | None = None,
    ):
        if game not in GAMES:
            raise ValueError(f"game={game!r}: expected one of {', '.join(GAMES)}")
        if game_fold not in FOLDS:
            raise ValueError(f"game_fold={game_fold!r}: expected one of {', '.join(FOLDS)}")
        super().__init__(max_turns, render_mode)
        self.game, self.game_fold = game, game_fold
        self.game_params = _game_params(game, game_params)
        self._params_text = ",".join(f"{name}={value}" for name, value in self.game_params.items())
        self._game = _Engine.game_interface()
        message = self._game.load(game, self._params_text)
        if message:
            raise ValueError(f"game_params {self._params_text!r} for {game}: {message.strip()}")
        self._check_params()

    def _check_params(self) -> None:
        """Every parameter asked for is one the game knows and took (the engine ignores names it does not know)."""
        if not self.game_params:
            return
        self._game.generateNewGameJSON(0, self.game_fold, False)
        taken = _json(self._game.getGenerationPropertiesJSON())
        known = sorted(name for name in taken if name != "seed")
        for name, value in self.game_params.items():
            if name not in known:
                raise ValueError(
                    f"game_params {name}={value} for {self.game}: no such parameter; expected one of {', '.join(known)}"
                )
            if int(taken[name]) != value:
                raise ValueError(
                    f"game_params {name}={value} for {self.game}: the engine generates {name}={taken[name]} instead "
                    "(a value outside the game's range)"
                )

    @property
    def params_text(self) -> str:
        """The game's parameters as the engine reads them ("numLocations=4,includeDoors=1")."""
        return self._params_text

    def snapshot_identity(self) -> tuple:
        return (self.game, self._params_text, self.game_fold, self.max_turns)

    def _view_of(self, response: dict[str, Any], text: str) -> GameView:
        valid = tuple(sorted(set(response["validActions"])))
        flags = (response["scoreRaw"], response["tasksuccess"], response["taskfailure"])
        fingerprint = (response["look"], response["inventory"], *flags, valid)
        return GameView(
            text=text,
            valid=valid,
            score=float(response["score"]),
            won=bool(response["tasksuccess"]),
            lost=bool(response["taskfailure"]),
            fingerprint=fingerprint,
        )

    def _engine_reset(self, game_seed: int) -> GameView:
        response = _json(self._game.generateNewGameJSON(game_seed, self.game_fold, False))
        task = self._game.getTaskDescription().strip()
        return self._view_of(response, f"{task}\n\n{response['observation'].strip()}")

    def _engine_step(self, command: str) -> GameView:
        response = _json(self._game.stepJSON(command))
        return self._view_of(response, response["observation"])

    def close(self):
        self._game = None  # the JVM stays for the process's other envs and ends with the process
        super().close()
