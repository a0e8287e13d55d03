"""`check_rule`: does a credit rule keep the promises of the CreditRule interface? In the spirit of Gymnasium's
`check_env`: it builds the rule, feeds it generated batches of the kinds it declares it reads, and raises one
`RuleCheckError` line naming the first broken promise.

The promises (vcbm_gym/credit/base.py):

- what it declares: `emits` / `may_emit` are kinds of credit ("advantages", "rewards") and the instance's
  `emission()` is one of them; a rule that may emit rewards has `rewards(batch)`; `batch_needs` name EpisodeBatch
  fields (`extras['key']`, `turn_flags['key']`, `a | b`); `info_needs` are env info keys of the contract;
- its credit: a (B, T) array of finite values on the trained steps and 0 on padding (mask False), on batches with
  ragged episodes (every episode its own length; an LLM batch's prompt tokens between its turns), several groups
  where it reads `group_ids`, turn-level batches unless it needs per-step observations or actions;
- the call order: scoring a batch twice without `observe` gives the same credit, and scoring changes neither the
  rule's state (a rule learns in `observe` only) nor the batch;
- its state: `state_dict()` is plain Python and numpy values, and a fresh rule that loads it has the same state and
  gives the same credit;
- its needs: every field `batch_needs` names is read (by the credit or by `observe`), and a field it does not name
  leaves its credit unchanged (each batch holds only the declared fields; filling an undeclared one must not matter).

Batches are drawn from a seeded generator; observations and actions from the spaces of `env` (default: a probe with
three 3-valued state components and two actions, which the tabular rules accept). An `extras` entry this module
cannot generate (a rule's own) comes from `make_extras={'key': fn(batch, rng)}`.
"""

from __future__ import annotations

import copy
import inspect
import re
import zlib
from collections.abc import Callable, Mapping
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from vcbm_gym.credit.base import EMISSIONS, REWARDS, CreditRule, EpisodeBatch
from vcbm_gym.credit.registry import build_rule

PROBE_OBSERVATION_SPACE = spaces.MultiDiscrete([3, 3, 3])
PROBE_ACTION_SPACE = spaces.Discrete(2)
BATCH_SIZE, STEPS = 6, 7  # episode batches: 6 episodes of 1 to 7 steps
TURNS = 3  # turn-level batches: 1 to 3 turns of 1 to 3 tokens, each after 1 or 2 prompt tokens
N_BATCHES = 4
GROUPS = np.array([0, 0, 1, 1, 2, 2])  # several groups, for a rule that reads group_ids
# the fields a batch may lack, and the entries that name keys of its dicts
OPTIONAL_FIELDS = ("group_ids", "observations", "actions", "turn_texts", "final_texts")
PER_STEP = ("observations", "actions", "extras['next_observations']")  # what a turn-level (LLM) batch cannot have
NEED = re.compile(r"^(?:(group_ids|step_turn|observations|actions|turn_texts|final_texts)|(extras|turn_flags)\['([^']+)'\])$")


class RuleCheckError(Exception):
    """A credit rule broke a promise of the CreditRule interface (one line: which, and where)."""


class _ProbeEnv(gym.Env):
    """Spaces only, for a rule built by `from_env` (its featurizer, its space checks); never reset or stepped."""

    def __init__(self, observation_space: spaces.Space, action_space: spaces.Space) -> None:
        self.observation_space, self.action_space = observation_space, action_space


class _ReadingDict(dict):
    """A dict of a batch (extras, turn_flags) that notes which keys a rule asked for, present or not."""

    def __init__(self, data: Mapping[str, Any], prefix: str, reads: set[str]) -> None:
        super().__init__(data)
        self._prefix, self._reads = prefix, reads

    def _note(self, key: Any) -> None:
        self._reads.add(f"{self._prefix}[{key!r}]")

    def __getitem__(self, key: Any) -> Any:
        self._note(key)
        return super().__getitem__(key)

    def get(self, key: Any, default: Any = None) -> Any:
        self._note(key)
        return super().get(key, default)

    def __contains__(self, key: Any) -> bool:
        self._note(key)
        return super().__contains__(key)

    def _note_all(self) -> None:
        for key in super().keys():
            self._note(key)

    def __iter__(self):
        self._note_all()
        return super().__iter__()

    def items(self):
        self._note_all()
        return super().items()

    def values(self):
        self._note_all()
        return super().values()


