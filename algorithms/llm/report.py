"""Passes each finished iteration's metrics to a run's `RunOptions.report` (algorithms.tune prunes on them)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from transformers import TrainerCallback


class ReportIterations(TrainerCallback):
    """After every optimizer step, each new entry of `trainer.history` (one per iteration, appended by the
    trainer's own iteration-end callback, which was added first and so runs first) goes to `report` as
    (iteration, {"correct_rate": task goal completion, "return": mean return})."""

    def __init__(self, trainer: Any, report: Callable[[int, dict[str, float]], None]) -> None:
        self.trainer, self.report, self.seen = trainer, report, len(trainer.history)

    def on_step_end(self, args, state, control, **kwargs):
        while self.seen < len(self.trainer.history):
            entry = self.trainer.history[self.seen]
            self.seen += 1
            metrics = {"return": float(entry["mean_return"])}
            if "task_goal_completion" in entry:
                metrics["correct_rate"] = float(entry["task_goal_completion"])
            self.report(int(entry["iteration"]), metrics)
