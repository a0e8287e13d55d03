"""The search space of `algorithms.tune`: one checked distribution per searched hyperparameter
(zoo_configs/search_spaces.yml, or --search-space FILE), and a trial's values applied to the base config.

A dotted name (`credit_kwargs.vcbm_bookmark.alpha`) searches one key inside a mapping-valued hyperparameter;
the budget and the seed are tune's to set, never searched.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from pathlib import Path
from typing import Any

from algorithms.common.config import ZOO_CONFIG_DIR, read_yaml
from algorithms.common.errors import ConfigError

SEARCH_SPACES = ZOO_CONFIG_DIR / "search_spaces.yml"
KINDS = ("float", "int", "categorical")
BUDGET_KEYS = ("max_episodes", "iterations", "seed")  # the budget and the seeds are tune's, not searched


@dataclasses.dataclass(frozen=True)
class Param:
    """One searched hyperparameter and its distribution."""

    name: str
    kind: str
    low: float | None = None
    high: float | None = None
    log: bool = False
    step: int | None = None
    choices: tuple | None = None

    def suggest(self, trial: Any) -> Any:
        if self.kind == "float":
            return trial.suggest_float(self.name, self.low, self.high, log=self.log)
        if self.kind == "int":
            return trial.suggest_int(self.name, int(self.low), int(self.high), step=self.step or 1, log=self.log)
        return trial.suggest_categorical(self.name, list(self.choices))

    def corners(self) -> list[Any]:
        """Values that together reach every edge of the space (checked against the runner before any trial)."""
        if self.kind == "categorical":
            return list(self.choices)
        cast = float if self.kind == "float" else int
        return [cast(self.low), cast(self.high)]


def parse_search_space(spec: Any, where: str) -> list[Param]:
    """{name: {type, low, high, log, step | choices}} -> checked Params; one clear line for each mistake."""
    if not isinstance(spec, dict) or not spec:
        raise ConfigError(f"{where}: expected a non-empty mapping of hyperparameter -> distribution")
    params = []
    for name, dist in spec.items():
        at = f"{where}, {name!r}"
        if not isinstance(name, str) or not name or name.split(".")[0] in BUDGET_KEYS:
            raise ConfigError(f"{at}: expected a hyperparameter name other than {', '.join(BUDGET_KEYS)} (tune sets those)")
        if not isinstance(dist, dict) or dist.get("type") not in KINDS:
            raise ConfigError(f"{at}: {dist!r}: expected a mapping with type one of {', '.join(KINDS)}")
        allowed = (
            {"type", "choices"}
            if dist["type"] == "categorical"
            else {"type", "low", "high", "log"} | ({"step"} if dist["type"] == "int" else set())
        )
        extra = sorted(set(dist) - allowed)
        if extra:
            raise ConfigError(f"{at}: unknown key(s) {', '.join(map(str, extra))}; expected: {', '.join(sorted(allowed))}")
        if dist["type"] == "categorical":
            choices = dist.get("choices")
            if not isinstance(choices, list) or not choices or any(isinstance(c, (dict, list)) for c in choices):
                raise ConfigError(f"{at}: choices={choices!r}: expected a non-empty list of scalars")
            params.append(Param(name, "categorical", choices=tuple(choices)))
            continue
        low, high, log, step = dist.get("low"), dist.get("high"), dist.get("log", False), dist.get("step")
        numbers = (int,) if dist["type"] == "int" else (int, float)
        if any(isinstance(v, bool) or not isinstance(v, numbers) or not math.isfinite(v) for v in (low, high)):
            kind = "integers" if dist["type"] == "int" else "finite numbers"
            raise ConfigError(f"{at}: low={low!r}, high={high!r}: expected {kind}")
        if not low < high or not isinstance(log, bool) or (log and low <= 0):
            raise ConfigError(
                f"{at}: low={low!r}, high={high!r}, log={log!r}: expected low < high, log true or false, and low > 0 with log"
            )
        if step is not None and (isinstance(step, bool) or not isinstance(step, int) or step < 1 or log):
            raise ConfigError(f"{at}: step={step!r}: expected an integer >= 1, and no step with log")
        params.append(Param(name, dist["type"], low, high, log, step))
    return params


def load_search_space(algo: str, path: str | Path | None) -> list[Param]:
    source = Path(path) if path is not None else SEARCH_SPACES
    data = read_yaml(source)
    if not isinstance(data, dict):
        raise ConfigError(f"search space file {str(source)!r}: expected a mapping of algo -> search space")
    if algo not in data:
        raise ConfigError(
            f"search space file {str(source)!r} has no entry for algo {algo!r}; it has: {', '.join(map(str, data)) or 'none'}"
        )
    return parse_search_space(data[algo], f"search space file {str(source)!r}, algo {algo!r}")


def apply_params(base: dict[str, Any], values: dict[str, Any]) -> dict[str, Any]:
    """The top-level hyperparameters that `values` change, dotted names merged into their mapping from `base`."""
    out: dict[str, Any] = {}
    for name, value in values.items():
        top, *path = name.split(".")
        if not path:
            out[top] = value
            continue
        mapping = out.setdefault(top, copy.deepcopy(base.get(top) or {}))
        if not isinstance(mapping, dict):
            raise ConfigError(f"searched hyperparameter {name!r}: {top}={mapping!r} is not a mapping")
        for key in path[:-1]:
            inner = mapping.setdefault(key, {})
            if not isinstance(inner, dict):
                raise ConfigError(f"searched hyperparameter {name!r}: {key}={inner!r} is not a mapping")
            mapping = inner
        mapping[path[-1]] = value
    return out