class _ReadingBatch(EpisodeBatch):
    """An EpisodeBatch that notes which of its optional fields a rule reads."""

    def __getattribute__(self, name: str) -> Any:
        if name in OPTIONAL_FIELDS or name == "step_turn":
            reads = object.__getattribute__(self, "__dict__").get("_reads")
            if reads is not None:
                reads.add(name)
        return object.__getattribute__(self, name)


def _alternatives(need: str) -> list[str]:
    return [alt.strip() for alt in need.split("|")]


def _episode_turns(batch_mask: np.ndarray, step_turn: np.ndarray, b: int) -> int:
    on = batch_mask[b] & (step_turn[b] >= 0)
    return int(step_turn[b][on].max()) + 1 if on.any() else 0


class _Generator:
    """Seeded batches of one kind ("episodes": per-step, as the tabular and SB3 arms give; "turns": tokens in turns,
    as the LLM arm gives), holding rewards, mask, step_turn and the fields asked for."""

    def __init__(self, rule: CreditRule, env: gym.Env, make_extras: Mapping[str, Callable], seed: int) -> None:
        self.rule, self.env, self.make_extras, self.seed = rule, env, make_extras, seed

    def structure(self, kind: str, index: int) -> dict[str, Any]:
        rng = np.random.default_rng([self.seed, index, kind == "turns"])
        if kind == "episodes":
            lengths = rng.integers(1, STEPS + 1, BATCH_SIZE)
            lengths[0], lengths[1] = STEPS, 1  # ragged: a full row and a one-step episode
            mask = np.arange(STEPS)[None, :] < lengths[:, None]
            rewards = np.where(mask, rng.normal(size=mask.shape).round(2), 0.0)
            return {"rewards": rewards, "mask": mask, "step_turn": None}
        width = TURNS * 5 + 1
        mask = np.zeros((BATCH_SIZE, width), bool)
        step_turn = np.full((BATCH_SIZE, width), -1)
        rewards = np.zeros((BATCH_SIZE, width))
        for b in range(BATCH_SIZE):
            t = 0
            for turn in range(TURNS if b == 0 else int(rng.integers(1, TURNS + 1))):
                t += int(rng.integers(1, 3))  # the prompt or observation tokens before the response
                n = int(rng.integers(1, 4))
                mask[b, t : t + n], step_turn[b, t : t + n] = True, turn
                t += n
            rewards[b, np.flatnonzero(mask[b])[-1]] = round(float(rng.normal()), 2)  # the return on the last token
        return {"rewards": rewards, "mask": mask, "step_turn": step_turn}

    def batch(self, kind: str, index: int, fields: set[str], reads: set[str] | None = None) -> EpisodeBatch:
        """Batch `index` of `kind` holding `fields` (need entries: "observations", "extras['key']", ...)."""
        base = self.structure(kind, index)
        probe = EpisodeBatch(base["rewards"], base["mask"], step_turn=base["step_turn"])
        mask, step_turn = probe.mask, probe.step_turn
        n_turns = [_episode_turns(mask, step_turn, b) for b in range(BATCH_SIZE)]
        shape = mask.shape
        values: dict[str, Any] = {}
        extras: dict[str, Any] = {}
        flags: dict[str, Any] = {}
        for field in sorted(fields):
            # each field from its own stream: a batch with one more field holds the same values in the others
            rng = np.random.default_rng([self.seed, index, kind == "turns", zlib.crc32(field.encode())])
            match = NEED.match(field)
            if match is None:
                raise RuleCheckError(f"cannot generate batch field {field!r}: expected an EpisodeBatch field")
            name, table, key = match.groups()
            if name == "group_ids":
                values[name] = GROUPS.copy()
            elif name in ("observations", "actions"):
                values[name] = self.sample(
                    self.env.observation_space if name == "observations" else self.env.action_space, shape, rng
                )
            elif name == "turn_texts":
                values[name] = [[str(rng.choice(["ok", "error: no such file", "done", "3"])) for _ in range(n)] for n in n_turns]
            elif name == "final_texts":
                values[name] = [str(rng.choice(["the watch ticks", "the watch stopped", "solved"])) for _ in n_turns]
            elif table == "turn_flags":
                flags[key] = [rng.random(n) < 0.5 for n in n_turns]
            elif name is None:
                extras[key] = self.extra(key, probe, n_turns, rng)
        if reads is None:
            return EpisodeBatch(
                base["rewards"], base["mask"], step_turn=base["step_turn"], turn_flags=flags, extras=extras, **values
            )
        batch = _ReadingBatch(
            base["rewards"],
            base["mask"],
            step_turn=base["step_turn"],
            turn_flags=_ReadingDict(flags, "turn_flags", reads),
            extras=_ReadingDict(extras, "extras", reads),
            **values,
        )
        object.__setattr__(batch, "_reads", reads)
        return batch

    def sample(self, space: spaces.Space, shape: tuple[int, int], rng: np.random.Generator) -> np.ndarray:
        space = copy.deepcopy(space)
        space.seed(int(rng.integers(2**31)))
        return np.stack([np.asarray(space.sample()) for _ in range(shape[0] * shape[1])]).reshape(*shape, *space.shape)

    def extra(self, key: str, batch: EpisodeBatch, n_turns: list[int], rng: np.random.Generator) -> Any:
        from vcbm_gym.credit.branch import BranchRule

        if key in self.make_extras:
            return self.make_extras[key](batch, rng)
        if key == "baseline":
            return rng.normal(size=batch.batch_size).round(2)
        if key == "advantages":
            return np.where(batch.mask, rng.normal(size=batch.mask.shape), 0.0)
        if key == "next_observations":
            return self.sample(self.env.observation_space, batch.mask.shape, rng)
        if key == "anchor_keys":
            return [[str(rng.choice(["a", "b"])) for _ in range(n)] for n in n_turns]
        if key == "coalition_values":
            return [rng.normal(size=2**n).round(2) for n in n_turns]
        if key == "branches":
            out = []
            for n in n_turns:
                entropies, executable = rng.random(n), rng.random(n) < 0.7
                executable[0] = True
                points = (
                    self.rule.branch_points(n, entropies, executable)
                    if isinstance(self.rule, BranchRule)
                    else [(t, 3) for t in range(n)]
                )
                out.append({t: (rng.normal(size=k).round(2), rng.random(k) < 0.5) for t, k in points})
            return out
        raise RuleCheckError(
            f"cannot generate extras[{key!r}], which the rule declares it reads: pass check_rule(..., "
            f"make_extras={{{key!r}: fn(batch, rng)}}) returning what the arm puts there"
        )


