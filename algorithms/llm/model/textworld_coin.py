"""The tiny models on TextWorldExpress-coin-v0 (envs/textworld_express.py): their vocabulary and warm start.

The shared tiny vocabulary has no word for the rooms, the furniture or the commands of TextWorldExpress ("move north",
"take coin"), so on coin a tiny model could neither read the scene nor name a command. `COIN` (an `EnvTinyModel`,
algorithms/llm/model/env_models.py) gives it models of its own:

- vocabulary: the game's observations (its scene and the turn's valid commands) under uniformly random valid
  commands, boards 0-39 at `COIN_KWARGS`, and every command seen written in the answer format, `Action: <command>`
  (what the env's parser reads: the text after the last "Action:");
- warm start: SFT on the turns of a scripted policy that plays the gold command with probability `GOLD_RATE` and a
  uniformly random valid command otherwise, boards 10,000 + i.

The gold command is the first of a shortest winning command sequence from the current game state. TextWorldExpress's
own gold path (`getGoldActionSequence`) is an exploration walk that differs between calls for the same seed, so the
warm start's data (and its cache key) would not be reproducible: the game graph of the board is searched here instead,
breadth-first from its start, over the engine's states (`GameView.fingerprint`), replaying commands from the seed.
Every state the game can reach is in that graph, so there is a gold command wherever the agent has wandered.

Settings (`COIN_KWARGS`, also the coin entry of zoo_configs/llm-base.yml): 4 rooms with doors to open, no distractor
items, 10 turns. Share of 200 boards (seeds 10,000-10,199) the scripted policy wins, at gold rates 0 / 0.1 / 0.25 /
0.5 / 1 (random commands drawn from a generator of seed 0):

- 3 rooms, no doors, 20 turns: 76.5% / 89% / 96.5% / 100% / 100%;
- 5 rooms, no doors, 20 turns: 49% / 72% / 89% / 99.5% / 100%;
- 3 rooms, doors, 20 turns: 54% / 79% / 94.5% / 99.5% / 100%; 10 turns: 33% / 57.5% / 77.5% / 97% / 100%;
- 4 rooms, doors, 20 turns: 41% / 64% / 90.5% / 98% / 100%; 10 turns: 25% / 44% / 73.5% / 92.5% / 100% (kept).

Random commands alone win 41% to 76% of the boards in 20 turns, leaving RL little to learn; 4 rooms with
doors in 10 turns is a search of a few rooms with a door to open on the way, and 10 turns keep prompts and rollouts
short on a CPU. At GOLD_RATE 0.1 the scripted policy wins 44% (Sokoban's choice was 40%): reward is frequent and most
of the task is left to RL.
"""

from __future__ import annotations

import functools

import numpy as np

from algorithms.llm.model.env_models import EnvTinyModel, gold_or_random, played_texts
from algorithms.llm.model.warm_start import WarmStartConfig

COIN_ENV = "TextWorldExpress-coin-v0"
COIN_KWARGS = {"game_params": "numLocations=4,includeDoors=1,numDistractorItems=0", "max_turns": 10}
GOLD_RATE = 0.1
# The watch envs' SFT budget (WarmStartConfig's defaults): 160 boards (1,276 turns) and 300 steps, 806 s on two cores
# shared with two other processes. Sokoban's smaller budget (40 boards, 60 steps) left the model answering a valid
# command on 41% of turns and no RL pilot moved it; on this one loop pilots went from 0.10-0.13 to 0.38-0.41 success in
# 60 iterations (docs/notes/2026-12-05-agent-benchmark-pilots.md)
COIN_STAGE = WarmStartConfig(episodes_per_env=160, max_steps=300)
_VOCABULARY_EPISODES = 40


def answer(command: str) -> str:
    return f"Action: {command}"


def coin_texts() -> list[str]:
    """Coin's observations under random valid commands (fixed seeds), and every command seen as an answer."""
    commands: set[str] = set()

    def pick(env, rng: np.random.Generator) -> str:
        valid = env.unwrapped.turn_alternatives()
        commands.update(valid)
        return str(rng.choice(valid))

    observations = played_texts(COIN, _VOCABULARY_EPISODES, pick)
    return observations + [answer(command) for command in sorted(commands)]


@functools.lru_cache(maxsize=64)
def _gold_commands(game: str, game_params: str, game_fold: str, seed: int) -> dict:
    """{state fingerprint: the first command of a shortest winning sequence from it} over every state of the board
    that the game can reach from its start (module docstring); states that cannot win are absent."""
    from envs.textworld_express import TextWorldExpressEnv

    env = TextWorldExpressEnv(game=game, game_params=game_params, game_fold=game_fold, max_turns=10_000)

    def view_after(commands: tuple[str, ...]):
        env.reset(seed=seed)
        for command in commands:
            env.step(command)
        return env.unwrapped.game_view

    start = view_after(())
    paths, edges, won = {start.fingerprint: ()}, {}, set()
    frontier = [start.fingerprint]
    while frontier:
        following = []
        for state in frontier:
            view = view_after(paths[state])
            edges[state] = []
            if view.won or view.lost:
                won.update([state] if view.won else [])
                continue
            for command in view.valid:
                after = view_after(paths[state] + (command,)).fingerprint
                if after == state:  # a command that changes nothing (look around, inventory) is never gold
                    continue
                edges[state].append((command, after))
                if after not in paths:
                    paths[after] = paths[state] + (command,)
                    following.append(after)
        frontier = following
    env.close()
    distance = {state: 0 for state in won}
    changed = True
    while changed:  # distances to a win, relaxed over the (small) graph until they settle
        changed = False
        for state, moves in edges.items():
            best = min((distance[after] + 1 for _, after in moves if after in distance), default=None)
            if best is not None and best < distance.get(state, best + 1):
                distance[state], changed = best, True
    gold = {}
    for state, moves in edges.items():
        ranked = sorted((distance[after], command) for command, after in moves if after in distance)
        if ranked:
            gold[state] = ranked[0][1]
    return gold


def gold_command(env) -> str | None:
    """The gold command in `env`'s current state (module docstring), None where no win is reachable."""
    core = env.unwrapped
    table = _gold_commands(core.game, core.params_text, core.game_fold, core.game_seed)
    return table.get(core.game_view.fingerprint)


def scripted_command(env, rng: np.random.Generator) -> str:
    """The gold command with probability GOLD_RATE, else a uniformly random valid command (module docstring)."""
    return gold_or_random(gold_command(env), env.unwrapped.turn_alternatives(), rng, GOLD_RATE)


COIN = EnvTinyModel(
    env_id=COIN_ENV,
    name="twx-coin",
    texts=coin_texts,
    action=scripted_command,
    answer=answer,
    stage=COIN_STAGE,
    env_kwargs=COIN_KWARGS,
)
