"""A runner module seen as an `Arm` (transitional: each arm becomes its own Arm class)."""

from __future__ import annotations

import argparse
import copy
from collections.abc import Mapping
from types import ModuleType
from typing import Any

from algorithms.common.run_context import RunContext
from algorithms.common.spec import EPISODES, ITERATIONS, Arm, RunOptions, RunSpec  # noqa: F401 (the LLM runner imports them from here)


class ModuleArm(Arm):
    def __init__(self, module: ModuleType, **attributes: Any) -> None:
        self.module = module
        for key, value in attributes.items():
            setattr(self, key, value)

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        if hasattr(self.module, "add_arguments"):
            self.module.add_arguments(parser)

    def flag_hyperparams(self, args: argparse.Namespace) -> dict[str, Any]:
        return self.module.flag_hyperparams(args) if hasattr(self.module, "flag_hyperparams") else {}

    def resolve(self, algo: str, env: str, seed: int, mapping: Mapping[str, Any]) -> RunSpec:
        return RunSpec(algo, env, seed, self.module.resolve(algo, env, dict(mapping)))

    def _context(self, spec: RunSpec, log_dir: str, options: RunOptions) -> RunContext:
        args = argparse.Namespace(resume=options.resume, overwrite=options.overwrite, no_progress=not options.progress)
        return RunContext(
            spec.algo, spec.env, spec.seed, log_dir, copy.deepcopy(dict(spec.hyperparams)), args, options.progress, options.report
        )

    def validate(self, spec: RunSpec, log_dir: str, options: RunOptions) -> None:
        if hasattr(self.module, "validate"):
            self.module.validate(self._context(spec, log_dir, options))

    def run(self, spec: RunSpec, log_dir: str, options: RunOptions) -> dict[str, Any]:
        return self.module.run(self._context(spec, log_dir, options))
