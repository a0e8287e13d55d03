"""The measures a spec scores its results by: each reads one method's values in one setting from a results document.

A measure returns the per-seed values of a method (a list: the comparison is then the probability of improvement
with its bootstrap CI and Mann-Whitney, algorithms.experiment.stats), or, for a measure whose results keep only an
estimate with its CI (the replay reference's fidelity), that estimate. Each reads the results format of the
command that makes it: compare's and suite's results.json, and the benchmarks' own.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from algorithms.common.errors import VcbmGymError


@dataclass(frozen=True)
class Estimate:
    estimate: float
    ci_low: float | None
    ci_high: float | None


Values = list[float] | Estimate


@dataclass(frozen=True)
class Measure:
    description: str
    higher_is_better: bool
    read: Callable[[dict[str, Any], str, str | None, dict[str, Any]], Values]


def _get(document: Any, *path: str) -> Any:
    node = document
    for key in path:
        if not isinstance(node, dict) or key not in node:
            raise VcbmGymError(f"results hold no {'.'.join(path)!r} (missing {key!r}): expected the measure's results format")
        node = node[key]
    return node


def _floats(values: Any, where: str) -> list[float]:
    if not isinstance(values, list) or not values:
        raise VcbmGymError(f"results' {where} is {values!r}: expected a non-empty list of per-seed values")
    return [float(v) for v in values]


def episodes_to_converge(results: dict[str, Any], method: str, setting: str | None, options: dict[str, Any]) -> Values:
    """compare's results.json: episodes to converge per seed (a run stopped by the cap counts with the cap)."""
    return _floats(_get(results, "algos", method, "episodes_for_stats"), f"algos.{method}.episodes_for_stats")


def bsuite_score(results: dict[str, Any], method: str, setting: str | None, options: dict[str, Any]) -> Values:
    """suite's results.json: bsuite's own score of each seed on the experiment `setting` (bsuite's analysis)."""
    return _floats(_get(results, "experiments", setting, "algos", method, "seed_scores"), f"{setting}.{method}.seed_scores")


def final_true_return(results: dict[str, Any], method: str, setting: str | None, options: dict[str, Any]) -> Values:
    """The episodic-MuJoCo benchmark: each seed's true (dense) return at the last evaluation, in env `setting`."""
    return _floats(_get(results, "envs", setting, "methods", method, "final_true_return"), f"{setting}.{method}")


def iterations_to_threshold(results: dict[str, Any], method: str, setting: str | None, options: dict[str, Any]) -> Values:
    """The LLM benchmarks: iterations until the moving rate first reaches the target (a seed that never does counts
    with the run's length), in setting `setting`."""
    key = options.get("key", "iterations_to_90")
    return _floats(_get(results, "settings", setting, "methods", method, key), f"{setting}.{method}.{key}")


def final_rate(results: dict[str, Any], method: str, setting: str | None, options: dict[str, Any]) -> Values:
    """A rate at the end of training per seed: `key` of the method, under `settings.<setting>` where there is one."""
    key = options["key"]
    node = _get(results, "settings", setting) if setting is not None else results
    return _floats(_get(node, "methods", method, key), f"{setting or ''}.{method}.{key}")


def credit_leakage(results: dict[str, Any], method: str, setting: str | None, options: dict[str, Any]) -> Values:
    """The credit-leakage measure: each seed's share of |advantage| put on the steps after the decision (lower is
    better: the decision earned the return)."""
    return _floats(_get(results, "rules", method, "shares"), f"rules.{method}.shares")


def reference_fidelity(results: dict[str, Any], method: str, setting: str | None, options: dict[str, Any]) -> Values:
    """The replay reference: the rule's agreement (`metric`, e.g. sign_nz) with Q(s_t, a_t) - V(s_t), an estimate
    over the reference's episodes with its bootstrap CI (no per-seed values)."""
    metric = options.get("metric", "sign_nz")
    summary = _get(results, "rules", method, "summary", metric)
    if summary.get("estimate") is None:
        raise VcbmGymError(f"rule {method!r} has no defined {metric!r} in these results")
    return Estimate(float(summary["estimate"]), summary.get("ci_low"), summary.get("ci_high"))


def descriptive(results: dict[str, Any], method: str, setting: str | None, options: dict[str, Any]) -> Values:
    """An experiment that describes (a yardstick, a fit) and compares nothing: its section shows its own tables."""
    raise VcbmGymError("a descriptive experiment has no comparisons: expected comparisons: []")


MEASURES: dict[str, Measure] = {
    "episodes_to_converge": Measure("episodes to converge (lower is better)", False, episodes_to_converge),
    "bsuite_score": Measure("bsuite's own score per seed (higher is better)", True, bsuite_score),
    "final_true_return": Measure("final true return (higher is better)", True, final_true_return),
    "iterations_to_threshold": Measure("iterations to the target rate (lower is better)", False, iterations_to_threshold),
    "final_rate": Measure("final rate (higher is better)", True, final_rate),
    "credit_leakage": Measure("share of credit after the decision (lower is better)", False, credit_leakage),
    "reference_fidelity": Measure("agreement with the replay reference (higher is better)", True, reference_fidelity),
    "descriptive": Measure("descriptive: the experiment's own tables, no comparison", True, descriptive),
}


def read(measure: dict[str, Any], results: dict[str, Any], method: str, setting: str | None) -> Values:
    """The values of `method` in `setting` by the spec's measure (its name and options)."""
    options = {k: v for k, v in measure.items() if k != "name"}
    return MEASURES[measure["name"]].read(results, method, setting, options)
