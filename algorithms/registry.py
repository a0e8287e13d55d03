"""Which algorithms exist, and which arm trains each (its runner module imported lazily: torch/TRL only when used)."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from algorithms.common.errors import VcbmGymError
from algorithms.common.spec import Arm


@dataclass(frozen=True)
class AlgoSpec:
    runner: str  # the module whose `ARM` (an algorithms.common.spec.Arm) resolves, checks and trains the run
    target: str  # "module:Class" of the agent (tabular) or algorithm (SB3); runner-specific
    description: str


ALGOS: dict[str, AlgoSpec] = {
    "vcbm": AlgoSpec(
        "algorithms.tabular.runner", "algorithms.tabular.vcbm:VCBMAgent", "tabular VCBM (arXiv:2610.24032 Sec. IV-A)"
    ),
    "vcbm+": AlgoSpec(
        "algorithms.tabular.runner",
        "algorithms.tabular.vcbm:VCBMPlusAgent",
        "tabular VCBM without the greedy trap (beyond the paper)",
    ),
    "rudder": AlgoSpec(
        "algorithms.tabular.runner",
        "algorithms.tabular.rudder:RudderAgent",
        "RUDDER + direct Q (arXiv:1806.07857; arXiv:2610.24032 Sec. II-B)",
    ),
    "mc": AlgoSpec(
        "algorithms.tabular.runner", "algorithms.tabular.mc:MonteCarloAgent", "tabular Monte Carlo on the delayed reward"
    ),
    "td": AlgoSpec(
        "algorithms.tabular.runner", "algorithms.tabular.q_learning:QLearningAgent", "tabular Q-learning on the delayed reward"
    ),
    "ppo": AlgoSpec("algorithms.sb3.runner", "stable_baselines3:PPO", "SB3 PPO with a pluggable credit rule"),
    "a2c": AlgoSpec("algorithms.sb3.runner", "stable_baselines3:A2C", "SB3 A2C with a pluggable credit rule"),
    "dqn": AlgoSpec("algorithms.sb3.runner", "stable_baselines3:DQN", "SB3 DQN on redistributed rewards"),
    "loop": AlgoSpec("algorithms.llm.runner", "algorithms.llm.trainer:LoopTrainer", "LOOP: leave-one-out PPO for LLM agents"),
    "vcbm-loop": AlgoSpec("algorithms.llm.runner", "algorithms.llm.trainer:LoopTrainer", "VCBM-blended LOOP"),
    "trl-grpo": AlgoSpec(
        "algorithms.llm.runner", "algorithms.llm.trainer:MultiTurnGRPOTrainer", "TRL's GRPO (sequence-level advantage)"
    ),
}


def get_algo(name: str) -> AlgoSpec:
    if name not in ALGOS:
        raise VcbmGymError(f"unknown algo {name!r}; expected one of: {', '.join(ALGOS)}")
    return ALGOS[name]


def get_arm(algo: str) -> Arm:
    """The arm that trains `algo` (its runner module imported on first use)."""
    return importlib.import_module(get_algo(algo).runner).ARM


def load_object(target: str) -> Any:
    """Import "package.module:Attribute"."""
    module_name, _, attr = target.partition(":")
    module = importlib.import_module(module_name)
    return getattr(module, attr) if attr else module
