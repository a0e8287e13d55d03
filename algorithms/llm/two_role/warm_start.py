"""The two-role tiny model (`--model tiny` on TextThinkSolve-v0): the format warm-start with SEPO's rating taught.

The format warm-start (algorithms.llm.model.warm_start) teaches one answer, the tool call `Action: <subject>
<tool>()`. Asked for a credit split (SEPO: trainer.RATING_REQUEST), that model answers with a tool call too, so no
rating is ever read and every split falls back to (0.5, 0.5): SEPO then pays GRPO's shared reward. The stand-in for
an instruct model must also know the rating's format, as a real one would. So the two-role arm's model is that
model after a second, short SFT stage (`RATING_STAGE`) on rating turns of TextThinkSolve, each as `rate_splits`
asks it: the tiny system prompt, the role's prompt, its answer in the warm-start's format, then the request that
quotes the note and the Solver's answer, answered by the Thinker's share `(0.7)` (the split (0.7, 0.3)).

The split is drawn uniformly from the nine (CREDIT_SPLITS), whatever the episode, as the format warm-start's
decisions are coin flips: the data teach how a rating is written and nothing about who deserves the credit (the
verifier's outcome is not even in the context). The stage's data also hold the roles' own turns in the format (the
Thinker's note and the Solver's answer, decisions by coin flip): trained on rating turns alone, the model answered
every prompt with a split. `--model tiny` on TextThinkSolve-v0 is this model (algorithms/llm/build.py), whatever the
credit rule, so the rules of a benchmark differ in their credit alone.

The single-role model is untouched: its data, settings and cache key stay the first stage's. This stage's key
hashes its settings, its data and the first stage's key, so it is cached beside it in a folder of its own, built
once (120 SFT steps on top of the first stage: a few CPU-minutes).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from algorithms.llm.model.warm_start import WarmStartConfig, cached_warm_start, format_answer, load_warm_start

# 240 TextThinkSolve episodes, four turns each; 120 steps of 16 go over them twice
RATING_STAGE = WarmStartConfig(episodes_per_env=240, max_steps=120)
RATING_ENV = "TextThinkSolve-v0"


def rating_text(split: tuple[float, float]) -> str:
    """A rating as the request asks for it, the Thinker's share: "(0.7)" for the split (0.7, 0.3)."""
    return f"({split[0]:.1f})"


def two_role_examples(cfg: WarmStartConfig) -> list[dict[str, Any]]:
    """Conversational prompt/completion pairs, four per TextThinkSolve episode: the Thinker's note, the Solver's answer,
    and each role's rating turn.

    A scripted team plays in the warm-start's format: the Thinker's note names the watch's brand and repair() or
    skip() by coin flip, the Solver's answer the same brand and its own coin flip; the episodes alternate between the
    env's decision rules (their Thinker prompts differ). Each rating is one of the nine splits drawn uniformly."""
    import gymnasium as gym

    import vcbm_gym  # noqa: F401  (registers the envs)
    from algorithms.llm.generation.prompting import initial_messages, tiny_system_prompt
    from algorithms.llm.two_role.trainer import RATING_REQUEST
    from envs.text_think_solve import DECISION_RULES, DECISIONS
    from envs.text_watch_repair import BRAND_NAMES
    from vcbm_gym.credit.ccpo import CREDIT_SPLITS

    def turn(prompt: list[dict[str, str]], answer: str) -> dict[str, Any]:
        return {"prompt": prompt, "completion": [{"role": "assistant", "content": answer}]}

    rng = np.random.default_rng(cfg.data_seed)
    envs = [gym.make(RATING_ENV, rule=rule) for rule in DECISION_RULES]
    examples = []
    for episode in range(cfg.episodes_per_env):
        env = envs[episode % len(envs)]
        thinker_prompt, info = env.reset(seed=10_000 + episode)
        brand = BRAND_NAMES[info["brand"]]
        note = format_answer(brand, str(rng.choice(DECISIONS)))
        solver_prompt = env.step(note)[0]
        answer = format_answer(brand, str(rng.choice(DECISIONS)))
        env.step(answer)
        ask = {"role": "user", "content": RATING_REQUEST.format(note=note, answer=answer)}
        for prompt, own in ((thinker_prompt, note), (solver_prompt, answer)):
            messages = initial_messages(prompt, system_prompt=tiny_system_prompt())
            split = CREDIT_SPLITS[int(rng.integers(len(CREDIT_SPLITS)))]
            examples.append(turn(messages, own))
            examples.append(turn([*messages, {"role": "assistant", "content": own}, ask], rating_text(split)))
    for env in envs:
        env.close()
    return examples


def two_role_warm_start(cache_dir: str | Path | None = None) -> Path:
    """The cache folder of the two-role model (the first stage's, then `RATING_STAGE`), built now if absent."""
    return cached_warm_start(
        RATING_STAGE, cache_dir, base=cached_warm_start(cache_dir=cache_dir), examples=two_role_examples(RATING_STAGE)
    )


def warm_started_two_role(cache_dir: str | Path | None = None):
    """The two-role model and its tokenizer, from the cache or built (and cached) now."""
    return load_warm_start(two_role_warm_start(cache_dir))
