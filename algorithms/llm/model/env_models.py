"""Tiny models of their own for envs whose words the shared tiny vocabulary lacks (Sokoban, TextWorldExpress-coin).

The shared tiny tokenizer (algorithms.llm.model.tiny) is trained on the watch envs' texts, and the shared warm-started
model (`--model tiny`) is keyed by a hash of its data and vocabulary, which published results record. An env whose
observations or commands that vocabulary cannot spell gets models of its own instead, described by one
`EnvTinyModel`, leaving the shared ones untouched:

- `--model tiny-random`: the tiny model built on a tokenizer whose corpus adds the env's texts (`texts`);
- `--model tiny`: that model (`stage`'s shape) after SFT on the env's turns, through the warm start's cache
  (`cached_warm_start` with `base`: the untrained model saved in the cache as a folder named by its hash, and
  `examples`: the turns of the env's scripted policy, `action`), in a folder of its own.

algorithms.llm.model.env_registry maps an env id to its model (None: the shared models serve that env).
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
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from algorithms.llm.model.tiny import SHARED_LOSSLESS
from algorithms.llm.model.warm_start import WarmStartConfig, _cache_root, cached_warm_start, load_warm_start

DATA_SEED_BASE = 10_000  # the warm start's boards: seeds the zoo never reports (its runs and evaluations use < 1,000)


@dataclass(frozen=True)
class EnvTinyModel:
    """What makes an env's tiny models (module docstring)."""

    env_id: str
    name: str  # the cache folder of its untrained model is "<name>-random-<hash>"
    texts: Callable[[], list[str]]  # the vocabulary's texts: the env's observations and its answers
    action: Callable[[Any, np.random.Generator], str]  # the scripted policy's command this turn (env, generator)
    answer: Callable[[str], str]  # a command written in the answer format
    stage: WarmStartConfig  # the warm start's shape and SFT budget
    env_kwargs: Mapping[str, Any] = field(default_factory=dict)  # the settings its texts and turns are played under
    lossless: bool = SHARED_LOSSLESS  # a tokenizer whose decoding keeps whitespace (tiny.build_tiny_tokenizer): code

    def make_env(self):
        import gymnasium as gym

        import vcbm_gym  # noqa: F401  (registers the envs)

        return gym.make(self.env_id, **dict(self.env_kwargs))

    def random_tiny(self, seed: int, cfg: WarmStartConfig | None = None):
        """The untrained tiny model on this env's vocabulary: `tiny-random`'s shape, or `cfg`'s (the warm start's)."""
        from algorithms.llm.model.tiny import build_tiny

        if cfg is None:
            return build_tiny(seed, extra_texts=self.texts(), lossless=self.lossless)
        shape = dict(hidden_size=cfg.hidden_size, tie_embeddings=cfg.tie_embeddings, embedding_std=cfg.embedding_std)
        return build_tiny(cfg.model_seed, **shape, extra_texts=self.texts(), lossless=self.lossless)

    def examples(self, cfg: WarmStartConfig) -> list[dict[str, Any]]:
        """Conversational prompt/completion pairs, one per turn of the scripted policy on boards DATA_SEED_BASE + i."""
        from algorithms.llm.generation.prompting import initial_messages, tiny_system_prompt

        rng = np.random.default_rng(cfg.data_seed)
        env = self.make_env()
        examples = []
        for episode in range(cfg.episodes_per_env):
            obs, _ = env.reset(seed=DATA_SEED_BASE + episode)
            messages = initial_messages(str(obs), system_prompt=tiny_system_prompt())
            done = False
            while not done:
                answer = {"role": "assistant", "content": self.answer(self.action(env, rng))}
                examples.append({"prompt": [dict(m) for m in messages], "completion": [answer]})
                obs, _, terminated, truncated, _ = env.step(answer["content"])
                messages += [answer, {"role": "user", "content": str(obs)}]
                done = terminated or truncated
        env.close()
        return examples

    def saved_random_model(self, cfg: WarmStartConfig, cache_dir: str | Path | None = None) -> Path:
        """The untrained model of `random_tiny(cfg=cfg)` in the warm start's cache, in a folder named by the hash of its
        config and vocabulary; written once (under a lock, moved into place whole)."""
        model, tokenizer = self.random_tiny(cfg.model_seed, cfg)
        digest = hashlib.sha256()
        for part in (dataclasses.asdict(cfg), model.config.to_dict(), sorted(tokenizer.get_vocab().items())):
            digest.update(json.dumps(part, sort_keys=True, default=str).encode())
        root = (Path(cache_dir) if cache_dir is not None else _cache_root()) / "tiny_warm_start"
        folder = root / f"{self.name}-random-{digest.hexdigest()[:16]}"
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

    def warm_start(self, cfg: WarmStartConfig | None = None, cache_dir: str | Path | None = None) -> Path:
        """The cache folder of this env's warm-started tiny model, built now if absent."""
        cfg = self.stage if cfg is None else cfg
        return cached_warm_start(cfg, cache_dir, base=self.saved_random_model(cfg, cache_dir), examples=self.examples(cfg))

    def load(self, name: str, seed: int):
        """The model and tokenizer of `--model tiny` (warm-started) or `tiny-random` on this env."""
        if name == "tiny":
            return load_warm_start(self.warm_start())
        return self.random_tiny(seed)


def gold_or_random(gold: str | None, choices: tuple[str, ...], rng: np.random.Generator, gold_rate: float) -> str:
    """The scripted policies' command: `gold` with probability `gold_rate` (where there is one), else a uniformly
    random one of `choices`. The random draw comes first, every turn, so a turn's draws do not depend on the gold."""
    random_choice = str(choices[int(rng.integers(len(choices)))])
    return gold if gold is not None and rng.random() < gold_rate else random_choice


def played_texts(model: EnvTinyModel, episodes: int, pick: Callable[[Any, np.random.Generator], str]) -> list[str]:
    """The env's observations over `episodes` boards (seeds 0, 1, ...) played by `pick` (env, generator of seed 0)."""
    texts, rng = [], np.random.default_rng(0)
    env = model.make_env()
    for episode in range(episodes):
        obs, _ = env.reset(seed=episode)
        texts.append(obs)
        done = False
        while not done:
            obs, _, terminated, truncated, _ = env.step(pick(env, rng))
            texts.append(obs)
            done = terminated or truncated
    env.close()
    return texts
