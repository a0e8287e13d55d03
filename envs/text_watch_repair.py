"""TextWatchRepair: the watch-repair task (docs/papers/vcbm.md, "WatchRepair") as a multi-turn text environment.

The agent reads a text observation and answers with one tool call written as text:

- `repair()` / `skip()`: the decision. The first of them is applied to the watch-repair dynamics
  at t = 0 (repair pays the brand's repair cost; skip leaves the watch unrepaired) and is the only
  state-mutating call of the episode; later decision calls are refused ("already decided") and
  change nothing.
- `inspect()` / `wait()`: read-only. `inspect()` reports the watch's brand, list price and typical
  repair and transport costs; `wait()` lets time pass. After the decision, every turn advances the
  dynamics and reports the transport events (counter increments) of that stretch of the journey.

Parsing is lenient: the last of the four tool names in the text wins, with or without `()`,
in any case, inside any amount of other text (a ReAct "Thought: ... Action: repair()" works).
Text naming no tool is answered with an "invalid action ..." observation and changes nothing.

An episode lasts `max_turns` turns (default 6). The underlying 50-step dynamics run in full: the
decision is step 0, the other 49 steps are spread over the turns that follow it, and the last turn
runs whatever remains, so the return has the distribution of WatchRepair-v0's. Without any
decision by the last turn the watch stays unrepaired and the shop pays the owner a storage fee:
the return is `undecided_return` (default -2.0, below the expected return of every decision, the
worst being -1.5 for repairing brand 0 or 3), so that never deciding is never optimal. Without it
an undecided episode would return exactly what skip() returns and the reward could not tell the
two apart, while the task counts the first as a failure. The terminal reward is the
watch-repair return times `reward_scale` (default 0.1: expected returns of repairing brands 0-3
are -0.15, 0.35, 0.35, -0.15; realised returns lie roughly within [-4, 6]).

`noise_scale` (default 1.0, the paper's noise) scales the return's deviation from its mean
given the brand and the decision: G' = E[G | brand, decision] + noise_scale * (G - E[G | ...]).
0 makes every return its expectation (a noiseless variant); the expected returns, and so the
optimal decisions, never change. At the paper's noise one return has signal-to-noise 0.14-0.33.

`reset(seed=s)` fixes the whole episode: the brand and the outcome (the repair cost and the transport
events drawn at the decision). `reset(seed=s, options={"outcome_seed": o})` keeps the task that `s`
draws and takes the outcome from `o`: the LLM arm gives each of a task's K rollouts its own `o`, so
that they meet independent noise, as K episodes of one task in the world would (`reset_outcome`).
`snapshot()` / `restore(state, outcome_seed=o)` (envs/snapshot.py) does the same mid-episode: the restored
episode keeps what it has shown (the decision, its repair cost, the bumps and drops so far) and draws the rest
of its transport from `o`.

`info` per step: `state_mutating` (this call changed the state), `execution_output` (the text the
call returned: the VCBM bookmark key), `effect` (canonical action: repair, skip, inspect, wait or
invalid; EMPO's effect), `is_decision_turn`, `brand`, `optimal_first_action`, and once decided
`first_decision_optimal` and `task_goal_completion` (the decision was optimal). An episode that
ends undecided reports both as failures (False, 0.0) on its last step, so completion rates count
it. The last four are for evaluation only; no agent may learn from them.
"""

from __future__ import annotations

import math
import re
import string
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from envs.snapshot import SnapshotMixin
from envs.watch_repair import KEEP, REPAIR, WatchRepairDynamics, WatchRepairParams

BRAND_NAMES = ("Alder", "Borealis", "Corvina", "Dunmore")
TOOLS = ("repair", "skip", "inspect", "wait")
CHARSET = frozenset(string.printable)
MAX_TEXT = 8192
_TOOL_PATTERN = re.compile(r"\b(repair|skip|inspect|wait)\b", re.IGNORECASE)


def parse_action(text: str) -> str:
    """The canonical tool of an answer: the last tool name it mentions, or "invalid"."""
    found = _TOOL_PATTERN.findall(text or "")
    # casefold, not lower: IGNORECASE matches 'ſkip' (long s), whose lower() is not 'skip'
    return found[-1].casefold() if found else "invalid"


def outcome_generator(task_random: np.random.Generator, options: dict | None) -> np.random.Generator:
    """The generator of an episode's outcome: `task_random` (the reset seed's), or a fresh one seeded by
    `options["outcome_seed"]`, so that K rollouts of one task can meet independent outcomes."""
    seed = (options or {}).get("outcome_seed")
    if seed is None:
        return task_random
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"outcome_seed={seed!r}: expected an integer >= 0")
    return gym.utils.seeding.np_random(int(seed))[0]


def _printable(text: str, limit: int = 80) -> str:
    clean = "".join(ch if ch in CHARSET and ch not in "\r\x0b\x0c" else "?" for ch in text)
    return clean[:limit] + ("..." if len(clean) > limit else "")


