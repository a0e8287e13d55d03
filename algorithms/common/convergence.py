"""The convergence criterion of paper 000 Sec. V-A2 (SPEC section 4)."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from algorithms.common.validation import AT_LEAST_ONE, UNIT_POSITIVE, Validated


@dataclass
class EpisodeRunConfig(Validated):
    """Run settings shared by every runner that trains until the convergence criterion."""

    RANGES = {"max_episodes": AT_LEAST_ONE, "convergence_window": AT_LEAST_ONE, "convergence_threshold": UNIT_POSITIVE}

    max_episodes: int = 20_000
    convergence_window: int = 750
    convergence_threshold: float = 0.95
    stop_at_convergence: bool = True
    env_kwargs: dict = field(default_factory=dict)


class ConvergenceTracker:
    """A run converges at the first episode where the fraction of correct first decisions over
    the last `window` episodes (a full window) reaches `threshold`."""

    def __init__(self, window: int = 750, threshold: float = 0.95) -> None:
        if window < 1 or not 0 < threshold <= 1:
            raise ValueError(f"window={window}, threshold={threshold}: expected window >= 1 and 0 < threshold <= 1")
        self.window, self.threshold = window, threshold
        self._recent: deque[bool] = deque(maxlen=window)
        self._correct_in_window = 0
        self.episodes = 0
        self.converged_at: int | None = None

    def update(self, correct: bool) -> bool:
        """Record one episode; True on the episode at which the run first converges."""
        if len(self._recent) == self.window:
            self._correct_in_window -= self._recent[0]
        self._recent.append(bool(correct))
        self._correct_in_window += bool(correct)
        self.episodes += 1
        if self.converged_at is None and len(self._recent) == self.window and self.rate >= self.threshold:
            self.converged_at = self.episodes
            return True
        return False

    @property
    def rate(self) -> float:
        """Fraction correct over the (possibly not yet full) window."""
        return self._correct_in_window / len(self._recent) if self._recent else 0.0
