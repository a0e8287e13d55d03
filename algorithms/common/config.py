"""Hyperparameters: rl-zoo style YAML files keyed by env id, overlaid and checked against dataclasses."""

from __future__ import annotations

import dataclasses
import fnmatch
import math
import re
import typing
from pathlib import Path
from typing import Any, Mapping

import yaml

from algorithms.common.errors import ConfigError

ZOO_CONFIG_DIR = Path(__file__).resolve().parents[2] / "zoo_configs"


class _Loader(yaml.SafeLoader):
    """SafeLoader that reads `1e-3` as the float it is (YAML 1.2); PyYAML's YAML 1.1 rules make it a string."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def load_object(target: str) -> Any:
    """Import "package.module:Attribute" (or a whole module): for the targets of the project's own tables (an arm's
    AGENTS), never for a string read from a config file or a command line."""
    import importlib

    module_name, _, attr = target.partition(":")
    module = importlib.import_module(module_name)
    return getattr(module, attr) if attr else module


def load_yaml(text: str) -> Any:
    return yaml.load(text, Loader=_Loader)  # noqa: S506 (a SafeLoader subclass)


def read_yaml(path: str | Path) -> Any:
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"config file {str(path)!r} does not exist: expected a YAML file")
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} is not a file: expected a YAML file")
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(
            f"config file {str(path)!r} cannot be read as text ({type(exc).__name__}): expected a YAML file"
        ) from None
    if "\0" in text:
        raise ConfigError(f"config file {str(path)!r} holds binary data: expected a YAML file")
    try:
        return load_yaml(text)
    except yaml.YAMLError as exc:
        first = str(exc).strip().splitlines()
        where = ""
        mark = getattr(exc, "problem_mark", None)
        if mark is not None:
            where = f" at line {mark.line + 1}, column {mark.column + 1}"
        raise ConfigError(
            f"malformed config file {str(path)!r}{where}: {first[0] if first else exc}; expected valid YAML"
        ) from None


def on_this_machine(layer: dict[str, Any]) -> dict[str, Any]:
    """One layer of a run's settings (the zoo's entry, a --config file, --hyperparams) with its own `cpu_overrides`
    in place of its values on a machine without a CUDA GPU, and without them on one with it. They replace that
    layer's values only: a later layer, the user's --hyperparams and flags, still wins over the zoo's CPU setting."""
    overrides = layer.pop("cpu_overrides", None)
    if not overrides:
        return layer
    if not isinstance(overrides, dict):
        raise ConfigError(f"cpu_overrides={overrides!r}: expected a mapping of hyperparameters")
    import torch

    if not torch.cuda.is_available():
        layer.update({k: v for k, v in overrides.items() if k != "cpu_overrides"})
    return layer


def zoo_hyperparams(algo: str, env_id: str, config_dir: Path = ZOO_CONFIG_DIR) -> dict[str, Any]:
    """The entry for `env_id` in zoo_configs/<algo>.yml (empty if that file has no entry).

    A file may start from a shared base file: `base: NAME` (a file in the same folder, keyed by env id the
    same way; zoo_configs/llm-base.yml holds the LLM arm's). An env id the file lists then starts from the
    base's entry for that id, and each key the file sets replaces the base's whole (a mapping such as
    env_kwargs is replaced, not merged); an env id the file does not list has no entry. A base may have a
    base of its own. A key with `*` is a pattern (fnmatch) for the ids it matches, e.g. `bsuite:umbrella_length/*`
    for every setting of an experiment; an id's own key comes first, then the first pattern that matches."""
    return _zoo_entry(config_dir / f"{algo}.yml", env_id, ())


