"""The tiny models on AppWorld-v0's synthetic tasks (envs/appworld): a vocabulary that writes code, and a warm start.

An AppWorld turn is Python: AppWorldEnv runs only the fenced ```python block of an answer (`code_from_action`), and
a cell needs its newlines and indentation. The shared tiny tokenizer splits at whitespace and decodes one space
between words, so no model on it can write a loop. `APPWORLD` (an `EnvTinyModel`, algorithms/llm/model/env_models.py)
gives AppWorld models of their own on the lossless tokenizer (`build_tiny_tokenizer(lossless=True)`: byte-level pieces
that carry the whitespace before them):

- vocabulary: every synthetic scenario's instruction and reference cells over `VOCABULARY_SEEDS` data seeds, the names
  a task's supervisor can have, each cell in the answer format, and the short lines the cells print. It comes from
  the task templates (envs/appworld/synthetic_tasks.py, plain Python), so building it starts no AppWorld server;
- warm start: SFT on the turns of a scripted policy that plays the task's reference cell of the turn with probability
  `GOLD_RATE` and otherwise a uniformly random cell of `mistake_cells` (reference cells of all scenarios and data:
  logging in again, ending the task too early, deleting or updating the wrong notes). A cell skipped breaks the cells
  after it (their variables are missing), as a real slip does.

The answer is the cell alone in its fence; the tiny models' one-line system prompt (`system_prompt: tiny`) replaces
AppWorld's ReAct prompt, which a model this small cannot read. On the 8 train tasks of the default synthetic data the
warm start, greedy, solves 5 and writes the reference cell on 50% of its sampled turns (sampled success 16%); on the 8
dev tasks, 2 and 41% (6%) (docs/notes/2026-12-06-appworld-tiny-pilots.md, with the RL pilots on it).
"""

from __future__ import annotations

import functools
import random

import numpy as np

from algorithms.llm.model.env_models import EnvTinyModel, gold_or_random
from algorithms.llm.model.warm_start import WarmStartConfig

APPWORLD_ENV = "AppWorld-v0"
VOCABULARY_SEEDS = range(200)  # data seeds of every scenario whose texts make the vocabulary
# A scenario's reference solution is 3 or 4 cells; 2 more interactions leave room for a slip and its repair
APPWORLD_KWARGS = {"split": "train", "max_interactions": 6}
GOLD_RATE = 0.75  # every cell right: 0.75^3 = 42% of the 3-cell tasks, 0.75^4 = 32% of the 4-cell ones
APPWORLD_STAGE = WarmStartConfig(episodes_per_env=80, max_steps=600)
# What the reference cells print, and the error a skipped cell leaves behind (the outputs of other calls, JSON
# records, are read word by word; a word outside the vocabulary reads as unknown)
PRINTED = ("logged in", "Execution successful.", "NameError: name 'token' is not defined", *map(str, range(40)))


def answer(cell: str) -> str:
    """A code cell in the answer format: the fenced block AppWorldEnv runs."""
    return f"```python\n{cell}\n```"


def _tasks(seeds: range):
    from envs.appworld.synthetic_tasks import SCENARIOS

    return [build(random.Random(seed)) for _, build in SCENARIOS.values() for seed in seeds]


def _supervisors() -> list[str]:
    """The first observation's supervisor line for every name a synthetic task's supervisor can have
    (envs.appworld.synthetic draws first and last names from these lists; phone numbers are random digits)."""
    from envs.appworld.synthetic_tasks import FIRST_NAMES, LAST_NAMES, supervisor_email

    return [
        f"Supervisor: {first} {last} (email {supervisor_email(first, last)}, phone 5550101234)"
        for first in FIRST_NAMES
        for last in LAST_NAMES
    ]


def appworld_texts() -> list[str]:
    """The vocabulary's texts (module docstring): instructions, cells as answers, supervisors, printed lines."""
    tasks = _tasks(VOCABULARY_SEEDS)
    cells = sorted({cell for task in tasks for cell in task.solution_cells})
    return [f"Task: {task.instruction}" for task in tasks] + [answer(cell) for cell in cells] + _supervisors() + list(PRINTED)


@functools.cache
def mistake_cells() -> tuple[str, ...]:
    """The scripted policy's wrong cells: the reference cells of every scenario on data seeds 0-2, whatever the task."""
    return tuple(sorted({cell for task in _tasks(range(3)) for cell in task.solution_cells}))


def scripted_cell(env, rng: np.random.Generator, gold_rate: float = GOLD_RATE) -> str:
    """The task's reference cell of this turn (its last one, ending the task, once past its end) with probability
    `gold_rate`, else a uniformly random cell of `mistake_cells` (module docstring)."""
    core = env.unwrapped
    cells = core.reference_cells()
    if not cells:
        raise ValueError(f"AppWorld task {core.task_id!r} has no reference cells; expected a synthetic task")
    return gold_or_random(cells[min(core.interactions, len(cells) - 1)], mistake_cells(), rng, gold_rate)


APPWORLD = EnvTinyModel(
    env_id=APPWORLD_ENV,
    name="appworld",
    texts=appworld_texts,
    action=scripted_cell,
    answer=answer,
    stage=APPWORLD_STAGE,
    env_kwargs=APPWORLD_KWARGS,
    lossless=True,
)
