"""IRCR: every step of an episode is credited with the episode's return, normalised over a buffer.

"Iterative Relative Credit Refinement" of Gangwani, Zhou and Peng, "Learning Guidance Rewards with
Trajectory-space Smoothing", NeurIPS 2020, arXiv:2010.12718: the guidance reward r_g(s_t, a_t) is
the (smoothed) return of the trajectories through (s_t, a_t); in its practical form (IRCR) each
stored transition takes its own trajectory's return, normalised to [0, 1] by the smallest and
largest return in the replay buffer:

    r_g(k, t) = (G_k - G_min) / (G_max - G_min)        for every trained step t of episode k.

G_min and G_max range over the returns of a FIFO buffer of recent episodes (`buffer_episodes`) and
of the `top_episodes` best episodes ever seen: the authors' code keeps such a heap of the 10 best
episodes beside its FIFO so that the top of the scale does not drop out with old data
(github.com/Stilwell-Git/Randomized-Return-Decomposition, algorithm/replay_buffer/mujoco_buffer/
ircr_buffer.py). Choices the paper leaves open:
- The degenerate scale G_max == G_min (every return seen is equal, up to 1e-12 relative rounding)
  gives 0 on every step: nothing separates the episodes, so no step gets credit (the formula
  would divide by zero).
- Before the first `observe`, the batch's own returns set the scale.
- `baseline` (default "none", the paper's guidance reward) subtracts a baseline on the same scale:
  "batch_mean" the batch's mean normalised return; "given" the caller's batch.extras["baseline"]
  (SB3: the critic's V(s_0), in return units) mapped by the same affine normalisation, so that
  A = (G - V(s_0)) / (G_max - G_min) (a state-dependent baseline, which WatchRepair's
  brand-dependent optimum needs under PPO; see broadcast.py).
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

import numpy as np

import vcbm_gym.credit.options as options
from vcbm_gym.credit.base import ADVANTAGES, REWARDS, EpisodeBatch, RewardRule

BASELINES = ("none", "batch_mean", "given")


def normalised_returns(returns: np.ndarray, low: float, high: float) -> np.ndarray:
    """(G - G_min) / (G_max - G_min), elementwise; all 0 when G_max == G_min (no spread, no credit).

    A spread below 1e-12 of the returns' size counts as none: it is rounding, and dividing by it
    would blow a return outside [G_min, G_max] up to infinity. Finite returns such as +-1e308 can
    span more than the largest float: G_max - G_min overflows to infinity (then inf / inf = NaN),
    so there every term is divided by the returns' size first (elsewhere the plain formula keeps
    its results bit for bit).
    """
    returns = np.asarray(returns, dtype=np.float64)
    low, high = float(low), float(high)
    span = high - low
    if not span > 1e-12 * max(1.0, abs(high), abs(low)):
        return np.zeros_like(returns)
    with np.errstate(over="ignore", invalid="ignore"):
        plain = (returns - low) / span
    if math.isfinite(span) and np.isfinite(plain).all():
        return plain
    size = max(abs(low), abs(high), float(np.abs(returns).max(initial=0.0)))
    return (returns / size - low / size) / (high / size - low / size)


class IRCRRule(RewardRule):
    """r_{k,t} = (G_k - G_min) / (G_max - G_min), the same on every step: the guidance reward (rewards). With a
    baseline on the same scale subtracted it is an advantage (`baseline` other than "none").

    The FIFO of recent returns holds `buffer_episodes` episodes, or, with `buffer_transitions`, the most recent
    episodes whose lengths add up to at most that many transitions: the replay buffer of the reference code
    (3e5 transitions), so that G_min and G_max range over what a replay buffer of that size holds, plus the
    `top_episodes` best episodes ever seen."""

    name = "ircr"
    may_emit = (REWARDS, ADVANTAGES)  # an advantage with a baseline option (see `emission`)

    def __init__(
        self,
        buffer_episodes: int = 2048,
        top_episodes: int = 10,
        baseline: str = "none",
        buffer_transitions: int | None = None,
        elite_fraction: float = 0.5,
    ) -> None:
        self.buffer_episodes = options.integer("buffer_episodes", buffer_episodes, 1)
        self.buffer_transitions = (
            None if buffer_transitions is None else options.integer("buffer_transitions", buffer_transitions, 1)
        )
        self.elite_fraction = options.number("elite_fraction", elite_fraction, 0, below=1)
        self.top_episodes = options.integer("top_episodes", top_episodes, 0)
        if baseline not in BASELINES:
            raise ValueError(f"baseline={baseline!r}: expected one of {', '.join(BASELINES)}")
        self.baseline = baseline
        self.recent: deque[float] = deque(maxlen=None if self.buffer_transitions else self.buffer_episodes)
        self.recent_lengths: deque[int] = deque()  # with buffer_transitions: each FIFO episode's length
        self.best: list[float] = []  # the `top_episodes` largest returns ever seen, ascending

    def needs(self) -> tuple[str, ...]:
        return ("extras['baseline']",) if self.baseline == "given" else ()

    def emission(self) -> str:
        return self.emits if self.baseline == "none" else ADVANTAGES

    def observe(self, batch: EpisodeBatch) -> None:
        returns = [float(g) for g in batch.returns]
        self.recent.extend(returns)
        if self.buffer_transitions is not None:
            self.recent_lengths.extend(int(n) for n in batch.mask.sum(axis=1))
            while sum(self.recent_lengths) > self.buffer_transitions and len(self.recent) > 1:
                self.recent.popleft()
                self.recent_lengths.popleft()
        if self.top_episodes:
            self.best = sorted(self.best + returns)[-self.top_episodes :]

    def scale(self, batch: EpisodeBatch | None = None) -> tuple[float, float]:
        """(G_min, G_max) over the buffer and the best episodes; over `batch` if nothing was observed yet."""
        seen = list(self.recent) + self.best
        if not seen:
            seen = [] if batch is None else batch.returns.tolist()
        if not seen:
            return 0.0, 0.0
        return float(min(seen)), float(max(seen))

    def episode_advantages(self, batch: EpisodeBatch) -> np.ndarray:
        """(B,) the normalised return of each episode, minus the baseline."""
        low, high = self.scale(batch)
        guidance = normalised_returns(batch.returns, low, high)
        if self.baseline == "batch_mean":
            return guidance - guidance.mean() if len(guidance) else guidance
        if self.baseline == "given":
            given = np.asarray(batch.extras.get("baseline", np.full(len(guidance), np.nan)), dtype=np.float64)
            if given.shape != guidance.shape or not np.isfinite(given).all():
                raise ValueError(f'baseline="given" reads batch.extras["baseline"]: expected {len(guidance)} finite values')
            return guidance - (normalised_returns(given, low, high) if high > low else 0.0)
        return guidance

    def advantages(self, batch: EpisodeBatch) -> np.ndarray:
        return batch.broadcast(self.episode_advantages(batch))

    def rewards(self, batch: EpisodeBatch) -> np.ndarray:
        """The guidance reward on every trained step (no baseline: rewards carry none)."""
        return batch.broadcast(normalised_returns(batch.returns, *self.scale(batch)))

    def replay_elites(self) -> tuple[int, float]:
        """The reference buffer's heap: the `top_episodes` best episodes, `elite_fraction` of each batch from them."""
        return (self.top_episodes, self.elite_fraction) if self.top_episodes and self.elite_fraction else (0, 0.0)

    def transition_rewards(self, observations, actions, next_observations, episode_returns) -> np.ndarray:
        """Each stored transition's guidance reward under the current G_min, G_max (what IRCR's buffer relabels)."""
        return normalised_returns(episode_returns, *self.scale())

    def summary(self) -> dict[str, Any]:
        low, high = self.scale()
        return {"buffer_episodes": len(self.recent), "return_min": low, "return_max": high}

    def state_dict(self) -> dict[str, Any]:
        return {
            "recent": np.array(self.recent, dtype=np.float64),
            "recent_lengths": np.array(self.recent_lengths, dtype=np.int64),
            "best": np.array(self.best, dtype=np.float64),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not {"recent", "best"} <= set(state) <= {"recent", "recent_lengths", "best"}:
            raise ValueError(f"ircr state keys {sorted(state)}: expected ['best', 'recent', 'recent_lengths']")
        maxlen = None if self.buffer_transitions else self.buffer_episodes
        self.recent = deque((float(g) for g in np.asarray(state["recent"]).reshape(-1)), maxlen=maxlen)
        self.recent_lengths = deque(int(n) for n in np.asarray(state.get("recent_lengths", [])).reshape(-1))
        best = sorted(float(g) for g in np.asarray(state["best"]).reshape(-1))
        self.best = best[-self.top_episodes :] if self.top_episodes else []