def _zoo_entry(path: Path, env_id: str, named_by: tuple[Path, ...]) -> dict[str, Any]:
    if not path.is_file():
        if named_by:
            raise ConfigError(
                f"malformed config file {str(named_by[-1])!r}: base {path.name!r} is not a file in {str(path.parent)!r}; "
                "expected the name of a zoo file beside it"
            )
        return {}
    data = read_yaml(path) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"malformed config file {str(path)!r}: expected a mapping of env id -> hyperparameters")
    key = env_id if env_id in data else next((k for k in data if "*" in str(k) and fnmatch.fnmatchcase(env_id, str(k))), None)
    entry = data.get(key) or {}
    if not isinstance(entry, dict):
        raise ConfigError(f"malformed config file {str(path)!r}: entry {env_id!r} must be a mapping")
    base = data.get("base")
    if base is None or key is None:
        return dict(entry)
    if not isinstance(base, str) or Path(base).name != base or not base:
        raise ConfigError(f"malformed config file {str(path)!r}: base={base!r}; expected the name of a zoo file beside it")
    base_path = path.parent / base
    if base_path == path or base_path in named_by:
        chain = " -> ".join(p.name for p in (*named_by, path, base_path))
        raise ConfigError(f"malformed config file {str(path)!r}: its bases form a cycle ({chain}); expected a chain that ends")
    return {**_zoo_entry(base_path, env_id, (*named_by, path)), **entry}


RUN_RECORD_KEYS = {"algo", "env", "hyperparams", "config_hash"}  # a config.yml written by algorithms.train


def user_config(path: str | Path, env_id: str, env_ids: typing.Collection[str], algo: str | None = None) -> dict[str, Any]:
    """A --config file: keyed by env id like zoo_configs, a flat mapping of hyperparameters, or
    the config.yml of an earlier run (its resolved hyperparameters, for the same algo and env)."""
    data = read_yaml(path)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"malformed config file {str(path)!r}: expected a mapping of hyperparameters, got {type(data).__name__}"
        )
    if RUN_RECORD_KEYS <= set(data):
        if (data["algo"], data["env"]) != (algo, env_id) or not isinstance(data["hyperparams"], dict):
            raise ConfigError(
                f"config file {str(path)!r} records a run of --algo {data['algo']} --env {data['env']}: "
                f"expected --algo {algo} --env {env_id} to rerun it"
            )
        from algorithms.common.credit_slot import CREDIT_RECORD, check_recorded_rule  # imports the rule registry

        check_recorded_rule(data.get(CREDIT_RECORD), str(path))  # before its name is looked up: says what to install
        return dict(data["hyperparams"])
    if data and all(key in env_ids for key in data):
        entry = data.get(env_id)
        if entry is None:
            raise ConfigError(f"config file {str(path)!r} has no entry for env {env_id!r}; it has {sorted(data)}")
        if not isinstance(entry, dict):
            raise ConfigError(f"malformed config file {str(path)!r}: entry {env_id!r} must be a mapping")
        return dict(entry)
    return dict(data)


def parse_overrides(items: typing.Sequence[str]) -> dict[str, Any]:
    """`key=value` pairs; values are parsed as YAML scalars (`0.1`, `true`, `[1, 2]`)."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"malformed hyperparameter {item!r}: expected key=value")
        try:
            out[key.strip()] = load_yaml(raw)
        except yaml.YAMLError:
            raise ConfigError(f"malformed value in hyperparameter {item!r}: expected a YAML scalar or list") from None
    return out


def coerce_value(name: str, value: Any, annotation: Any, owner: str) -> Any:
    """Check a value against a dataclass field's annotation (int, float, bool, str, lists, dicts, Optional)."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Union or (origin is not None and str(origin) == "<class 'types.UnionType'>"):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return coerce_value(name, value, arg, owner)
            except ConfigError as exc:
                errors.append(exc)
        raise errors[0]
    if annotation is typing.Any:
        return value
    bad = ConfigError(f"hyperparameter {name}={value!r} for {owner}: expected {getattr(annotation, '__name__', annotation)}")
    if annotation is bool:
        if not isinstance(value, bool):
            raise bad
        return value
    if annotation is int:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise bad
        if isinstance(value, float) and (not math.isfinite(value) or int(value) != value):
            raise bad
        return int(value)
    if annotation is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise bad
        if not math.isfinite(value):
            raise ConfigError(f"hyperparameter {name}={value!r} for {owner}: expected a finite number")
        return float(value)
    if annotation is str:
        if not isinstance(value, str):
            raise bad
        return value
    if origin in (list, tuple, typing.Sequence) or annotation in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise bad
        return list(value) if origin is list or annotation is list else tuple(value)
    if origin is dict or annotation is dict:
        if not isinstance(value, dict):
            raise bad
        return dict(value)
    return value


