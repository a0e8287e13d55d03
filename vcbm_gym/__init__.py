"""vcbm-gym: environments registered with Gymnasium, and credit-assignment rules.

Importing this package registers the project's environments (Gymnasium 1.x loads no entry-point
plugins), so `gym.make("WatchRepair-v0")` works after `import vcbm_gym`, and
`gym.make("vcbm_gym:WatchRepair-v0")` works without a prior import. It also registers delayed-reward
versions of Gymnasium's classic-control tasks (`DelayedCartPole-v1`, ...): the task itself, with
every episode's summed reward paid at its last step (`DelayedReward`, envs/delayed_reward.py), and the
episodic-reward MuJoCo tasks of the reward-redistribution papers (`EpisodicHopper-v5`, ...; extra `mujoco`).
And bsuite's experiments (the `bsuite` extra; envs/bsuite.py): `gym.make("BSuite-v0",
bsuite_id="umbrella_length/9")`, and one id per bsuite_id, `gym.make("umbrella_length/9")` or, as
the CLIs take it, `gym.make("bsuite:umbrella_length/9")` (Gymnasium imports the `bsuite` package,
then finds the id registered here); registering them imports no bsuite (`BSUITE_ENV_IDS`).

`check_contract(env)` checks an env against the env contract (vcbm_gym/contract.py).
"""

from gymnasium.envs.registration import register, registry

from envs.bsuite import BSUITE_IDS
from envs.delayed_reward import DelayedReward
from vcbm_gym.contract import check_contract

__version__ = "0.1.0"
__all__ = ["BSUITE_ENV_IDS", "DELAYED_ENV_IDS", "ENV_IDS", "EPISODIC_MUJOCO_ENV_IDS", "DelayedReward", "check_contract"]

_ENVS = {
    "WatchRepair-v0": dict(
        entry_point="envs.watch_repair:WatchRepairEnv",
        vector_entry_point="envs.watch_repair:WatchRepairVectorEnv",
        # The env refuses step() before reset() itself; Gymnasium's OrderEnforcing wrapper would only add
        # two calls to every step of a tabular run (~5% of its time).
        order_enforce=False,
    ),
    "TextWatchRepair-v0": dict(entry_point="envs.text_watch_repair:TextWatchRepairEnv"),
    "TextWatchWorkshop-v0": dict(entry_point="envs.text_watch_workshop:TextWatchWorkshopEnv"),
    "TextThinkSolve-v0": dict(entry_point="envs.text_think_solve:TextThinkSolveEnv"),  # two roles of one model
    "SetRetrieval-v0": dict(entry_point="envs.set_retrieval:SetRetrievalEnv"),
    "TextSetRetrieval-v0": dict(entry_point="envs.set_retrieval:TextSetRetrievalEnv"),
    "AppWorld-v0": dict(entry_point="envs.appworld.env:AppWorldEnv"),
    "ContextMatch-v0": dict(entry_point="envs.context_match:ContextMatchEnv"),  # VCBM's context test
    # COCOA's exact-gradient test beds (docs/papers/cocoa.md)
    "LinearKeyToDoor-v0": dict(entry_point="envs.key_to_door:LinearKeyToDoorEnv"),
    "CreditTree-v0": dict(entry_point="envs.credit_tree:CreditTreeEnv"),
}
# Gymnasium tasks given a delayed reward: the same spec (entry point, time limit, kwargs), with
# DelayedReward applied after the time limit, so that a truncated episode is paid too.
_DELAYED = ("CartPole-v1", "Acrobot-v1", "MountainCar-v0", "Pendulum-v1")

for _env_id, _kwargs in _ENVS.items():
    if _env_id not in registry:
        register(id=_env_id, **_kwargs)


