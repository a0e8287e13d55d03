"""The one resolved run (`RunSpec`), how it is run (`RunOptions`), and the arm interface (`Arm`).

A run is resolved once, by its arm, from a flat mapping of hyperparameters (zoo YAML, --config,
--hyperparams and the arm's flags folded together by `algorithms.train`, or built in memory by
`compare`, `tune` and `suite`): the result is a frozen `RunSpec` holding both the plain values that
config.yml records and the hash identifies (`hyperparams`) and the arm's own typed config built from
them (`config`). Everything after resolution passes that object; no command line is built or parsed
again.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import sys
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from algorithms.common.credit_slot import CreditFit
from vcbm_gym.credit.base import NO_CREDIT
from vcbm_gym.credit.registry import rule_names

Report = Callable[[int, dict[str, float]], None]


def canonical_json(data: Any) -> str:
    return json.dumps(data, sort_keys=True, default=str, allow_nan=True)


@dataclasses.dataclass(frozen=True)
class RunSpec:
    """Everything that decides a run's result; `config_hash` identifies it.

    `hyperparams` are the resolved plain values (what config.yml records); `config` is the arm's typed
    config built from them once by `Arm.resolve` (not part of the identity: it is a function of it)."""

    algo: str
    env: str
    seed: int
    hyperparams: Mapping[str, Any]
    config: Any = dataclasses.field(default=None, compare=False, repr=False)

    def identity(self) -> dict[str, Any]:
        # through JSON, so that a config read back from config.yml compares equal
        plain = {"algo": self.algo, "env": self.env, "seed": self.seed, "hyperparams": dict(self.hyperparams)}
        return json.loads(canonical_json(plain))

    @property
    def config_hash(self) -> str:
        return hashlib.sha256(canonical_json(self.identity()).encode()).hexdigest()[:16]

    def with_seed(self, seed: int) -> RunSpec:
        """The same run with another seed (no arm's config depends on the seed)."""
        return dataclasses.replace(self, seed=seed)


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """How a run is carried out, not what it computes (none of it enters the config hash)."""

    progress: bool = True
    resume: bool = False  # continue the run in the log dir (same config only)
    overwrite: bool = False  # replace the run in the log dir
    # report(step, {"correct_rate": ..., "return": ...}) as the run trains; step = episodes (tabular, SB3) or
    # iterations (LLM). algorithms.tune prunes through it (by raising). None: no one listens.
    report: Report | None = None
    record: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # extra entries for config.yml (the command)


@dataclasses.dataclass(frozen=True)
class Objective:
    """What `algorithms.tune` optimises for an arm, and the value it prunes on as a run trains."""

    direction: str  # "minimize" | "maximize"
    name: str
    intermediate: str

    def intermediate_value(self, metrics: Mapping[str, float]) -> float | None:
        if "correct_rate" not in metrics:
            return None
        rate = float(metrics["correct_rate"])
        return 1.0 - rate if self.direction == "minimize" else rate


EPISODES = Objective(
    "minimize",
    "episodes to converge, mean over the seeds (the cap for a run that does not converge)",
    "incorrect-decision rate, 1 - the correct-decision moving average",
)
ITERATIONS = Objective(
    "maximize",
    "task goal completion (optimal-decision rate), mean of the last --final-window iterations and the seeds",
    "task goal completion of the iteration",
)


# Old algo names kept working for a deprecation period: `vcbm+` read like the ALGO+RULE label of a method.
DEPRECATED_ALGOS = {"vcbm+": "vcbm-plus"}
_warned: set[str] = set()


def canonical_algo(name: str) -> str:
    """`name`, or the current name of a deprecated one (with one warning line on stderr per process)."""
    new = DEPRECATED_ALGOS.get(name)
    if new is None:
        return name
    if name not in _warned:
        _warned.add(name)
        print(f"warning: algo {name!r} is deprecated; use {new!r}", file=sys.stderr)
    return new


class Arm(ABC):
    """One family of algorithms (tabular, SB3, LLM): how its runs are resolved, checked and trained, and
    what the experiment commands (compare, tune, plot, suite) need to know about it."""

    name: ClassVar[str]  # "tabular" | "sb3" | "llm"
    budget_key: ClassVar[str]  # the hyperparameter that bounds a run: max_episodes | iterations
    budget_flag: ClassVar[str]  # the train flag that sets it: --max-episodes | --iterations
    budget_unit: ClassVar[str]  # episodes | iterations
    objective: ClassVar[Objective]
    metric_tags: ClassVar[Mapping[str, str]]  # metric ("correct_rate", "return") -> TensorBoard tag
    reports_convergence: ClassVar[bool]  # summaries carry episodes to converge (compare's measure)
    multi_process: ClassVar[bool] = False  # accepts torchrun / accelerate launch
    resumes_itself: ClassVar[bool] = False  # keeps checkpoints: --resume continues instead of restarting
    # What a credit rule can learn from in this arm, in the terms of CreditRule.batch_needs and .info_needs
    # (vcbm_gym/credit/base.py): EpisodeBatch fields beyond rewards and mask, and the env info keys the arm
    # collects per turn into its batches. A rule is refused by comparing its declarations with these.
    batch_provides: ClassVar[frozenset[str]] = frozenset()
    info_provides: ClassVar[frozenset[str]] = frozenset()

    def default_credit(self, algo: str) -> str:
        """The credit rule a run of `algo` uses when no config names one ("none": the algorithm's own)."""
        return NO_CREDIT

    def method_label(self, algo: str, credit: str | None) -> str:
        """`algo`, or `algo+rule` when the run's credit rule is not the algorithm's default (`loop+none` too)."""
        return algo if credit is None or credit == self.default_credit(algo) else f"{algo}+{credit}"

    # The arm's own defaults for a rule's arguments, where the rule's differ (rule name -> kwargs).
    rule_defaults: ClassVar[Mapping[str, Mapping[str, Any]]] = {}

    def provides(self, algo: str | None = None) -> tuple[frozenset[str], frozenset[str]]:
        """(batch fields, info keys) a rule can learn from in a run of `algo` (default: the arm's)."""
        return self.batch_provides, self.info_provides

    def consumes(self, algo: str | None = None) -> frozenset[str]:
        """The kinds of credit (vcbm_gym.credit.base: "rewards", "advantages") the learner of `algo` takes (how is
        each arm's to say: algorithms/common/credit_slot.py); `algo` None: any algorithm of the arm."""
        return frozenset()

    def credit_fit(self, algo: str | None = None) -> CreditFit:
        """What the learner of `algo` (None: any of the arm's) gives a credit rule and takes from it."""
        batch, info = self.provides(algo)
        learner = f"{algo!r}" if algo else f"the {self.name} arm"
        return CreditFit(self.name, learner, batch, info, self.consumes(algo), self.rule_defaults)

    def credit_misfit(self, name: str, algo: str | None = None) -> str | None:
        """Why credit rule `name` cannot run with `algo` (None: any algo) in this arm (one line), or None."""
        return self.credit_fit(algo).misfit(name)

    def credit_rules(self, algo: str | None = None) -> tuple[str, ...]:
        """ "none" (unless the learner has no credit of its own) and every registered rule that fits (imports every
        rule's module)."""
        return tuple(name for name in (NO_CREDIT, *rule_names()) if self.credit_misfit(name, algo) is None)

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        """The arm's own train flags."""

    def flag_hyperparams(self, args: argparse.Namespace) -> dict[str, Any]:
        """The arm's flags as hyperparameters, so that the resolved config holds them."""
        return {}

    @abstractmethod
    def resolve(self, algo: str, env: str, seed: int, mapping: Mapping[str, Any]) -> RunSpec:
        """Check `mapping` (an unknown key, a wrong type, a bad env_kwargs or rule: one line) and build the spec."""

    def validate(self, spec: RunSpec) -> None:
        """Build the run's objects dry, before the log dir exists (default: resolve already checked all)."""

    def check_resume(self, spec: RunSpec, log_dir: str) -> None:
        """--resume, before the log dir is touched: refuse a run that cannot be continued (default: an arm
        that keeps no checkpoints restarts an unfinished run, so nothing is refused)."""

    @abstractmethod
    def run(self, spec: RunSpec, log_dir: str, options: RunOptions) -> dict[str, Any]:
        """Train, log into `log_dir`, and return the summary's entries."""
