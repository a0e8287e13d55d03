"""TextWorld games (Côté et al. 2018, the `textworld` package) as Gymnasium text envs.

- `TextWorld-v0` (`TextWorldGameEnv(game_file=...)`) plays any game file TextWorld compiled (`.z8` / `.ulx`, e.g.
  from `tw-make`), through TextWorld's own Gym-free API: `textworld.start(path, request_infos=EnvInfos(...))` with
  the admissible commands, won / lost, the score, the objective, the room description and the world's facts.
- `TextWorldCooking-v0` (`TextWorldCookingEnv`) plays the cooking games of TextWorld's `tw-cooking` challenge (the
  First TextWorld Problems' games; `tw-make tw-cooking --recipe 1 --take 1 --go 1 ...`), generated offline with
  TextWorld's generator from Python (`textworld.challenges.tw_cooking.cooking.make`, `compile_game`). The
  challenge's settings are constructor arguments (recipe, take, go, open, cook, cut, drop, split); `reset(seed=s)`
  plays the game of seed `s % n_games` (a task set of `n_games` games). Generating one takes several seconds, so
  each is cached on disk: in `cache_dir`, else `$VCBM_TEXTWORLD_CACHE`, else `$XDG_CACHE_HOME/vcbm-gym/textworld`
  (`~/.cache/...`), one folder per game named by a hash of the generator, TextWorld's version, the settings and
  the seed, with those parameters in its `params.json`. A folder is written under a temporary name and renamed
  into place when complete (never half-written), and one whose `params.json` differs from the parameters asked
  for is refused, never played.

Both are `CommandGameEnv`s (envs/textworld_express.py): the observation is the game's text followed by the valid
(admissible) commands, GiGPO's anchor; actions are text, a ReAct "Action: ..." line works; the reward is the change
of the game's score, the episode terminates when the game is won or lost and is truncated after `max_turns`; `info`
has `effect` (the executed command, None for an invalid answer), `execution_output`, `valid_actions`, `score` and,
on the last step, `is_success` / `task_goal_completion` (the game was won). `state_mutating` compares the world's
facts (TextWorld's logical state of the game, `EnvInfos(facts=True)`) before and after the command: "look",
"examine ..." and "inventory" leave them unchanged.

Snapshot/restore (envs/snapshot.py): TextWorld can copy a running game (`env.copy()`), but the copy is a live object
around the game's interpreter, not a picklable value a snapshot can hold, and it took 0.18 s here against ~0.04 s for
a reset and ~10 ms a command to replay. So, as for TextWorldExpress, a snapshot is the game (its seed, for the
cooking games) and the commands executed since reset, and `restore` resets the game and replays them: TextWorld's
games are deterministic given the commands, so the snapshot is exact and an outcome seed changes nothing.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Any

from envs.textworld_express import INSTALL_HINT, CommandGameEnv, GameView, TextGameNotInstalled

CACHE_ENV_VAR = "VCBM_TEXTWORLD_CACHE"
COOKING_LOCATIONS = (1, 6, 9, 12)  # the tw-cooking challenge's map sizes
COOKING_SPLITS = ("train", "valid", "test")


def _textworld():
    try:
        import textworld
    except ImportError as exc:
        raise TextGameNotInstalled(f"textworld is not installed: {INSTALL_HINT} ({exc})") from None
    return textworld


def default_cache_dir() -> Path:
    if os.environ.get(CACHE_ENV_VAR):
        return Path(os.environ[CACHE_ENV_VAR])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "vcbm-gym" / "textworld"


class _TextWorldGame:
    """One TextWorld game file, started with the infos the envs read."""

    def __init__(self, path: Path):
        textworld = _textworld()
        infos = textworld.EnvInfos(
            admissible_commands=True, won=True, lost=True, score=True, max_score=True, facts=True, objective=True,
            description=True, feedback=True,
        )  # fmt: skip
        with warnings.catch_warnings():
            # Jericho's note that it cannot track a TextWorld game's score itself: TextWorld tracks it (the infos above)
            warnings.filterwarnings("ignore", message=r"Game .* is not fully supported")
            self.env = textworld.start(str(path), request_infos=infos)

    @staticmethod
    def view(state: Any, text: str) -> GameView:
        return GameView(
            text=text,
            valid=tuple(sorted(set(state["admissible_commands"]))),
            score=float(state["score"] or 0),
            won=bool(state["won"]),
            lost=bool(state["lost"]),
            fingerprint=frozenset(map(str, state["facts"])),
        )

    def reset(self) -> GameView:
        state = self.env.reset()
        objective, description = (state["objective"] or "").strip(), (state["description"] or "").strip()
        return self.view(state, f"{objective}\n\n{description}" if objective else description)

    def step(self, command: str) -> GameView:
        state, _, _ = self.env.step(command)
        # the interpreter's prompt (">") closes every answer: not part of what the game says
        return self.view(state, (state["feedback"] or "").strip().removesuffix(">").strip())


def _file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


class TextWorldGameEnv(CommandGameEnv):
    """A TextWorld game file as a Gymnasium text env (module docstring); `reset(seed)` seeds only the env's own
    generator: the game is the file's."""

    def __init__(self, game_file: str | os.PathLike | None = None, max_turns: int = 50, render_mode: str | None = None):
        if game_file is None:
            raise ValueError("game_file=None: expected the path of a TextWorld game file (.z8 or .ulx, e.g. made by tw-make)")
        path = Path(game_file).expanduser()
        if not path.is_file():
            raise ValueError(f"game_file={str(game_file)!r}: no such file; expected a TextWorld game file (.z8 or .ulx)")
        super().__init__(max_turns, render_mode)
        self.game_file = path.resolve()
        self._digest = _file_digest(self.game_file)
        self._game = _TextWorldGame(self.game_file)

    def snapshot_identity(self) -> tuple:
        return (str(self.game_file), self._digest, self.max_turns)

    def _engine_reset(self, game_seed: int) -> GameView:
        return self._game.reset()

    def _engine_step(self, command: str) -> GameView:
        return self._game.step(command)