def _register_delayed(name: str, base_id: str) -> None:
    """`name`: Gymnasium's `base_id` (entry point, time limit, kwargs) with DelayedReward after its time limit."""
    spec = registry[base_id]
    if name not in registry:
        register(
            id=name,
            entry_point=spec.entry_point,
            reward_threshold=spec.reward_threshold,
            max_episode_steps=spec.max_episode_steps,
            kwargs=dict(spec.kwargs),
            additional_wrappers=(DelayedReward.wrapper_spec(),),
        )


for _base_id in _DELAYED:
    _register_delayed(f"Delayed{_base_id}", _base_id)

# bsuite settings: "BSuite-v0" takes bsuite_id as a kwarg; each bsuite_id ("umbrella_length/9": namespace
# "umbrella_length", name "9" in Gymnasium's id grammar) is also an id of its own.
for _env_id, _kwargs in (("BSuite-v0", {}), *((_bsuite_id, {"bsuite_id": _bsuite_id}) for _bsuite_id in BSUITE_IDS)):
    if _env_id not in registry:
        register(id=_env_id, entry_point="envs.bsuite:BSuiteEnv", kwargs=_kwargs)

# Episodic-reward MuJoCo (the protocol of IRCR and RRD: Gangwani et al. 2020, Ren et al. 2022): Gymnasium's MuJoCo v5
# task, 0 on every step and the episode's summed reward on its last; the 1,000-step cap stays a truncation, so
# learners store it as non-terminal. The episode's return is the dense task's. Needs the `mujoco` extra to make.
_EPISODIC_MUJOCO = ("Hopper-v5", "Walker2d-v5", "HalfCheetah-v5", "Ant-v5", "Swimmer-v5", "Humanoid-v5")
for _base_id in _EPISODIC_MUJOCO:
    _register_delayed(f"Episodic{_base_id}", _base_id)

ENV_IDS = tuple(_ENVS)
EPISODIC_MUJOCO_ENV_IDS = tuple(f"Episodic{base_id}" for base_id in _EPISODIC_MUJOCO)
DELAYED_ENV_IDS = tuple(f"Delayed{base_id}" for base_id in _DELAYED)
BSUITE_ENV_IDS = ("BSuite-v0", *BSUITE_IDS)

# Sokoban as text (envs/sokoban.py): the EMPO paper's setting, 6 x 6 board, one box, 15 moves; SokobanDescribed-v0
# adds to each board a line in words (describe=True), which a tiny CPU model can read
if "Sokoban-v0" not in registry:
    register(id="Sokoban-v0", entry_point="envs.sokoban:SokobanEnv")
if "SokobanDescribed-v0" not in registry:
    register(id="SokobanDescribed-v0", entry_point="envs.sokoban:SokobanEnv", kwargs={"describe": True})
ENV_IDS = (*ENV_IDS, "Sokoban-v0", "SokobanDescribed-v0")

# Text games (the `textworld` extra; envs/textworld_express.py, envs/textworld_game.py): TextWorldExpress's games,
# TextWorldExpress-v0 with game= and one id per game (TextWorldExpress-coin-v0, ...), TextWorld game files and the
# tw-cooking games TextWorld generates offline; registering them imports neither package.
_TEXT_GAMES = {
    "TextWorldExpress-v0": dict(entry_point="envs.textworld_express:TextWorldExpressEnv"),
    **{
        f"TextWorldExpress-{_game}-v0": dict(entry_point="envs.textworld_express:TextWorldExpressEnv", kwargs={"game": _game})
        for _game in ("cookingworld", "twc", "coin", "mapreader", "arithmetic", "sorting", "simonsays", "peckingorder")
    },
    "TextWorld-v0": dict(entry_point="envs.textworld_game:TextWorldGameEnv"),
    "TextWorldCooking-v0": dict(entry_point="envs.textworld_game:TextWorldCookingEnv"),
}
for _env_id, _kwargs in _TEXT_GAMES.items():
    if _env_id not in registry:
        register(id=_env_id, **_kwargs)
TEXT_GAME_ENV_IDS = tuple(_TEXT_GAMES)