class WatchTextEnv(SnapshotMixin, gym.Env):
    """What the watch text envs share: the watch-repair law, text spaces, reward and noise scales."""

    # reset(options=...) keys: "brand" fixes the watch's brand, "outcome_seed" the episode's outcome (see reset_outcome)
    metadata = {"render_modes": ["ansi"], "render_fps": 1, "reset_options": ("brand", "outcome_seed")}

    def __init__(
        self,
        reward_scale: float,
        noise_scale: float,
        render_mode: str | None,
        params: dict[str, Any],
        undecided_return: float = -2.0,
    ):
        if not (math.isfinite(reward_scale) and reward_scale > 0):
            raise ValueError(f"reward_scale={reward_scale}: expected a positive finite number")
        if not (math.isfinite(noise_scale) and noise_scale >= 0):
            raise ValueError(f"noise_scale={noise_scale}: expected a finite number >= 0 (1 is the paper's noise)")
        self.reward_scale, self.noise_scale = float(reward_scale), float(noise_scale)
        self.dynamics = WatchRepairDynamics(WatchRepairParams(**params))
        self.params = self.dynamics.params
        self._expected_repair = self.params.expected_repair_return()
        worst_decision = min(0.0, float(np.min(self._expected_repair)))
        if not (math.isfinite(undecided_return) and undecided_return < worst_decision):
            raise ValueError(
                f"undecided_return={undecided_return}: expected a finite number below every decision's expected "
                f"return (the worst is {worst_decision:.3f}), so that never deciding is never optimal"
            )
        self.undecided_return = float(undecided_return)
        if self.params.n_brands > len(BRAND_NAMES):
            raise ValueError(f"{self.params.n_brands} brands: expected at most {len(BRAND_NAMES)}")
        self._optimal = self.params.optimal_first_action()
        self.observation_space = spaces.Text(max_length=MAX_TEXT, min_length=0, charset=string.printable)
        self.action_space = spaces.Text(max_length=MAX_TEXT, min_length=0, charset=string.printable)
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(f"render_mode={render_mode!r}: expected one of {self.metadata['render_modes']}")
        self.render_mode = render_mode

    def reset_outcome(self, options: dict | None) -> None:
        """Choose the generator of the episode's outcome: the random draws made after reset (transport events).

        By default the reset seed fixes the outcome together with the task (brand, stations), as Gymnasium's
        reset(seed) fixes a whole episode. `options={"outcome_seed": s}` draws the outcome from a seed of its
        own: K rollouts of one task (one reset seed) then meet independent outcomes, as K episodes of the same
        task played in the world would, instead of repeating one draw of the noise K times.
        """
        self._outcome_rng = outcome_generator(self.np_random, options)

    def snapshot_identity(self) -> tuple:
        return (self.params, self.max_turns, self.reward_scale, self.noise_scale, self.undecided_return)

    def scaled_return(self, realised: float, repaired: bool, brand: int) -> float:
        """E[G | brand, decision] + noise_scale * (G - E[G | brand, decision])."""
        expected = float(self._expected_repair[brand]) if repaired else 0.0
        return expected + self.noise_scale * (realised - expected)


