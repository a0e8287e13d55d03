"""Playing episodes: prompts, decoding (transformers with a kept cache, or vLLM) and whole multi-turn rollouts of a
text env, each an Episode with its token masks, effects and per-turn rewards. No credit enters here."""
