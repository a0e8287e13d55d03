"""vcbm-gym: environments registered with Gymnasium, and credit-assignment rules.

Importing this package registers the project's environments (Gymnasium 1.x loads no entry-point
plugins), so `gym.make("WatchRepair-v0")` works after `import vcbm_gym`, and
`gym.make("vcbm_gym:WatchRepair-v0")` works without a prior import.
"""

from gymnasium.envs.registration import register, registry

__version__ = "0.1.0"

_ENVS = {
    "WatchRepair-v0": dict(
        entry_point="envs.watch_repair:WatchRepairEnv",
        vector_entry_point="envs.watch_repair:WatchRepairVectorEnv",
    ),
    "TextWatchRepair-v0": dict(entry_point="envs.text_watch_repair:TextWatchRepairEnv"),
    "TextWatchWorkshop-v0": dict(entry_point="envs.text_watch_workshop:TextWatchWorkshopEnv"),
    "SetRetrieval-v0": dict(entry_point="envs.set_retrieval:SetRetrievalEnv"),
    "TextSetRetrieval-v0": dict(entry_point="envs.set_retrieval:TextSetRetrievalEnv"),
    "AppWorld-v0": dict(entry_point="envs.appworld.env:AppWorldEnv"),
}

for _env_id, _kwargs in _ENVS.items():
    if _env_id not in registry:
        register(id=_env_id, **_kwargs)

ENV_IDS = tuple(_ENVS)
