"""What `algorithms.train` hands to a runner."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass
class RunContext:
    algo: str
    env_id: str
    seed: int
    log_dir: str
    hyperparams: dict[str, Any]  # resolved: defaults filled in, validated by the runner
    args: argparse.Namespace  # the full command line, runner-specific flags included
    progress: bool
    # called by the runner as it trains: report(step, {"correct_rate": ..., "return": ...}), step = episodes
    # (tabular, SB3) or iterations (LLM); "correct_rate" only where the env reports first_decision_optimal
    # (task_goal_completion for LLM). algorithms.tune prunes through it (by raising). None: no one listens.
    report: Callable[[int, dict[str, float]], None] | None