class TextWorldCookingEnv(CommandGameEnv):
    """TextWorld's tw-cooking games, generated offline from a seed and cached (module docstring)."""

    def __init__(
        self,
        recipe: int = 1,
        take: int = 1,
        go: int = 1,
        open: bool = False,  # noqa: A002 (the challenge's own name for the setting)
        cook: bool = False,
        cut: bool = False,
        drop: bool = False,
        split: str = "train",
        n_games: int = 8,
        cache_dir: str | os.PathLike | None = None,
        max_turns: int = 50,
        render_mode: str | None = None,
    ):
        for name, value, low in (("recipe", recipe, 1), ("take", take, 0), ("n_games", n_games, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name}={value!r}: expected an integer >= {low}")
        if take > recipe:
            raise ValueError(f"take={take}: expected at most recipe={recipe} (the ingredients to find are the recipe's)")
        if isinstance(go, bool) or go not in COOKING_LOCATIONS:
            raise ValueError(f"go={go!r}: expected one of {', '.join(map(str, COOKING_LOCATIONS))} (the number of rooms)")
        for name, value in (("open", open), ("cook", cook), ("cut", cut), ("drop", drop)):
            if not isinstance(value, bool):
                raise ValueError(f"{name}={value!r}: expected true or false")
        if split not in COOKING_SPLITS:
            raise ValueError(f"split={split!r}: expected one of {', '.join(COOKING_SPLITS)}")
        super().__init__(max_turns, render_mode)
        self.settings = {
            "recipe": recipe, "take": take, "go": go, "open": open, "cook": cook, "cut": cut, "drop": drop, "split": split,
        }  # fmt: skip
        self.n_games = n_games
        self.cache_dir = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
        if self.cache_dir.exists() and not self.cache_dir.is_dir():
            raise ValueError(f"cache_dir={str(self.cache_dir)!r} is a file: expected a directory (new or existing)")
        self._version = _textworld().__version__
        self._games: dict[int, _TextWorldGame] = {}
        self._game: _TextWorldGame | None = None

    def snapshot_identity(self) -> tuple:
        return (tuple(sorted(self.settings.items())), self.n_games, self._version, self.max_turns)

    def game_params(self, game_seed: int) -> dict[str, Any]:
        """What the game of `game_seed` is made from: its cache folder's name hashes it, its params.json holds it."""
        return {"generator": "tw-cooking", "textworld": self._version, "settings": self.settings, "seed": game_seed}

    def game_folder(self, game_seed: int) -> Path:
        """The cache folder of the game of `game_seed` (named by a hash of its parameters), made or not."""
        digest = hashlib.sha256(json.dumps(self.game_params(game_seed), sort_keys=True).encode()).hexdigest()[:20]
        return self.cache_dir / f"tw-cooking-seed{game_seed}-{digest}"

    def game_path(self, game_seed: int) -> Path:
        """The game file of `game_seed`, generated on first use (module docstring)."""
        params, folder = self.game_params(game_seed), self.game_folder(game_seed)
        if not folder.exists():
            self._generate(params, folder)
        made = folder / "params.json"
        try:
            recorded = json.loads(made.read_text())
        except (OSError, ValueError):
            recorded = None
        if recorded != params or not (folder / "game.z8").is_file():
            raise ValueError(
                f"cache folder {str(folder)!r} does not hold a game made under {json.dumps(params, sort_keys=True)} "
                f"(its params.json: {json.dumps(recorded, sort_keys=True)}): remove it to generate the game again"
            )
        return folder / "game.z8"

    def _generate(self, params: dict[str, Any], folder: Path) -> None:
        textworld = _textworld()
        from textworld.challenges.tw_cooking import cooking
        from textworld.generator import compile_game

        self.cache_dir.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=".making-", dir=self.cache_dir))
        try:
            options = textworld.GameOptions()
            options.seeds = params["seed"]
            options.path = str(work / "game.z8")
            options.force_recompile = True
            game = cooking.make({**self.settings, "recipe_seed": 0}, options)
            compile_game(game, options)
            (work / "params.json").write_text(json.dumps(params, sort_keys=True))
            try:
                os.rename(work, folder)  # whole or not at all
            except OSError:
                if not folder.exists():  # not another process that finished the same game first
                    raise
        finally:
            with contextlib.suppress(FileNotFoundError):
                shutil.rmtree(work)

    def _engine_reset(self, game_seed: int) -> GameView:
        index = game_seed % self.n_games
        if index not in self._games:
            self._games[index] = _TextWorldGame(self.game_path(index))
        self._game = self._games[index]
        return self._game.reset()

    def _engine_step(self, command: str) -> GameView:
        return self._game.step(command)
