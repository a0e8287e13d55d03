"""TextWatchWorkshop: a watch passes through a workshop of service stations, one per turn.

A multi-bookmark variant of TextWatchRepair for the LLM arm, where credit has to be *found*:
every turn is a state-mutating tool call (a VCBM bookmark), but only one of them decides the
return. The episode has `n_stations` turns (default 8, more than the paper's top-k = 6):

- the **movement** station (at a position drawn per episode) offers `repair()` or `skip()`. Its
  call decides the return exactly as in TextWatchRepair: repairing runs the watch-repair
  dynamics of WatchRepair-v0 (repair cost, 50 steps of transport, bumps and drops), skipping
  returns the watch unrepaired (return 0). Repairing pays for brands 1 and 2 and loses for 0 and 3;
- every other station is cosmetic (case, strap, crystal, ...): each offers `standard()` or
  `premium()`, both change the watch (each in the station's own way), and neither changes the
  return.

So a return that arrives at the end reflects one turn in eight. Leave-one-out credit spreads it
evenly over every turn; VCBM-blended LOOP ranks the turns' execution outputs by their similarity
to the final observation, which reports the movement's outcome in the movement station's words.

Parsing: the last tool name in the answer that belongs to the current station wins (as in
TextWatchRepair); an answer naming none of them leaves the station untouched (not
state-mutating) and, at the movement station, leaves the watch unrepaired and the task failed:
the return is then `undecided_return` (default -2.0, below every decision's expected return, as
in TextWatchRepair), so a missed movement decision is never as good as skipping.

The terminal reward is the watch-repair return times `reward_scale` (0.1), with its deviation
from E[G | brand, decision] scaled by `noise_scale` (1.0: the paper's noise; 0: noiseless). As in
TextWatchRepair, `reset(seed=s)` fixes the task (brand, stations, the movement's position) and the outcome,
and `options={"outcome_seed": o}` draws the outcome from `o` instead. The outcome is drawn when the service
ends, so `restore(state, outcome_seed=o)` (envs/snapshot.py) at any turn draws all of it from `o`.

The turn's finite alternatives (vcbm_gym/contract.py): `turn_alternatives()` lists the current station's tool
calls, e.g. ("repair()", "skip()"), each a distinct decision of the parse above (any other answer is invalid);
`optimal_alternative()` is the movement call the brand's expected return favours at the movement station and None
at a cosmetic one, where no call changes the return (evaluation only: the replay reference's scripted policy).

`info` per step: `state_mutating`, `execution_output` (the bookmark key), `effect` (the tool, or
"invalid"), `is_decision_turn` (this turn was the movement station), `station`, and on the last
step `first_decision_optimal` and `task_goal_completion` (the movement decision was optimal; a
missed decision counts as a failure). The last three are for evaluation only.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from envs.text_watch_repair import BRAND_NAMES, WatchTextEnv, _printable
from envs.watch_repair import KEEP, REPAIR

MOVEMENT = "movement"
MOVEMENT_TOOLS = ("repair", "skip")
# Every cosmetic station offers the same two calls, a standard and a premium finish; what each
# does (its execution output, the bookmark key) depends on the station.
COSMETIC_TOOLS = ("standard", "premium")
COSMETIC_STATIONS: dict[str, tuple[str, str]] = {
    "case": ("the case is cleaned", "the case is polished to a mirror finish"),
    "strap": ("a leather strap is fitted", "a steel bracelet is fitted"),
    "crystal": ("a mineral crystal is fitted", "a sapphire crystal is fitted"),
    "dial": ("the dial is cleaned", "the dial markers are relumed"),
    "crown": ("the crown gasket is resealed", "a new crown is fitted"),
    "engraving": ("the caseback stays blank", "the caseback carries the initials"),
    "box": ("the watch sits in a soft pouch", "the watch sits in a gift box"),
    "papers": ("the service card is stamped", "the service card is signed and sealed"),
    "hands": ("the hands are aligned", "the hands are polished and blued"),
}
TOOL_NAMES = MOVEMENT_TOOLS + COSMETIC_TOOLS
_TOOL_PATTERN = re.compile(r"\b(" + "|".join(TOOL_NAMES) + r")\b", re.IGNORECASE)


def parse_station_action(text: str, tools: tuple[str, ...]) -> str:
    """The last of `tools` named in the answer, or "invalid"."""
    found = [t.casefold() for t in _TOOL_PATTERN.findall(text or "") if t.casefold() in tools]
    return found[-1] if found else "invalid"


class TextWatchWorkshopEnv(WatchTextEnv):
    """Service stations as text turns; only the movement station's decision sets the return."""

    snapshot_fields = ("_state", "_stations", "_turn", "_decision", "_last_obs", "_outcome_rng")

    def __init__(
        self,
        n_stations: int = 8,
        reward_scale: float = 0.1,
        noise_scale: float = 1.0,
        undecided_return: float = -2.0,
        render_mode: str | None = None,
        **params: Any,
    ):
        if not isinstance(n_stations, (int, np.integer)) or not 2 <= n_stations <= len(COSMETIC_STATIONS) + 1:
            raise ValueError(f"n_stations={n_stations!r}: expected an integer in [2, {len(COSMETIC_STATIONS) + 1}]")
        super().__init__(reward_scale, noise_scale, render_mode, params, undecided_return)
        self.n_stations = self.max_turns = int(n_stations)  # one station per turn
        self._stations: list[str] = []
        self._turn = self.n_stations
        self._decision: str | None = None
        self._last_obs = ""

    # --- Gymnasium API -------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self._state = self.dynamics.reset(self.np_random, 1, (options or {}).get("brand"))
        cosmetic = list(self.np_random.permutation(sorted(COSMETIC_STATIONS))[: self.n_stations - 1])
        cosmetic.insert(int(self.np_random.integers(self.n_stations)), MOVEMENT)
        self._stations = [str(s) for s in cosmetic]
        self.reset_outcome(options)
        self._turn, self._decision = 0, None
        self._last_obs = (
            f"A customer brings in a watch made by {BRAND_NAMES[self._brand]} for a full service: {self.n_stations} "
            "stations, one per turn. At each station call one of its two tools.\n" + self._station_prompt()
        )
        return self._last_obs, self._info(False, "", "none", False, self._stations[0])

    def step(self, action):
        if not self._stations or self._turn >= self.n_stations:
            raise RuntimeError("step() called before reset() or after the episode ended")
        text = action if isinstance(action, str) else str(action)
        station, tools = self._stations[self._turn], self._tools()
        effect = parse_station_action(text, tools)
        if effect == "invalid":
            output = f"invalid action {_printable(text)!r} at the {station}: expected {tools[0]}() or {tools[1]}()."
        elif station == MOVEMENT:
            self._decision = effect
            output = (
                f"repair() done: the {BRAND_NAMES[self._brand]} movement is repaired; the watch ships to its buyer."
                if effect == "repair"
                else f"skip() done: the {BRAND_NAMES[self._brand]} movement stays unrepaired."
            )
        else:
            output = f"{effect}() done: {COSMETIC_STATIONS[station][COSMETIC_TOOLS.index(effect)]}."
        is_decision = station == MOVEMENT
        self._turn += 1
        terminated = self._turn >= self.n_stations
        reward = 0.0
        if terminated:
            reward = self._movement_return() * self.reward_scale
            self._last_obs = f"{output} The service is over. Final result: {self._outcome(reward)}"
        else:
            self._last_obs = f"{output}\n{self._station_prompt()}"
        # the bookmark key is the call's own output, never the final result that follows it
        info = self._info(effect != "invalid", output, effect, is_decision, station)
        if terminated:
            optimal = self._decision is not None and (
                (REPAIR if self._decision == "repair" else KEEP) == int(self._optimal[self._brand])
            )
            info["first_decision_optimal"] = bool(optimal)
            info["task_goal_completion"] = float(optimal)
        return self._last_obs, float(reward), terminated, False, info

    def render(self):
        return self._last_obs if self.render_mode == "ansi" else None

    def turn_alternatives(self) -> tuple[str, ...]:
        """The current station's tool calls: the turn's finite alternatives (module docstring)."""
        return tuple(f"{tool}()" for tool in self._tools())

    def optimal_alternative(self) -> str | None:
        """At the movement station the call of the brand's optimal decision, else None (module docstring)."""
        self._tools()  # one line before reset or after the end
        if self._stations[self._turn] != MOVEMENT:
            return None
        return "repair()" if int(self._optimal[self._brand]) == REPAIR else "skip()"

    def redraw_outcome(self, rng: np.random.Generator) -> None:
        self._outcome_rng = rng  # nothing of the outcome is drawn before the last turn

    # --- internals -----------------------------------------------------------------------------
    def _tools(self) -> tuple[str, ...]:
        if not self._stations or self._turn >= self.n_stations:
            raise RuntimeError("the turn's tools asked for before reset() or after the episode ended")
        return MOVEMENT_TOOLS if self._stations[self._turn] == MOVEMENT else COSMETIC_TOOLS

    @property
    def _brand(self) -> int:
        return int(self._state[0, 3])

    def _station_prompt(self) -> str:
        station = self._stations[self._turn]
        if station == MOVEMENT:
            return (
                f"Station {self._turn + 1} of {self.n_stations}: the movement has stopped (repair: the movement is "
                "repaired and the watch ships to its buyer; skip: the movement stays unrepaired). Tools for the "
                f"{BRAND_NAMES[self._brand]} movement: repair() or skip()."
            )
        standard, premium = COSMETIC_STATIONS[station]
        return (
            f"Station {self._turn + 1} of {self.n_stations}: the {station} (standard: {standard}; premium: {premium}). "
            "Tools: standard() or premium()."
        )

    def _movement_return(self) -> float:
        """The watch-repair return of the movement decision (0 if skipped), noise scaled."""
        if self._decision is None:
            return self.undecided_return
        if self._decision != "repair":
            return 0.0
        brand, first = self._state[:, 3], np.array([REPAIR])
        _, rewards = self.dynamics.rollout(brand, first, self.dynamics.draw([self._outcome_rng], brand, first))
        total = float(rewards.sum())
        return self.scaled_return(total, True, self._brand)

    def _outcome(self, reward: float) -> str:
        brand = BRAND_NAMES[self._brand]
        if self._decision == "repair":
            return f"the {brand} movement was repaired and the watch shipped; the repair earned {reward:+.3f}."
        if self._decision == "skip":
            return f"the {brand} movement stayed unrepaired; nothing earned or lost (+0.000)."
        return f"the {brand} movement was never handled; the owner's storage fee cost {reward:+.3f}."

    def _info(self, mutating: bool, output: str, effect: str, is_decision: bool, station: str) -> dict[str, Any]:
        return {
            "state_mutating": mutating,
            "execution_output": output,
            "effect": effect,
            "is_decision_turn": is_decision,
            "station": station,
            "brand": self._brand,
            "optimal_first_action": int(self._optimal[self._brand]),
        }
