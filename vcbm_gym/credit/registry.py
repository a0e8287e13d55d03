"""Credit rules by name: the built-in table, rules registered at run time, and rules of installed distributions.

Three sources, one lookup (`rule_source` / `rule_class` / `make_rule`), so that `--credit NAME`, `ALGO+NAME` labels,
credit_reference and the leakage measure resolve every rule the same way:

- the built-in rules (`RULES`, each module imported on first use: torch-based rules cost nothing otherwise);
- `register_rule(name, cls)`, for a notebook or a script that runs the tools in-process;
- an entry point of group `vcbm_gym.credit_rules` (`name = package.module:Class`) of an installed distribution,
  loaded only when its name is asked for (listing the names reads the distributions' metadata, not their code).

A name two sources claim is an error naming both, never a silent choice. A name is a key of these tables, never an
import path: a config that names a rule cannot make the tools import a module of its choosing.

Kept apart from `base` (the interface every rule module imports): this table names the rule modules, so it
sits above them.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import inspect
from dataclasses import dataclass
from typing import Any

from vcbm_gym.credit.base import NO_CREDIT, CreditRule

ENTRY_POINT_GROUP = "vcbm_gym.credit_rules"
DISTRIBUTION = "vcbm-gym"  # the distribution the built-in rules come with

# name -> "module:Class"; imported on first use so that torch-based rules cost nothing otherwise.
RULES: dict[str, str] = {
    "broadcast": "vcbm_gym.credit.broadcast:BroadcastRule",
    "loo": "vcbm_gym.credit.loo:LeaveOneOutRule",
    "grpo": "vcbm_gym.credit.grpo:GroupMeanRule",
    "rudder": "vcbm_gym.credit.rudder:RudderRule",
    "vcbm_bookmark": "vcbm_gym.credit.vcbm_bookmark:VCBMBookmarkRule",
    "vcbm_blend": "vcbm_gym.credit.vcbm_blend:VCBMBlendRule",
    "gigpo": "vcbm_gym.credit.gigpo:GiGPORule",
    "casi": "vcbm_gym.credit.set_credit:CASIShapingRule",
    "ircr": "vcbm_gym.credit.ircr:IRCRRule",
    "rrd": "vcbm_gym.credit.rrd:RRDRule",
    "vineppo": "vcbm_gym.credit.vineppo:VinePPORule",
    "rice": "vcbm_gym.credit.rice:RICERule",
    # two-role rules: each row paid its role's reward (only the two-role LLM arm, --algo ccpo, fills their batch
    # extras); that arm's baseline, both roles paid the shared reward, is `grpo` above
    "ccpo": "vcbm_gym.credit.ccpo:CCPORule",
    "sepo": "vcbm_gym.credit.ccpo:SEPORule",
    "shapley": "vcbm_gym.credit.ccpo:ShapleyRule",
}

HOW_TO_REGISTER = (
    f"a rule of your own is registered by vcbm_gym.credit.register_rule(name, cls) in-process, or by an entry point "
    f"`name = package.module:Class` in group {ENTRY_POINT_GROUP!r} of an installed distribution (docs/credit_rules.md)"
)

_registered: dict[str, type[CreditRule]] = {}
_loaded: dict[str, type[CreditRule]] = {}  # name -> class, for the rules already imported


class RuleLookupError(KeyError):
    """A credit rule name that does not resolve to exactly one rule class (one line: why, and what to do).

    A KeyError, as a lookup in a table of names is; printed as its message (a KeyError's str is the key's repr)."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


@dataclass(frozen=True)
class RuleSource:
    """Where a rule name comes from: `origin` ("built-in", "registered", "entry point"), the distribution and version
    that ship it (None for a rule registered from a module no installed distribution holds), and its target."""

    name: str
    origin: str
    target: str  # "module:Class"
    distribution: str | None
    version: str | None

    def describe(self) -> str:
        if self.origin == "built-in":
            return "the built-in rules"
        if self.origin == "registered":
            return f"register_rule({self.name!r}, {self.target.replace(':', '.')})"
        return f"entry point '{self.name} = {self.target}' of distribution {self.distribution} {self.version}"

    def record(self) -> dict[str, Any]:
        """What config.yml keeps of it, so that a rerun finds the rule or says what to install."""
        return {"name": self.name, "distribution": self.distribution, "version": self.version}