class TextWatchRepairEnv(WatchTextEnv):
    """Watch repair as text: observation and action are strings (gymnasium.spaces.Text)."""

    snapshot_fields = (
        "_state", "_decision", "_turn", "_reward", "_last_obs", "_outcome_rng", "_trajectory", "_step_rewards", "_draws",
    )  # fmt: skip

    def __init__(
        self,
        max_turns: int = 6,
        reward_scale: float = 0.1,
        noise_scale: float = 1.0,
        undecided_return: float = -2.0,
        render_mode: str | None = None,
        **params: Any,
    ):
        if int(max_turns) < 2:
            raise ValueError(f"max_turns={max_turns}: expected an integer >= 2 (a decision and a later turn)")
        super().__init__(reward_scale, noise_scale, render_mode, params, undecided_return)
        self.max_turns = int(max_turns)
        self._state: np.ndarray | None = None
        self._decision: str | None = None
        self._turn = 0
        self._last_obs = ""

    # --- Gymnasium API -------------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self._state = self.dynamics.reset(self.np_random, 1, (options or {}).get("brand"))
        self.reset_outcome(options)
        self._decision, self._turn, self._reward = None, 0, 0.0
        brand = self._brand
        self._last_obs = (
            f"A customer brings in a {BRAND_NAMES[brand]} watch that has stopped. You may repair it now and "
            f"ship it to the buyer, or skip the repair and return it untouched. You have {self.max_turns} turns.\n"
            "Tools: repair() repairs and ships the watch (only your first decision counts); skip() declines the "
            "repair; inspect() describes the watch and its costs; wait() lets time pass.\n" + self._status()
        )
        return self._last_obs, self._info(False, "", "none", False)

    def step(self, action):
        if self._state is None or self._turn >= self.max_turns:
            raise RuntimeError("step() called before reset() or after the episode ended")
        text = action if isinstance(action, str) else str(action)
        effect = parse_action(text)
        self._turn += 1
        mutating = is_decision = False
        if effect in ("repair", "skip") and self._decision is None:
            output, mutating, is_decision = self._decide(effect), True, True
        elif effect in ("repair", "skip"):
            output = f"{effect}() refused: the watch was already handled ({self._decision})."
        elif effect == "inspect":
            output = self._inspection()
        elif effect == "wait":
            output = "You wait."
        else:
            output = f"invalid action {_printable(text)!r}: expected one of repair(), skip(), inspect(), wait()."
        terminated = self._turn >= self.max_turns
        if self._decision is not None and (not is_decision or terminated):
            output += " " + self._advance(final=terminated)
        reward = 0.0
        if terminated:
            reward = self._final_return() * self.reward_scale
            output += f" The episode is over. Final result: {self._outcome()}"
        self._last_obs = f"{output}\n{self._status()}" if not terminated else output
        return self._last_obs, float(reward), terminated, False, self._info(mutating, output, effect, is_decision)

    def render(self):
        if self.render_mode == "ansi":
            return self._last_obs
        return None

    # --- internals -----------------------------------------------------------------------------
    @property
    def _brand(self) -> int:
        return int(self._state[0, 3])

    def _status(self) -> str:
        left = self.max_turns - self._turn
        # the brand closes every observation: the word the decision depends on sits next to the answer
        plural = "s" if left != 1 else ""
        return f"Turn {self._turn + 1} of {self.max_turns}; {left} turn{plural} left. Watch: {BRAND_NAMES[self._brand]}."

    def _decide(self, effect: str) -> str:
        self._decision = effect
        before = self._reward
        self._step_dynamics(REPAIR if effect == "repair" else KEEP)
        if effect == "repair":
            return f"repair() done: the watch was repaired for {before - self._reward:.2f} and shipped."
        return "skip() done: the watch goes back to its owner unrepaired."

    def _step_dynamics(self, action: int) -> None:
        """One dynamics step: the first draws and rolls out the episode, later ones replay it."""
        t = int(self._state[0, 4])
        if t == 0:
            brand, first_action = self._state[:, 3], np.array([action])
            self._draws = self.dynamics.draw([self._outcome_rng], brand, first_action)
            self._trajectory, self._step_rewards = self.dynamics.rollout(brand, first_action, self._draws)
        self._state = self._trajectory[:, t + 1]
        self._reward += float(self._step_rewards[0, t])

    def redraw_outcome(self, rng: np.random.Generator) -> None:
        """Before the decision its draws come from `rng`; after it, the dynamics steps not yet run."""
        self._outcome_rng = rng
        if self._decision is None:
            return
        t = int(self._state[0, 4])
        if t < self.params.horizon:
            first = REPAIR if self._decision == "repair" else KEEP
            self._draws, self._trajectory, self._step_rewards = self.dynamics.redraw_unrevealed(
                self._draws, self._brand, first, t, rng
            )

    def _advance(self, final: bool) -> str:
        """Run this turn's share of the remaining dynamics steps; describe the transport events."""
        remaining = self.params.horizon - int(self._state[0, 4])
        turns_left = self.max_turns - self._turn + 1
        n = remaining if final else remaining // turns_left
        c_before = self._state[0, 1:3].copy()
        for _ in range(n):
            self._step_dynamics(KEEP)
        bumps, drops = (self._state[0, 1:3] - c_before).tolist()
        if self._decision != "repair":
            return f"Time passes ({n} hours)."
        return f"In transport for {n} hours: {bumps} minor bumps, {drops} drops."

    def _final_return(self) -> float:
        if self._decision is None:
            return self.undecided_return
        return self.scaled_return(self._reward, self._decision == "repair", self._brand)

    def _inspection(self) -> str:
        b, p = self._brand, self.params
        return (
            f"inspect(): a {BRAND_NAMES[b]} watch. Resale price after repair {p.price[b]:.0f}; repair costs about "
            f"{p.repair_cost_mean[b]:.1f}; shipping costs about {p.transport_mean[b]:.1f}; each bump in transport "
            f"costs {p.counter_penalties[0]:.1f} and each drop {p.counter_penalties[1]:.1f}."
        )

    def _outcome(self) -> str:
        if self._decision == "repair":
            return f"the repaired watch earned {self._final_return() * self.reward_scale:+.3f}."
        if self._decision is None:
            return f"no decision was made; the owner's storage fee cost {self.undecided_return * self.reward_scale:+.3f}."
        return "the watch was not repaired; nothing earned or lost (+0.000)."

    def _info(self, mutating: bool, output: str, effect: str, is_decision: bool) -> dict[str, Any]:
        brand = self._brand
        info: dict[str, Any] = {
            "state_mutating": mutating,
            "execution_output": output,
            "effect": effect,
            "is_decision_turn": is_decision,
            "brand": brand,
            "optimal_first_action": int(self._optimal[brand]),
        }
        if self._decision is not None:
            optimal = (REPAIR if self._decision == "repair" else KEEP) == int(self._optimal[brand])
            info["first_decision_optimal"] = optimal
            info["task_goal_completion"] = float(optimal)
        elif self._turn >= self.max_turns:  # ended undecided: a failed task, not a missing one
            info["first_decision_optimal"] = False
            info["task_goal_completion"] = 0.0
        return info