def _same(a: Any, b: Any) -> bool:
    """Equal plain values (nested dicts, lists, numpy arrays; NaN equals NaN)."""
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return set(a) == set(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, (np.ndarray, np.generic)) or isinstance(b, (np.ndarray, np.generic)):
        a, b = np.asarray(a), np.asarray(b)
        if a.shape != b.shape:
            return False
        try:
            return bool(np.array_equal(a, b, equal_nan=True))
        except TypeError:
            return bool(np.array_equal(a, b))
    if isinstance(a, float) and isinstance(b, float):
        return a == b or (a != a and b != b)
    return type(a) is type(b) and a == b


def _plain_path(value: Any, location: str = "state") -> str | None:
    """Where `value` holds something that is not plain Python or numpy (a tensor, a module, a function), else None."""
    if isinstance(value, Mapping):
        for k, v in value.items():
            if (where := _plain_path(v, f"{location}[{k!r}]")) is not None:
                return where
        return None
    if isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            if (where := _plain_path(v, f"{location}[{i}]")) is not None:
                return where
        return None
    if value is None or isinstance(value, (str, bytes, bool, int, float, np.ndarray, np.generic)):
        if isinstance(value, np.ndarray) and value.dtype == object:
            return location
        return None
    return f"{location} ({type(value).__name__})"


