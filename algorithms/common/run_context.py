"""What `algorithms.train` hands to a runner."""

from __future__ import annotations

import argparse
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
    progress: bool = True
