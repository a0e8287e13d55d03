"""The tiny models on Sokoban-v0 (envs/sokoban.py): their vocabulary and the format warm-start's Sokoban stage.

The shared tiny tokenizer (algorithms.llm.model.tiny) is trained on the watch envs' texts: it has no word for the
moves ("up", "down", "right") nor for most board cells, so on Sokoban a tiny model could neither read the board nor
name a move. And the warm-started model (`--model tiny`) is keyed by a hash of its data and vocabulary, which
published results record: adding Sokoban to its data would replace it. So Sokoban gets models of its own, leaving
the shared ones untouched: `SOKOBAN`, an `EnvTinyModel` (algorithms/llm/model/env_models.py, which builds and caches
them): `tiny-random` on a tokenizer whose corpus adds Sokoban's texts (`sokoban_texts`), `tiny` that model
(`SOKOBAN_STAGE`'s shape) after SFT on the Sokoban turns below.

The SFT turns are answers in the warm start's format, `Action: player <move>()`, of a scripted policy that plays
the breadth-first solver's optimal move (`SokobanEnv.optimal_alternative`) with probability `GOLD_RATE` and a
uniformly random move otherwise. Measured over 400 boards (seeds 10,000-10,399, the default 1-3 pushes, 15 moves),
that policy solves 14% of them at a gold rate of 0, 40% at 0.25, 75% at 0.5 and all at 1. The watch warm start's
data carry no information about the right decision, so that RL has all of it to learn; on Sokoban a model that
never solves a board gets no reward to learn from, and one that imitates the solver leaves RL nothing to do. 0.25
keeps reward frequent and most of the task to RL.

On the grid alone no tiny model learned: RL pilots at gold rates 0.25 and 0.5 stayed at their start, and after 300
SFT steps a warm start answers one move whatever the board, even with the board in words
(docs/notes/2026-12-06-sokoban-described-pilots.md).
`SokobanDescribed-v0` adds to each board a line in words (envs/sokoban.py, `describe`), and `SOKOBAN_DESCRIBED` are
its models: a vocabulary with the description's words, and a warm start that imitates the solver itself
(`DESCRIBED_GOLD_RATE` 1.0) for longer (`DESCRIBED_STAGE`). Even so the tiny model learns only part of the solver: on
96 held-out boards, greedy, its move is a shortest solution's on 54% of the turns whose board still has a solution
(against 26% for a random move), and 38 of its 96 episodes push the box where it can never reach the target; it solves
51% of them, which leaves RL most of the task (LOOP rose in two RL pilots of three on it).
"""

from __future__ import annotations

import functools

import numpy as np

from algorithms.llm.model.env_models import EnvTinyModel, gold_or_random, played_texts
from algorithms.llm.model.warm_start import WarmStartConfig, format_answer

SOKOBAN_ENV = "Sokoban-v0"
GOLD_RATE = 0.25
SUBJECT = "player"
# The shared warm start's shape with a smaller SFT budget: a Sokoban turn carries the whole board history (up to 15
# boards), so the shared budget (160 episodes, 300 steps of 16) took over 15 minutes of a loaded core; 40 episodes and
# 60 steps answered 20 of 20 boards with a move (greedy, boards 0-19) after about 4 minutes under the same load.
SOKOBAN_STAGE = WarmStartConfig(episodes_per_env=40, max_steps=60)
# The described board's warm start (module docstring): the solver's own moves, on the watch envs' 160 episodes, for
# 1,200 SFT steps: after 300 its greedy move was optimal on 14-15% of turns, on the boards it was trained on too
DESCRIBED_GOLD_RATE = 1.0
DESCRIBED_STAGE = WarmStartConfig(episodes_per_env=160, max_steps=1200)
_VOCABULARY_EPISODES = 40


def sokoban_texts() -> list[str]:
    """Sokoban's observations under random moves (fixed seeds), and the answers of the warm start's format."""
    return _texts(SOKOBAN)


def described_texts() -> list[str]:
    """SokobanDescribed's observations under random moves (fixed seeds), and the answers of the warm start's format."""
    return _texts(SOKOBAN_DESCRIBED)


def _texts(model: EnvTinyModel) -> list[str]:
    from envs.sokoban import DIRECTIONS

    answers = [answer(move) for move in DIRECTIONS]
    return answers + played_texts(model, _VOCABULARY_EPISODES, lambda env, rng: str(rng.choice(DIRECTIONS)))


def answer(move: str) -> str:
    return format_answer(SUBJECT, move)


def scripted_move(env, rng: np.random.Generator, gold_rate: float = GOLD_RATE) -> str:
    """The solver's optimal move with probability `gold_rate`, else a uniformly random move (module docstring)."""
    from envs.sokoban import DIRECTIONS

    return gold_or_random(env.unwrapped.optimal_alternative(), DIRECTIONS, rng, gold_rate)


SOKOBAN = EnvTinyModel(
    env_id=SOKOBAN_ENV,
    name="sokoban",
    texts=sokoban_texts,
    action=scripted_move,
    answer=answer,
    stage=SOKOBAN_STAGE,
    env_kwargs={"max_steps": 15, "min_pushes": 1, "max_pushes": 3},  # the env's defaults, as zoo_configs/llm-base.yml
)

SOKOBAN_DESCRIBED = EnvTinyModel(
    env_id="SokobanDescribed-v0",
    name="sokoban-described",
    texts=described_texts,
    action=functools.partial(scripted_move, gold_rate=DESCRIBED_GOLD_RATE),
    answer=answer,
    stage=DESCRIBED_STAGE,
    env_kwargs={"max_steps": 15, "min_pushes": 1, "max_pushes": 3},
)
