"""The convergence criterion of "Visual Causal-chain Bookmarking" (Selvakumar, 2026,
arXiv:2610.24032, Sec. V-A2), and what a run reports per finished episode.

The criterion needs the env contract's evaluation-only `first_decision_optimal`
(vcbm_gym/contract.py). An env without it still trains: the run goes on for its episode budget
and reports its mean return, and its success rate where the env reports SB3's `is_success`.
A NaN or infinite episode return (a non-finite reward) stops the run with one line naming the
episode, rather than a NaN mean return in its summary. The mean of finite returns is finite however
large they are (`overflow_free_mean`: returns of +-1e308 overflow a plain sum).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from algorithms.common.errors import VcbmGymError
from algorithms.common.validation import AT_LEAST_ONE, UNIT_POSITIVE, Validated
from vcbm_gym.contract import CONTRACT, PROBE_MAX_STEPS, ContractError, check_value

CRITERION_KEY = "first_decision_optimal"


def overflow_free_mean(values: Sequence[float]) -> float:
    """The mean of finite values, itself finite: where their plain sum overflows (+-1e308), the values are
    divided by the largest magnitude first (elsewhere the plain sum keeps results bit for bit)."""
    total = sum(values)
    if math.isfinite(total):
        return total / len(values)
    size = max(abs(v) for v in values)
    return size * (math.fsum(v / size for v in values) / len(values))


def no_criterion_error(env_id: str, where: str, needs: str) -> VcbmGymError:
    """One line: the env reports no `first_decision_optimal`, which `needs` (what the tool measures) is made of."""
    return VcbmGymError(
        f"env {env_id!r} reports no info[{CRITERION_KEY!r}] ({where}): {needs}, which needs it; "
        "expected an env with the convergence criterion (e.g. WatchRepair-v0)"
    )


def reports_criterion(env_id: str, env_kwargs: Mapping[str, Any], max_steps: int = PROBE_MAX_STEPS) -> bool | None:
    """Whether one random episode of the env (seed 0) ends with `first_decision_optimal` in its info, as a run's
    first episode settles it (EpisodeOutcomes); None if the episode did not end within `max_steps`."""
    from algorithms.common.config import make_env

    env = make_env(env_id, env_kwargs, disable_env_checker=True)
    try:
        env.action_space.seed(0)
        env.reset(seed=0)
        for _ in range(max_steps):
            _, _, terminated, truncated, info = env.step(env.action_space.sample())
            if terminated or truncated:
                return CRITERION_KEY in info
        return None
    finally:
        env.close()


def require_criterion(env_id: str, env_kwargs: Mapping[str, Any], needs: str) -> None:
    """Refuse (one line), before any run, an env whose random episode ends without `first_decision_optimal`."""
    if reports_criterion(env_id, env_kwargs) is False:
        raise no_criterion_error(env_id, "at the end of a random episode", needs)


@dataclass
class EpisodeRunConfig(Validated):
    """Run settings shared by every runner that trains until the convergence criterion."""

    RANGES = {"max_episodes": AT_LEAST_ONE, "convergence_window": AT_LEAST_ONE, "convergence_threshold": UNIT_POSITIVE}

    max_episodes: int = 20_000
    convergence_window: int = 750  # the paper's criterion (Sec. V-A2): 95% correct over the last 750 episodes
    convergence_threshold: float = 0.95
    stop_at_convergence: bool = True
    env_kwargs: dict = field(default_factory=dict)


class ConvergenceTracker:
    """A run converges at the first episode where the fraction of correct first decisions over
    the last `window` episodes (a full window) reaches `threshold`."""

    def __init__(self, window: int, threshold: float) -> None:  # EpisodeRunConfig holds the defaults
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


class EpisodeOutcomes:
    """Per finished episode: the convergence criterion (when the env reports `first_decision_optimal`),
    the success rate (when it reports `is_success`) and the return, over the last `window` episodes.

    Which evaluation keys the env reports is settled by its first episode; an env that reports one
    on some episodes only breaks the contract (one line).
    """

    def __init__(self, tracker: ConvergenceTracker, env_name: str, window: int = 100) -> None:
        self.tracker, self.env_name = tracker, env_name
        self.episodes = 0
        self.returns: deque[float] = deque(maxlen=window)
        self.successes: deque[bool] = deque(maxlen=window)
        self.reports: dict[str, bool] = {}  # evaluation key -> reported (settled at episode 1)

    def _reported(self, info: Mapping[str, Any], key: str) -> bool:
        present = key in info
        if key not in self.reports:
            self.reports[key] = present
        elif present != self.reports[key]:
            first = "reported" if self.reports[key] else "did not report"
            raise ContractError(
                f"env {self.env_name} {first} info[{key!r}] at the end of episode 1 but not so at episode "
                f"{self.episodes}: expected it on every episode's last step or on none ({CONTRACT})"
            )
        if present:
            check_value(key, info[key], f"the end of episode {self.episodes}")
        return present

    @property
    def has_criterion(self) -> bool:
        return self.reports.get("first_decision_optimal", False)

    def update(self, info: Mapping[str, Any], episode_return: float) -> bool:
        """Record a finished episode from its last `info`; True on the episode at which the run converges.
        ContractError (one line naming the episode) if its return is NaN or infinite: the summary and
        every moving average after it would be NaN."""
        self.episodes += 1
        if not math.isfinite(episode_return):
            raise ContractError(
                f"env {self.env_name} returned a NaN or infinite reward in episode {self.episodes} (its return is "
                f"{float(episode_return)!r}): expected finite rewards, or the run's mean return would be NaN ({CONTRACT})"
            )
        self.returns.append(float(episode_return))
        if self._reported(info, "is_success"):
            self.successes.append(bool(info["is_success"]))
        if self._reported(info, "first_decision_optimal"):
            return self.tracker.update(bool(info["first_decision_optimal"]))
        return False

    def scalars(self) -> dict[str, float]:
        """Moving averages to log: correct first decisions and success rate (when reported), return."""
        out = {"mean_return": overflow_free_mean(self.returns)} if self.returns else {}
        if self.has_criterion:
            out["correct_moving_average"] = self.tracker.rate
        if self.successes:
            out["success_rate"] = sum(self.successes) / len(self.successes)
        return out

    def progress(self, episode_return: float) -> dict[str, float]:
        """What RunOptions.report gets after an episode: its return, and the correct-decision moving average
        as `correct_rate` when the env reports `first_decision_optimal` (tune prunes on it; plot draws it)."""
        out = {"return": float(episode_return)}
        if self.has_criterion:
            out["correct_rate"] = self.tracker.rate
        return out

    def summary(self) -> dict[str, Any]:
        """`converged`, `episodes_to_converge` and `final_correct_rate` are None without the criterion."""
        criterion = self.has_criterion
        out = {
            "converged": (self.tracker.converged_at is not None) if criterion else None,
            "episodes_to_converge": self.tracker.converged_at,
            "episodes_run": self.episodes,
            "final_correct_rate": self.tracker.rate if criterion else None,
            "mean_return_last_episodes": overflow_free_mean(self.returns) if self.returns else None,
        }
        if self.reports.get("is_success"):
            out["success_rate_last_episodes"] = sum(self.successes) / len(self.successes)
        return out
