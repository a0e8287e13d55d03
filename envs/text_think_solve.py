"""TextThinkSolve: two roles, a Thinker who sees the watch's records and a Solver who decides, in text.

The two-agent setting of CCPO and SEPO (Z. Li et al., arXiv 2603.21563: Counterfactual Credit for Policy
Optimization and Self-Evaluated Credit for Policy Optimization; docs/papers/ccpo.md), on TextWatchRepair's
theme. A customer's watch has stopped:

- **Thinker** (turn 1). Its observation holds the watch's private service record: the brand (one of
  four) and its history (one of four). It answers with a short note, any text; the note is cut to
  `max_note_chars` characters (a cut ends in "...") and characters outside the observation space's
  printable set become "?".
- **Solver** (turn 2). Its observation holds the problem and the Thinker's note, never the record. It
  answers `repair()` or `skip()`; the last of the two names in its text wins (as in TextWatchRepair),
  and text naming neither is an invalid answer, which the verifier scores as wrong.

Whether a repair pays depends on the brand and the history together: each brand's movement survives
two of the four histories (`REPAIRABLE`), and the table is balanced so that over the uniform draw of
brand and history, and given either one alone, repair is right exactly half the time. The Solver's
observation is the same text for all 16 records once the note is fixed, so without the Thinker's
information no Solver does better than chance (1/2), and a Thinker must pass on both the brand and the
history, or the decision itself. The table is not shown to either role: it is what the team learns.

`rule="brand"` (the default is `rule="record"`, the above) makes the brand alone decide, as in
TextWatchRepair: a repair pays for Borealis and Corvina (`BRAND_REPAIRABLE`), whatever the history. The
Solver still sees no record, so it still cannot beat chance alone, but the Thinker's part is a function
of one field, not of two: the setting the warm-started tiny model of the LLM arm can learn within a
CPU budget (benchmarks/ccpo_learning.py), where the record's table needs far more.

The verifier pays the team one shared reward on the Solver's turn: +1 for the right decision, -1 for a
wrong or invalid one (0 on the Thinker's turn). `noise` (default 0) is the probability that the
verifier's reward is flipped (drawn once per episode, whatever the answer); it must lie in [0, 0.5): at
0.5 the reward would say nothing about the answer. The mean reward of a team that is right with
probability q is (2q - 1)(1 - 2 noise).

**Solo mode** (the counterfactual of CCPO: the Solver on the problem only): the episode is one Solver
turn whose observation carries no note. `solo=True` in the constructor makes it every episode's mode;
`reset(options={"solo": True})` (or False) sets it for one episode, so a trainer plays the joint and the
solo episode of one task from one env with one reset seed.

Whose turn: every observation starts with "Role: Thinker." or "Role: Solver.", and `info["next_role"]`
(on reset and every step) names the role the returned observation addresses ("thinker", "solver", or
None once the episode has ended); `info["role"]` on a step names the role whose action it took.

`reset(seed=s)` fixes the whole episode: the record and the verifier's flip. Options: "brand" and
"history" (indices in [0, 4)) fix the record, "solo" the mode, and "outcome_seed" draws the flip from a
seed of its own (the record stays the one `s` draws), so K rollouts of one task meet independent noise,
as in the watch text envs.

`info` per step: `state_mutating` (the Thinker's turn when its note is not blank: the note is the
Solver's input; the Solver's turn when it names a decision), `execution_output` (the text the action
produced), `effect` (the Thinker's note, case- and space-normalised, as "note:<text>", None when blank;
the Solver's "repair", "skip" or "invalid"), `is_decision_turn` (the Solver's turn), `role`,
`next_role`, `solo`, and on the last step `first_decision_optimal` and `task_goal_completion` (the
Solver's decision was right, whatever the verifier's noise) and `verifier_flipped`. `brand`, `history`
and `optimal_decision` are on every info. All but `state_mutating`, `execution_output` and `effect`
are for evaluation only; no agent may learn from them.
"""

from __future__ import annotations

