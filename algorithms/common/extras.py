"""The optional extras (pyproject.toml's `[project.optional-dependencies]`) and the one line that names a missing one.

Every command that needs an extra asks here before it imports the extra's packages or writes anything, so that
a newcomer without it reads which extra to install instead of a traceback from deep inside an import.
"""

from __future__ import annotations

import importlib.util
import re

from algorithms.common.errors import VcbmGymError

# extra -> the top-level modules it brings that the project imports (the first missing one is named)
EXTRAS: dict[str, tuple[str, ...]] = {
    "llm": ("trl", "transformers", "peft", "accelerate", "datasets"),
    "mujoco": ("mujoco",),
    "bsuite": ("bsuite",),
    "distributed": ("ray",),
    "textworld": ("textworld_express", "textworld"),
    "sbx": ("sbx", "jax"),
}


def install_hint(extra: str) -> str:
    return f'pip install -e ".[{extra}]"'


def missing_module(extra: str) -> str | None:
    """The first module of `extra` that cannot be imported, or None when all of them can (none is imported here)."""
    for module in EXTRAS[extra]:
        try:
            found = importlib.util.find_spec(module)
        except (ImportError, ValueError):  # a module left half-imported, or set to None in sys.modules
            found = None
        if found is None:
            return module
    return None


def require_extra(what: str, extra: str) -> None:
    """One line naming `extra` and how to install it when one of its modules is missing; `what` needs it."""
    module = missing_module(extra)
    if module is not None:
        raise VcbmGymError(f"{what} needs the {extra} extra ({module} is not installed): {install_hint(extra)}")


_MUJOCO_ENTRY = re.compile(r"^gymnasium\.envs\.mujoco[.:]")


def env_extra(env_id: str) -> str | None:
    """The extra that env `env_id` needs to be made (`bsuite:<experiment>/<setting>`, BSuite-v0: bsuite; Gymnasium's
    MuJoCo tasks and their episodic versions: mujoco; the text games of envs/textworld_*.py: textworld), from the id and
    its registered entry point; None for others."""
    from gymnasium.envs.registration import registry

    from envs.bsuite import SWEEP_SIZES

    module, _, name = env_id.rpartition(":")
    if module == "bsuite" or name == "BSuite-v0" or name.partition("/")[0] in SWEEP_SIZES:
        return "bsuite"
    spec = registry.get(name)
    entry = getattr(spec, "entry_point", None)
    if isinstance(entry, str) and _MUJOCO_ENTRY.match(entry):
        return "mujoco"
    if isinstance(entry, str) and entry.startswith(("envs.textworld_express:", "envs.textworld_game:")):
        return "textworld"
    return None