@functools.cache
def _entry_points() -> tuple[importlib.metadata.EntryPoint, ...]:
    """The installed distributions' entry points of ENTRY_POINT_GROUP (metadata only: nothing is imported)."""
    return tuple(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP))


def forget_entry_points() -> None:
    """Read the installed distributions again on the next lookup (after installing one in-process)."""
    _entry_points.cache_clear()
    _packages_distributions.cache_clear()
    for name in [name for name in _loaded if name not in RULES]:
        del _loaded[name]


def _builtin_version() -> str:
    """The installed vcbm-gym's version (its distribution's metadata, as for a plug-in's)."""
    try:
        return importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return "unknown (not installed)"


@functools.cache
def _packages_distributions() -> dict[str, list[str]]:
    return importlib.metadata.packages_distributions()


def _distribution_of(module: str) -> tuple[str | None, str | None]:
    """The installed distribution (name, version) that holds top-level package of `module`, else (None, None)."""
    names = _packages_distributions().get(module.partition(".")[0], [])
    if len(names) != 1:
        return None, None
    try:
        return names[0], importlib.metadata.version(names[0])
    except importlib.metadata.PackageNotFoundError:
        return None, None


def _claims(name: str) -> list[RuleSource]:
    claims = []
    if name in RULES:
        claims.append(RuleSource(name, "built-in", RULES[name], DISTRIBUTION, _builtin_version()))
    if name in _registered:
        cls = _registered[name]
        claims.append(RuleSource(name, "registered", f"{cls.__module__}:{cls.__qualname__}", None, None))
    for point in _entry_points():
        if point.name == name:
            dist = getattr(point, "dist", None)
            claims.append(
                RuleSource(name, "entry point", point.value, dist.name if dist else None, dist.version if dist else None)
            )
    return claims


def rule_names() -> tuple[str, ...]:
    """Every rule name: the built-in rules, then the registered ones, then the installed distributions' (nothing imported)."""
    names = [*RULES, *_registered, *(point.name for point in _entry_points())]
    return tuple(dict.fromkeys(names))


def is_rule(name: str) -> bool:
    """Whether some source claims `name` (nothing imported; a name two sources claim fails later, at `rule_source`)."""
    return name in RULES or name in _registered or any(point.name == name for point in _entry_points())


def unknown_rule_line(name: str, names: Any = None) -> str:
    """The one line for a name no source claims: the names there are, and how a rule is registered."""
    listed = ", ".join(rule_names() if names is None else names)
    return f"unknown credit rule {name!r}; expected one of: {listed} ({HOW_TO_REGISTER})"


def rule_source(name: str) -> RuleSource:
    """Where rule `name` comes from; RuleLookupError (one line) for a name no source claims or two sources claim."""
    claims = _claims(name)
    if not claims:
        raise RuleLookupError(unknown_rule_line(name))
    if len(claims) > 1:
        raise RuleLookupError(
            f"credit rule {name!r} is claimed by both {claims[0].describe()} and {claims[1].describe()}"
            + (f" (and {len(claims) - 2} more)" if len(claims) > 2 else "")
            + "; expected one rule per name: uninstall or rename one of them"
        )
    return claims[0]


def rule_class(name: str) -> type[CreditRule]:
    """The class of rule `name` (its module imported on first use); RuleLookupError (one line) when it does not resolve."""
    source = rule_source(name)
    if source.origin == "registered":
        return _registered[name]
    if name not in _loaded:
        _loaded[name] = _load(source)
    return _loaded[name]