import math
import string
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from envs.text_watch_repair import BRAND_NAMES, MAX_TEXT, _printable, outcome_generator
from envs.text_watch_workshop import parse_station_action

THINKER, SOLVER = "thinker", "solver"
DECISIONS = ("repair", "skip")
HISTORIES = ("dropped on a stone floor", "caught in the rain", "overwound", "never serviced")
# brand -> the histories its movement survives: a repair pays there and loses elsewhere. Each brand
# survives two histories and each history is survived by two brands, so neither alone tells the decision.
REPAIRABLE: dict[int, frozenset[int]] = {0: frozenset({0, 2}), 1: frozenset({1, 3}), 2: frozenset({0, 2}), 3: frozenset({1, 3})}
BRAND_REPAIRABLE = frozenset({1, 2})  # rule="brand": repair pays for these brands (TextWatchRepair's), any history
DECISION_RULES = ("record", "brand")
MAX_NOTE_CHARS = 2048  # keeps the Solver's observation (prompt + note) inside the Text space's MAX_TEXT
NOISE_LIMIT = 0.5


def optimal_decision(brand: int, history: int, rule: str = "record") -> str:
    """The right decision for a record: repair when the brand's movement survives the history (rule "record"),
    or when the brand is one whose repair pays (rule "brand")."""
    if rule == "brand":
        return "repair" if brand in BRAND_REPAIRABLE else "skip"
    return "repair" if history in REPAIRABLE[brand] else "skip"


def _index_option(name: str, value: Any, size: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 0 <= value < size:
        raise ValueError(f"{name}={value!r}: expected an integer in [0, {size})")
    return int(value)


def _flag(name: str, value: Any) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name}={value!r}: expected true or false")
    return bool(value)


def _noise(value: Any) -> float:
    real = not isinstance(value, (bool, np.bool_)) and isinstance(value, (int, float, np.integer, np.floating))
    if not (real and math.isfinite(value) and 0 <= value < NOISE_LIMIT):
        raise ValueError(
            f"noise={value!r}: expected a probability in [0, {NOISE_LIMIT}) that the verifier's reward is flipped "
            f"(at {NOISE_LIMIT} the reward says nothing about the answer)"
        )
    return float(value)