def build_dataclasses(mapping: Mapping[str, Any], classes: typing.Sequence[type], owner: str) -> list[Any]:
    """Split a flat mapping across dataclasses by field name; an unknown key or a wrong type is an error."""
    hints = [typing.get_type_hints(cls) for cls in classes]
    fields = [{f.name for f in dataclasses.fields(cls)} for cls in classes]
    known = sorted(set().union(*fields))
    kwargs: list[dict[str, Any]] = [{} for _ in classes]
    for key, value in mapping.items():
        for i, names in enumerate(fields):
            if key in names:
                kwargs[i][key] = coerce_value(key, value, hints[i][key], owner)
                break
        else:
            raise ConfigError(f"unknown hyperparameter {key!r} for {owner}; expected one of: {', '.join(known)}")
    return [cls(**kw) for cls, kw in zip(classes, kwargs)]


def make_env(env_id: str, env_kwargs: Mapping[str, Any], **extra: Any) -> Any:
    """gym.make with the env constructor's own checks turned into one ConfigError line."""
    import gymnasium as gym

    from envs.bsuite import BSuiteIdError, env_id_problem

    check_bsuite_setting(env_id, env_kwargs)
    module, _, name = env_id.rpartition(":")
    # vcbm_gym registers every bsuite setting itself: Gymnasium need not import a module called bsuite to find it
    made = name if module == "bsuite" and name in gym.registry else env_id
    try:
        return gym.make(made, **extra, **env_kwargs)
    except BSuiteIdError as exc:  # names the id itself; env_kwargs may hold keys a runner added, not the user
        raise ConfigError(f"env {env_id}: {exc}") from None
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"env_kwargs {dict(env_kwargs)!r} for {env_id}: {exc}") from None
    except gym.error.UnregisteredEnv:
        problem = env_id_problem(env_id)
        if problem is None:
            raise
        raise ConfigError(problem) from None


def check_bsuite_setting(env_id: str, env_kwargs: Mapping[str, Any]) -> None:
    """An id of one bsuite setting (bsuite:umbrella_length/9) fixes its bsuite_id: env_kwargs naming another
    would run that one while config.yml and summary.json name the id's."""
    from gymnasium.envs.registration import registry

    spec = registry.get(env_id.rpartition(":")[2])
    fixed = None if spec is None else spec.kwargs.get("bsuite_id")
    asked = env_kwargs.get("bsuite_id", fixed)
    if fixed is not None and asked != fixed:
        raise ConfigError(
            f"env_kwargs bsuite_id={asked!r} for env {env_id}, which is bsuite_id {fixed!r}: expected one setting, "
            "named by the env id alone (bsuite:<experiment>/<setting>) or by BSuite-v0 with env_kwargs bsuite_id"
        )


def log_env_to_run_dir(env: Any, log_dir: str, env_kwargs: Mapping[str, Any], index: int | None = None) -> None:
    """An env that keeps its own log (bsuite's CSV: `log_to(dir)`) writes it inside the run's log dir
    (`env_log/`, `env_log/env<i>` for sub-env i of several), so parallel seeds never share one file; a
    `log_dir` the user set in env_kwargs wins."""
    log_to = getattr(env.unwrapped, "log_to", None)
    if callable(log_to) and "log_dir" not in env_kwargs:
        log_to(Path(log_dir) / "env_log" / ("" if index is None else f"env{index}"))


def as_plain_dict(*instances: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for inst in instances:
        for key, value in dataclasses.asdict(inst).items():
            out[key] = list(value) if isinstance(value, tuple) else value
    return out
