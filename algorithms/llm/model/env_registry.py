"""Which envs have tiny models of their own (algorithms.llm.model.env_models): env id -> its `EnvTinyModel`, named by
module so that nothing is imported until an env asks (the models' modules import env_models, never this one)."""

from __future__ import annotations

import importlib

# env id -> "module:attribute" of its EnvTinyModel, imported on first use
ENV_MODELS: dict[str, str] = {
    "AppWorld-v0": "algorithms.llm.model.appworld:APPWORLD",
    "Sokoban-v0": "algorithms.llm.model.sokoban:SOKOBAN",
    "SokobanDescribed-v0": "algorithms.llm.model.sokoban:SOKOBAN_DESCRIBED",
    "TextWorldExpress-coin-v0": "algorithms.llm.model.textworld_coin:COIN",
}


def env_tiny_model(env_id: str | None):
    """The `EnvTinyModel` of `env_id` (ENV_MODELS), or None where the shared tiny models serve it."""
    target = ENV_MODELS.get(env_id) if env_id is not None else None
    if target is None:
        return None
    module, _, attribute = target.partition(":")
    return getattr(importlib.import_module(module), attribute)