class TextThinkSolveEnv(gym.Env):
    """A Thinker's note, then a Solver's decision, scored +1 / -1 by a verifier (observations and actions: text)."""

    metadata = {"render_modes": ["ansi"], "render_fps": 1, "reset_options": ("brand", "history", "solo", "outcome_seed")}

    def __init__(
        self,
        noise: float = 0.0,
        solo: bool = False,
        max_note_chars: int = 200,
        rule: str = "record",
        render_mode: str | None = None,
    ) -> None:
        self.noise = _noise(noise)
        if rule not in DECISION_RULES:
            raise ValueError(f"rule={rule!r}: expected one of {', '.join(DECISION_RULES)} (what decides whether a repair pays)")
        self.rule = rule
        self.solo = _flag("solo", solo)
        integer = not isinstance(max_note_chars, bool) and isinstance(max_note_chars, (int, np.integer))
        if not (integer and 1 <= max_note_chars <= MAX_NOTE_CHARS):
            raise ValueError(f"max_note_chars={max_note_chars!r}: expected an integer in [1, {MAX_NOTE_CHARS}]")
        self.max_note_chars = int(max_note_chars)
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode={render_mode!r}: expected one of {self.metadata['render_modes']}")
        self.render_mode = render_mode
        self.observation_space = spaces.Text(max_length=MAX_TEXT, min_length=0, charset=string.printable)
        self.action_space = spaces.Text(max_length=MAX_TEXT, min_length=0, charset=string.printable)
        self._roles: tuple[str, ...] = ()
        self._turn = 0
        self._last_obs = ""

    @property
    def next_role(self) -> str | None:
        """The role the current observation addresses; None before reset and after the episode's end."""
        return self._roles[self._turn] if self._turn < len(self._roles) else None

    # --- Gymnasium API -------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        options = options or {}
        # drawn whatever the options fix, so that fixing one never shifts the draws after it
        brand, history = (int(i) for i in self.np_random.integers(len(BRAND_NAMES), size=2))
        self._brand = _index_option("brand", options.get("brand", brand), len(BRAND_NAMES))
        self._history = _index_option("history", options.get("history", history), len(HISTORIES))
        self._solo = _flag("solo", options.get("solo", self.solo))
        self._flipped = bool(outcome_generator(self.np_random, options).random() < self.noise)
        self._roles = (SOLVER,) if self._solo else (THINKER, SOLVER)
        self._turn, self._note = 0, None
        self._last_obs = self._solver_prompt() if self._solo else self._thinker_prompt()
        return self._last_obs, self._record_info()

    def step(self, action):
        role = self.next_role
        if role is None:
            raise RuntimeError("step() called before reset() or after the episode ended")
        text = action if isinstance(action, str) else str(action)
        self._turn += 1
        if role == THINKER:
            return self._think(text)
        return self._solve(text)

    def render(self):
        return self._last_obs if self.render_mode == "ansi" else None

    # --- turns ---------------------------------------------------------------------------------
    def _think(self, text: str):
        self._note = _printable(text, self.max_note_chars)
        normalised = " ".join(self._note.casefold().split())
        output = f'The Solver receives the note: "{self._note}"'
        info = {
            **self._record_info(),
            "state_mutating": bool(normalised),
            "execution_output": output,
            "effect": f"note:{normalised}" if normalised else None,
            "is_decision_turn": False,
            "role": THINKER,
        }
        self._last_obs = self._solver_prompt()
        return self._last_obs, 0.0, False, False, info

    def _solve(self, text: str):
        decision = parse_station_action(text, DECISIONS)
        right = decision == optimal_decision(self._brand, self._history, self.rule)
        reward = (1.0 if right else -1.0) * (-1.0 if self._flipped else 1.0)
        if decision == "invalid":
            output = f"invalid answer {_printable(text)!r}: expected repair() or skip()."
        else:
            output = f"{decision}() done: the watch was {'repaired' if decision == 'repair' else 'returned unrepaired'}."
        self._last_obs = f"{output} The episode is over. The verifier scores the decision {reward:+.0f}."
        info = {
            **self._record_info(),
            "state_mutating": decision != "invalid",
            "execution_output": output,
            "effect": decision,
            "is_decision_turn": True,
            "role": SOLVER,
            "first_decision_optimal": right,
            "task_goal_completion": float(right),
            "verifier_flipped": self._flipped,
        }
        return self._last_obs, reward, True, False, info

    # --- text ----------------------------------------------------------------------------------
    def _thinker_prompt(self) -> str:
        return (
            "Role: Thinker. A customer's watch has stopped. Its private service record, which only you see: "
            f"brand {BRAND_NAMES[self._brand]}; history: {HISTORIES[self._history]}.\n"
            f"Write a short note (at most {self.max_note_chars} characters) for the Solver. The Solver sees only your "
            "note, never the record, and must answer repair() or skip(). Whether a repair pays depends on "
            f"{'the brand and the history together' if self.rule == 'record' else 'the brand'}. A verifier scores the "
            "Solver's decision +1 if right and -1 if wrong; the score is shared by you both."
        )

    def _solver_prompt(self) -> str:
        heard = "No note was left for you." if self._note is None else f'The Thinker, who has seen it, wrote: "{self._note}"'
        return (
            "Role: Solver. A customer's watch has stopped. You cannot see the watch's service record. "
            f"{heard}\nDecide: answer repair() to repair the watch or skip() to return it unrepaired. A verifier "
            "scores your decision +1 if right and -1 if wrong."
        )

    def _record_info(self) -> dict[str, Any]:
        return {
            "next_role": self.next_role,
            "solo": self._solo,
            "brand": self._brand,
            "history": self._history,
            "optimal_decision": optimal_decision(self._brand, self._history, self.rule),
        }