class _Checker:
    def __init__(self, cls: type[CreditRule], env: gym.Env | None, kwargs: dict[str, Any], make_extras: Mapping, seed: int):
        self.cls, self.kwargs, self.seed = cls, kwargs, seed
        self.env = env if env is not None else _ProbeEnv(PROBE_OBSERVATION_SPACE, PROBE_ACTION_SPACE)
        self.make_extras = dict(make_extras or {})
        self.named: set[str] = set()  # every alternative the rule's needs name
        self.label = f"credit rule {getattr(cls, 'name', cls.__name__)!r} ({cls.__module__}.{cls.__qualname__})"

    def fail(self, why: str) -> RuleCheckError:
        return RuleCheckError(" ".join(f"{self.label}: {why}".split()))  # one line, whatever an exception's text holds

    def build(self) -> CreditRule:
        try:
            return build_rule(self.cls, env=self.env, **self.kwargs)
        except Exception as exc:  # noqa: BLE001 - any failure to build is the finding
            raise self.fail(f"cannot be built with {self.kwargs!r}: {type(exc).__name__}: {exc}") from None

    def declarations(self) -> None:
        cls = self.cls
        if not isinstance(getattr(cls, "name", None), str) or not cls.name:
            raise self.fail("declares no `name` (a class attribute: the name the tools report it under)")
        if cls.emits not in EMISSIONS:
            raise self.fail(f"emits = {cls.emits!r}: expected one of {', '.join(EMISSIONS)}")
        if not set(cls.may_emit) <= set(EMISSIONS) or (cls.may_emit and cls.emits not in cls.may_emit):
            raise self.fail(
                f"may_emit = {cls.may_emit!r} with emits = {cls.emits!r}: expected kinds among "
                f"{', '.join(EMISSIONS)} that include `emits`"
            )
        if REWARDS in cls.kinds() and not _implements(cls, "rewards"):
            raise self.fail(f"may emit {REWARDS} ({cls.kinds()}) but has no rewards(batch): expected a RewardRule")
        from vcbm_gym.contract import INFO_KEYS

        unknown = [key for key in cls.info_needs if key not in INFO_KEYS]
        if unknown:
            raise self.fail(f"info_needs names {unknown}, which no env reports: expected keys of vcbm_gym.contract.INFO_KEYS")
        if cls.info_needs and not cls.batch_needs:
            raise self.fail(
                f"info_needs = {cls.info_needs!r} but batch_needs is empty: an info key reaches a rule only "
                "through the batch field a runner fills from it, which batch_needs must name"
            )

    def instance(self, rule: CreditRule) -> tuple[str, tuple[str, ...]]:
        emission, needs = rule.emission(), tuple(rule.needs())
        self.named = {alt for need in needs for alt in _alternatives(need)}
        if emission not in self.cls.kinds():
            raise self.fail(f"emission() is {emission!r}, which its class does not declare: expected one of {self.cls.kinds()}")
        for need in needs:
            for alt in _alternatives(need):
                if not NEED.match(alt):
                    raise self.fail(
                        f"batch_needs entry {need!r}: expected EpisodeBatch field names ({', '.join(OPTIONAL_FIELDS)}), "
                        "\"extras['key']\" or \"turn_flags['key']\", alternatives joined by ' | '"
                    )
        return emission, needs

    def credit(self, rule: CreditRule, emission: str, batch: EpisodeBatch, where: str) -> np.ndarray:
        before = (batch.rewards.copy(), batch.mask.copy())
        try:
            credit = rule.rewards(batch) if emission == REWARDS else rule.advantages(batch)
        except RuleCheckError:
            raise
        except Exception as exc:  # noqa: BLE001 - any failure on a well-formed batch is the finding
            reads = object.__getattribute__(batch, "__dict__").get("_reads") or set()
            undeclared = sorted(field for field in reads & set(OPTIONAL_FIELDS) if field not in self.named)
            hint = f" (it read {', '.join(undeclared)}, which its needs do not name)" if undeclared else ""
            raise self.fail(f"{emission} raised {type(exc).__name__}: {exc} {where}{hint}") from None
        b, t = batch.mask.shape
        if not isinstance(credit, np.ndarray) or credit.shape != (b, t):
            got = getattr(credit, "shape", type(credit).__name__)
            raise self.fail(
                f"{emission} returned {got} for a batch of {b} episodes of {t} steps: expected a (B, T) = ({b}, {t}) array"
            )
        if not np.issubdtype(credit.dtype, np.number) or np.issubdtype(credit.dtype, np.complexfloating):
            raise self.fail(f"{emission} returned an array of dtype {credit.dtype}: expected real numbers")
        bad = batch.mask & ~np.isfinite(credit)
        if bad.any():
            e, s = (int(i) for i in np.argwhere(bad)[0])
            raise self.fail(f"{emission} gave {credit[e, s]} at step {s} of episode {e} {where}: expected finite values")
        padded = ~batch.mask & (credit != 0)
        if padded.any():
            e, s = (int(i) for i in np.argwhere(padded)[0])
            raise self.fail(
                f"{emission} gave {credit[e, s]} at step {s} of episode {e}, a padding step (mask False), {where}: "
                "expected 0 on every unmasked step"
            )
        if not (np.array_equal(before[0], batch.rewards) and np.array_equal(before[1], batch.mask)):
            raise self.fail(f"{emission} changed the batch's rewards or mask {where}: expected the batch left as given")
        return credit

    def state(self, rule: CreditRule, when: str) -> dict[str, Any]:
        try:
            state = rule.state_dict()
        except Exception as exc:  # noqa: BLE001
            raise self.fail(f"state_dict() raised {type(exc).__name__}: {exc} {when}") from None
        if not isinstance(state, Mapping):
            raise self.fail(f"state_dict() returned {type(state).__name__} {when}: expected a dict")
        where = _plain_path(state)
        if where is not None:
            raise self.fail(f"state_dict() holds {where} {when}: expected plain Python and numpy values")
        return copy.deepcopy(dict(state))

    def kinds(self, needs: tuple[str, ...]) -> list[str]:
        """Episode batches always; turn-level (LLM) batches unless a need has only per-step alternatives."""
        turns = all(any(alt not in PER_STEP for alt in _alternatives(need)) for need in needs)
        return ["episodes", "turns"] if turns else ["episodes"]

    def fields(self, needs: tuple[str, ...], kind: str) -> set[str]:
        """The fields that fill `needs` in a batch of `kind`: each need's first alternative that the kind can have."""
        out = set()
        for need in needs:
            alts = _alternatives(need)
            usable = [alt for alt in alts if kind == "episodes" or alt not in PER_STEP]
            out.add((usable or alts)[0])
        return out

    def run(self) -> None:
        self.declarations()
        rule = self.build()
        emission, needs = self.instance(rule)
        reads: set[str] = set()
        for kind in self.kinds(needs):
            self.sequence(kind, emission, needs, reads)
        self.needs_read(needs, reads)
        for kind in self.kinds(needs):
            self.undeclared(kind, emission, needs)

    def sequence(self, kind: str, emission: str, needs: tuple[str, ...], reads: set[str]) -> None:
        rule = self.build()
        gen = _Generator(rule, self.env, self.make_extras, self.seed)
        fields = self.fields(needs, kind)
        batches = [gen.batch(kind, i, fields, reads) for i in range(N_BATCHES)]
        for i, batch in enumerate(batches):
            where = f"on {kind} batch {i} (after observing {i})"
            state = self.state(rule, f"before batch {i}")
            credit = self.credit(rule, emission, batch, where)
            again = self.credit(rule, emission, batch, where)
            if not _same(credit, again):
                differs = (credit != again) & ~(np.isnan(credit) & np.isnan(again))
                e, s = (int(x) for x in np.argwhere(differs)[0])
                raise self.fail(
                    f"{emission} of the same batch changed from {credit[e, s]} to {again[e, s]} (step {s} of episode {e}) "
                    f"when scored twice without observe {where}: expected a rule to learn in observe only"
                )
            if not _same(state, self.state(rule, f"after scoring batch {i}")):
                raise self.fail(f"scoring {kind} batch {i} changed state_dict(): expected a rule to learn in observe only")
            try:
                rule.observe(batch)
            except Exception as exc:  # noqa: BLE001
                raise self.fail(f"observe raised {type(exc).__name__}: {exc} on {kind} batch {i}") from None
            self.round_trip(rule, emission, batches[(i + 1) % len(batches)], f"after observing {kind} batch {i}")

    def round_trip(self, rule: CreditRule, emission: str, probe: EpisodeBatch, when: str) -> None:
        state = self.state(rule, when)
        clone = self.build()
        try:
            clone.load_state_dict(copy.deepcopy(state))
        except Exception as exc:  # noqa: BLE001
            raise self.fail(f"load_state_dict(state_dict()) raised {type(exc).__name__}: {exc} {when}") from None
        if not _same(state, self.state(clone, f"after load_state_dict {when}")):
            raise self.fail(
                f"a fresh rule's state_dict() after load_state_dict(state_dict()) {when} differs: expected the same state"
            )
        mine = self.credit(rule, emission, probe, f"on the next batch {when}")
        theirs = self.credit(clone, emission, probe, f"on the next batch, by a fresh rule loaded {when}")
        if not _same(mine, theirs):
            raise self.fail(
                f"a fresh rule that loaded state_dict() {when} gives other credit than the rule itself: "
                "expected state_dict to hold everything its credit depends on"
            )

    def needs_read(self, needs: tuple[str, ...], reads: set[str]) -> None:
        for need in needs:
            if not any(alt in reads for alt in _alternatives(need)):
                raise self.fail(
                    f"declares {need!r} in its needs (batch_needs / needs()) but never read it in {N_BATCHES} batches "
                    "(scored and observed): expected needs to name only what the rule reads (an arm refuses a rule "
                    "whose needs it cannot fill)"
                )

    def undeclared(self, kind: str, emission: str, needs: tuple[str, ...]) -> None:
        """Each optional field the rule does not name, filled in: its credit must not change."""
        named = {alt for need in needs for alt in _alternatives(need)}
        fields = self.fields(needs, kind)
        for extra in (f for f in OPTIONAL_FIELDS if f not in named):
            plain, filled = self.build(), self.build()
            gen = _Generator(plain, self.env, self.make_extras, self.seed)
            for i in range(N_BATCHES):
                reads: set[str] = set()
                without = gen.batch(kind, i, fields)
                with_it = gen.batch(kind, i, fields | {extra}, reads)
                where = f"on {kind} batch {i}, which holds {extra} although the rule's needs do not name it"
                changed = not _same(
                    self.credit(plain, emission, without, f"on {kind} batch {i}"), self.credit(filled, emission, with_it, where)
                )
                if changed:
                    raise self.fail(
                        f"its credit on {kind} batch {i} changes when the batch holds {extra}, which its needs "
                        f"({', '.join(needs) or 'none'}) do not name: expected batch_needs to name every field it reads"
                    )
                plain.observe(without)
                filled.observe(with_it)


