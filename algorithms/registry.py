"""Which algorithms exist, and which arm trains each (its runner module imported lazily: torch/TRL only when used).

The registry sits above the arms: it names each algo's runner module (a string, imported on first use) and
nothing more. Each arm owns its table of agent or algorithm classes (`AGENTS` in its runner module).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from algorithms.common.errors import VcbmGymError
from algorithms.common.extras import require_extra
from algorithms.common.spec import Arm, canonical_algo

TABULAR, SB3, LLM = "algorithms.tabular.runner", "algorithms.sb3.runner", "algorithms.llm.runner"
TWO_ROLE = "algorithms.llm.two_role.runner"  # the LLM arm, two roles


@dataclass(frozen=True)
class AlgoSpec:
    runner: str  # the module whose `ARM` (an algorithms.common.spec.Arm) resolves, checks and trains the run
    description: str
    extra: str | None = None  # the optional extra (algorithms.common.extras.EXTRAS) its runner imports


# The LLM arm's runners import TRL, transformers and peft at the top: the `llm` extra.
_LLM_EXTRA = "llm"


ALGOS: dict[str, AlgoSpec] = {
    "vcbm": AlgoSpec(TABULAR, "tabular VCBM (arXiv:2610.24032 Sec. IV-A)"),
    "vcbm-plus": AlgoSpec(TABULAR, "tabular VCBM without the greedy trap (beyond the paper)"),
    "rudder": AlgoSpec(TABULAR, "RUDDER + direct Q (arXiv:1806.07857; arXiv:2610.24032 Sec. II-B)"),
    "mc": AlgoSpec(TABULAR, "tabular Monte Carlo on the delayed reward"),
    "td": AlgoSpec(TABULAR, "tabular Q-learning on the delayed reward"),
    "ppo": AlgoSpec(SB3, "SB3 PPO with a pluggable credit rule (advantages, or rewards through GAE)"),
    "a2c": AlgoSpec(SB3, "SB3 A2C with a pluggable credit rule (advantages, or rewards through GAE)"),
    "dqn": AlgoSpec(SB3, "SB3 DQN on a reward rule's relabelled rewards"),
    "sac": AlgoSpec(SB3, "SB3 SAC on a reward rule's relabelled rewards (continuous actions)"),
    "td3": AlgoSpec(SB3, "SB3 TD3 on a reward rule's relabelled rewards (continuous actions)"),
    "loop": AlgoSpec(LLM, "LOOP: leave-one-out PPO for LLM agents", _LLM_EXTRA),
    "vcbm-loop": AlgoSpec(LLM, "VCBM-blended LOOP", _LLM_EXTRA),
    "trl-grpo": AlgoSpec(LLM, "TRL's GRPO (sequence-level advantage)", _LLM_EXTRA),
    "ccpo": AlgoSpec(
        TWO_ROLE, "two roles of one LLM (Thinker, Solver) with CCPO, SEPO or Shapley credit (arXiv 2603.21563)", _LLM_EXTRA
    ),
}


def get_algo(name: str) -> AlgoSpec:
    name = canonical_algo(name)
    if name not in ALGOS:
        raise VcbmGymError(f"unknown algo {name!r}; expected one of: {', '.join(ALGOS)}")
    return ALGOS[name]


def get_arm(algo: str) -> Arm:
    """The arm that trains `algo` (its runner module imported on first use, after a check that the optional extra
    it needs is installed: one line naming the extra instead of an ImportError's traceback)."""
    spec = get_algo(algo)
    if spec.extra is not None:
        require_extra(f"--algo {canonical_algo(algo)}", spec.extra)
    return importlib.import_module(spec.runner).ARM
