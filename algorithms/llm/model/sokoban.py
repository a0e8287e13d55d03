"""The tiny models on Sokoban-v0 (envs/sokoban.py): their vocabulary and the format warm-start's Sokoban stage.

The shared tiny tokenizer (algorithms.llm.model.tiny) is trained on the watch envs' texts: it has no word for the
moves ("up", "down", "right") nor for most board cells, so on Sokoban a tiny model could neither read the board nor
name a move. And the warm-started model (`--model tiny`) is keyed by a hash of its data and vocabulary, which
published results record: adding Sokoban to its data would replace it. So Sokoban gets models of its own, leaving
the shared ones untouched:

- `--model tiny-random`: the tiny model built on a tokenizer whose corpus adds Sokoban's texts (`sokoban_texts`);
- `--model tiny`: that model (`SOKOBAN_STAGE`'s shape) after SFT on Sokoban turns, through the warm start's cache
  (`cached_warm_start` with `base`: the untrained model saved in the cache as a folder named by its hash, and
  `examples`: the turns below), in a folder of its own.

The SFT turns are answers in the warm start's format, `Action: player <move>()`, of a scripted policy that plays
the breadth-first solver's optimal move (`SokobanEnv.optimal_alternative`) with probability `GOLD_RATE` and a
uniformly random move otherwise. Measured over 400 boards (seeds 10,000-10,399, the default 1-3 pushes, 15 moves),
that policy solves 14% of them at a gold rate of 0, 40% at 0.25, 75% at 0.5 and all at 1. The watch warm start's
data carry no information about the right decision, so that RL has all of it to learn; on Sokoban a model that
never solves a board gets no reward to learn from, and one that imitates the solver leaves RL nothing to do. 0.25
keeps reward frequent and most of the task to RL.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from algorithms.llm.model.warm_start import WarmStartConfig, _cache_root, cached_warm_start, format_answer, load_warm_start

SOKOBAN_ENV = "Sokoban-v0"
GOLD_RATE = 0.25
SUBJECT = "player"
# The shared warm start's shape with a smaller SFT budget: a Sokoban turn carries the whole board history (up to 15
# boards), so the shared budget (160 episodes, 300 steps of 16) took over 15 minutes of a loaded core; 40 episodes and
# 60 steps answered 20 of 20 boards with a move (greedy, boards 0-19) after about 4 minutes under the same load.
SOKOBAN_STAGE = WarmStartConfig(episodes_per_env=40, max_steps=60)
_VOCABULARY_EPISODES = 40


def sokoban_texts() -> list[str]:
    """Sokoban's observations under random moves (fixed seeds), and the answers of the warm start's format."""
    import gymnasium as gym

    import vcbm_gym  # noqa: F401  (registers the envs)
    from envs.sokoban import DIRECTIONS

    texts, rng = [format_answer(SUBJECT, move) for move in DIRECTIONS], np.random.default_rng(0)
    env = gym.make(SOKOBAN_ENV)
    for episode in range(_VOCABULARY_EPISODES):
        obs, _ = env.reset(seed=episode)
        texts.append(obs)
        done = False
        while not done:
            obs, _, terminated, truncated, _ = env.step(str(rng.choice(DIRECTIONS)))
            texts.append(obs)
            done = terminated or truncated
    env.close()
    return texts


def sokoban_random_tiny(seed: int, cfg: WarmStartConfig | None = None):
    """The untrained tiny model on Sokoban's vocabulary: `tiny-random`'s shape, or `cfg`'s (the warm start's)."""
    from algorithms.llm.model.tiny import build_tiny

    if cfg is None:
        return build_tiny(seed, extra_texts=sokoban_texts())
    shape = dict(hidden_size=cfg.hidden_size, tie_embeddings=cfg.tie_embeddings, embedding_std=cfg.embedding_std)
    return build_tiny(cfg.model_seed, **shape, extra_texts=sokoban_texts())


def sokoban_examples(cfg: WarmStartConfig) -> list[dict[str, Any]]:
    """Conversational prompt/completion pairs, one per turn of the scripted policy (module docstring)."""
    import gymnasium as gym

    import vcbm_gym  # noqa: F401
    from algorithms.llm.generation.prompting import initial_messages, tiny_system_prompt
    from envs.sokoban import DIRECTIONS

    rng = np.random.default_rng(cfg.data_seed)
    env = gym.make(SOKOBAN_ENV)
    examples = []
    for episode in range(cfg.episodes_per_env):
        obs, _ = env.reset(seed=10_000 + episode)
        messages = initial_messages(str(obs), system_prompt=tiny_system_prompt())
        done = False
        while not done:
            gold = env.unwrapped.optimal_alternative()
            random_move = str(DIRECTIONS[int(rng.integers(len(DIRECTIONS)))])
            move = gold if gold is not None and rng.random() < GOLD_RATE else random_move
            answer = {"role": "assistant", "content": format_answer(SUBJECT, move)}
            examples.append({"prompt": [dict(m) for m in messages], "completion": [answer]})
            obs, _, terminated, truncated, _ = env.step(answer["content"])
            messages += [answer, {"role": "user", "content": str(obs)}]
            done = terminated or truncated
    env.close()
    return examples


def _saved_random_model(cfg: WarmStartConfig, cache_dir: str | Path | None) -> Path:
    """The untrained model of `sokoban_random_tiny(cfg=cfg)` in the warm start's cache, in a folder named by the hash of
    its config and vocabulary; written once (under a lock, moved into place whole)."""
    model, tokenizer = sokoban_random_tiny(cfg.model_seed, cfg)
    digest = hashlib.sha256()
    for part in (dataclasses.asdict(cfg), model.config.to_dict(), sorted(tokenizer.get_vocab().items())):
        digest.update(json.dumps(part, sort_keys=True, default=str).encode())
    root = (Path(cache_dir) if cache_dir is not None else _cache_root()) / "tiny_warm_start"
    folder = root / f"sokoban-random-{digest.hexdigest()[:16]}"
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f"{folder.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (folder / "config.json").is_file():
            staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=root))
            try:
                with contextlib.redirect_stdout(open(os.devnull, "w")):
                    model.save_pretrained(staging)
                    tokenizer.save_pretrained(staging)
                if folder.exists():  # an incomplete earlier attempt
                    shutil.rmtree(folder)
                os.rename(staging, folder)
            finally:
                shutil.rmtree(staging, ignore_errors=True)
    return folder


def sokoban_warm_start(cfg: WarmStartConfig = SOKOBAN_STAGE, cache_dir: str | Path | None = None) -> Path:
    """The cache folder of the warm-started tiny model for Sokoban, built now if absent."""
    return cached_warm_start(cfg, cache_dir, base=_saved_random_model(cfg, cache_dir), examples=sokoban_examples(cfg))


def sokoban_tiny(name: str, seed: int):
    """The model and tokenizer of `--model tiny` (warm-started) or `tiny-random` on Sokoban-v0."""
    if name == "tiny":
        return load_warm_start(sokoban_warm_start())
    return sokoban_random_tiny(seed)