def _load(source: RuleSource) -> type[CreditRule]:
    if source.origin == "built-in":
        module_name, _, cls_name = source.target.partition(":")
        return getattr(importlib.import_module(module_name), cls_name)
    try:
        check_rule_name(source.name)  # a '+' would split an ALGO+RULE label, "none" is no rule
    except RuleLookupError as exc:
        raise RuleLookupError(f"{source.describe()}: {exc}") from None
    point = next(point for point in _entry_points() if point.name == source.name)
    try:
        cls = point.load()
    except (ImportError, AttributeError) as exc:
        raise RuleLookupError(f"credit rule {source.name!r} ({source.describe()}) cannot be loaded: {exc}") from None
    if not (inspect.isclass(cls) and issubclass(cls, CreditRule)):
        raise RuleLookupError(
            f"credit rule {source.name!r} ({source.describe()}) is {cls!r}: expected a subclass of "
            "vcbm_gym.credit.base.CreditRule"
        )
    return cls


def rule_record(name: str) -> dict[str, Any]:
    """What config.yml keeps of rule `name`: its name and the distribution and version it came from (for a rule
    registered in-process, the distribution that holds its module, if one does)."""
    source = rule_source(name)
    if source.origin == "registered":
        cls = _registered[name]
        source = RuleSource(name, source.origin, source.target, *_distribution_of(cls.__module__))
    return source.record()


def check_rule_name(name: Any) -> str:
    """`name` if it can name a rule: a non-empty string of letters, digits, '_', '-' and '.', not "none" (a '+' would
    split an ALGO+RULE label)."""
    if (
        not isinstance(name, str)
        or not name
        or name == NO_CREDIT
        or not all(ch.isalnum() or ch in "_-." for ch in name)
        or not name[0].isalpha()
    ):
        raise RuleLookupError(
            f"credit rule name {name!r}: expected a name that starts with a letter, of letters, digits, '_', '-' and '.', "
            f"other than {NO_CREDIT!r}"
        )
    return name


def register_rule(name: str, cls: type[CreditRule]) -> type[CreditRule]:
    """Make rule class `cls` available as `name` in this process (a notebook, a script that runs the tools
    in-process); returns `cls`. A name another source claims is one RuleLookupError line naming both."""
    check_rule_name(name)
    if not (inspect.isclass(cls) and issubclass(cls, CreditRule)):
        raise TypeError(f"register_rule({name!r}, {cls!r}): expected a subclass of vcbm_gym.credit.base.CreditRule")
    if _registered.get(name) is cls:
        return cls
    claims = _claims(name)
    if claims:
        mine = RuleSource(name, "registered", f"{cls.__module__}:{cls.__qualname__}", None, None)
        raise RuleLookupError(
            f"credit rule {name!r} is claimed by both {claims[0].describe()} and {mine.describe()}; "
            "expected one rule per name: register it under another name"
        )
    _registered[name] = cls
    return cls


def unregister_rule(name: str) -> None:
    """Forget a rule `register_rule` made available (a notebook redefining its class)."""
    if name not in _registered:
        raise RuleLookupError(f"credit rule {name!r} was not registered by register_rule; registered: {', '.join(_registered)}")
    del _registered[name]
    _loaded.pop(name, None)


def make_rule(name: str, env: Any = None, **kwargs: Any) -> CreditRule:
    """Build a rule by name, e.g. `make_rule("loo")`.

    With `env` (a Gymnasium env), a rule whose inputs depend on the env (RUDDER's features) is
    built by its `from_env(env, **kwargs)`; the other rules ignore it.
    """
    return build_rule(rule_class(name), env=env, **kwargs)


def build_rule(cls: type[CreditRule], env: Any = None, **kwargs: Any) -> CreditRule:
    """An instance of rule class `cls`: by `from_env(env, ...)` when given an env and the class has one; a rule built
    on another (casi's base rule) gets `make_rule` to build it."""
    if "rule_factory" in inspect.signature(cls).parameters:
        kwargs.setdefault("rule_factory", make_rule)
    if env is not None and hasattr(cls, "from_env"):
        return cls.from_env(env, **kwargs)
    return cls(**kwargs)