def _implements(cls: type, method: str) -> bool:
    fn = getattr(cls, method, None)
    return callable(fn) and not getattr(fn, "__isabstractmethod__", False)


def check_rule(
    rule_class: type[CreditRule],
    *,
    env: gym.Env | None = None,
    make_extras: Mapping[str, Callable[[EpisodeBatch, np.random.Generator], Any]] | None = None,
    batch_seed: int = 0,
    **kwargs: Any,
) -> None:
    """Check that `rule_class`, built with `kwargs` (by `from_env(env, **kwargs)` when it has one), keeps the
    promises of the CreditRule interface (module docstring); one RuleCheckError line names the first it breaks.

    `env`: the env whose spaces the batches' observations and actions come from (default: a probe with three
    3-valued state components and two actions). `make_extras`: generators of the `extras` entries the rule reads
    that this module does not know (`fn(batch, rng)`, batch holding rewards, mask and step_turn). `batch_seed`: the
    generator's seed (the rule's own `seed`, if it takes one, is among `kwargs`).
    """
    if not (inspect.isclass(rule_class) and issubclass(rule_class, CreditRule)):
        raise RuleCheckError(f"check_rule({rule_class!r}): expected a subclass of vcbm_gym.credit.base.CreditRule")
    _Checker(rule_class, env, kwargs, make_extras or {}, batch_seed).run()
