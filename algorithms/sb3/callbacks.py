"""SB3 callbacks: a credit rule rewrites PPO/A2C's rollout (advantages, or rewards through GAE); a tracker stops
at convergence.

`CreditCallback(rule)` runs at the end of every rollout, after SB3 has computed GAE. Episode assembly from
the RolloutBuffer (n_steps, n_envs): each env column is cut at `episode_starts`; an episode is *complete*
when it starts inside this rollout and ends inside it (the last step of the rollout counts when SB3's final
`dones` is set). Only complete episodes go to the rule, with the env's own rewards (recorded at every step,
before SB3 adds a truncated episode's bootstrap gamma V(s_T) to its last reward), and only their steps are
rewritten, by the kind of credit the rule emits (algorithms/common/credit_slot.py):

- *rewards* (rudder, rrd, ircr, vcbm_bookmark): the rule's per-step rewards replace the env's in the buffer
  (the bootstrap term kept), and SB3's own `compute_returns_and_advantage` runs again: GAE and the critic's
  TD(lambda) targets are computed on the redistributed rewards, as RUDDER trains PPO (Arjona-Medina et al.
  2019). The critic learns the value of the new rewards.
- *advantages* (broadcast, loo, grpo, ...): advantages[t] = the rule's A_t; returns[t] = sum_{s>=t}
  gamma^(s-t) r_s (Monte Carlo, what the critic estimates; the episode is complete, so nothing needs
  bootstrapping).

Steps of episodes cut by the rollout edge keep SB3's GAE advantage and TD(lambda) return on the env's
rewards: an episode split across two rollouts cannot have its first half re-weighted after it was
optimised. Choose `n_steps` a multiple of the episode length (as zoo_configs/ppo.yml does for WatchRepair's
50 steps) and every episode is complete; an n_steps shorter than one episode is refused when the run is
resolved (runner.sb3_config), since no full-length episode would ever reach the rule. The critic's V(s_0) of
each episode is passed as extras["baseline"] (broadcast.py's "given"), SB3's GAE advantages as extras["advantages"]
(vcbm_bookmark.py's advantage="given"). Group ids (LOO, GRPO): "none" puts all episodes of the rollout in
one group; "initial_obs" groups episodes that start from the same observation (on WatchRepair: the brand).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from gymnasium import spaces
from stable_baselines3.common.callbacks import BaseCallback

from algorithms.common.convergence import EpisodeOutcomes
from algorithms.common.credit_slot import assign_credit
from vcbm_gym.credit.base import REWARDS, CreditRule, EpisodeBatch

GROUP_BY = ("none", "initial_obs")
DEFAULT_GROUP_BY = "none"  # all complete episodes of a rollout in one group


def complete_episodes(episode_starts: np.ndarray, last_dones: np.ndarray) -> list[tuple[int, int, int]]:
    """(env, start, stop) of every episode that starts and ends within the rollout, in env order."""
    n_steps, n_envs = episode_starts.shape
    episodes = []
    for env in range(n_envs):
        starts = np.flatnonzero(episode_starts[:, env] > 0).tolist()
        stops = starts[1:] + ([n_steps] if bool(last_dones[env]) else [])
        episodes.extend((env, start, stop) for start, stop in zip(starts, stops))
    return episodes


def in_space_shape(values: np.ndarray, space: Any, lead: int) -> np.ndarray:
    """SB3's stored observations, (*lead, *SB3's shape), in the space's own shape, as a credit rule reads them
    (EpisodeBatch: (B, T) + the space's shape). SB3 stores a Discrete observation as a (1,) row of floats; a rule's
    featurizer, like the tabular arm, takes it as the index it is."""
    values = np.asarray(values)
    shape = getattr(space, "shape", None)
    if shape is None or values.shape[lead:] == tuple(shape) or int(np.prod(values.shape[lead:])) != int(np.prod(shape)):
        return values
    values = values.reshape(values.shape[:lead] + tuple(shape))
    return values.astype(space.dtype) if isinstance(space, spaces.Discrete) else values


def group_ids_for(first_observations: np.ndarray, group_by: str) -> np.ndarray:
    if group_by == "none":
        return np.zeros(len(first_observations), dtype=np.int64)
    if group_by == "initial_obs":
        flat = first_observations.reshape(len(first_observations), -1)
        return np.unique(flat, axis=0, return_inverse=True)[1].reshape(-1).astype(np.int64)
    raise ValueError(f"group_by={group_by!r}: expected one of {', '.join(GROUP_BY)}")


def rollout_episode_batch(
    episodes, rewards, observations, actions, values=None, advantages=None, group_by: str = DEFAULT_GROUP_BY
) -> EpisodeBatch:
    """Pad the complete episodes of an (n_steps, n_envs, ...) rollout to an EpisodeBatch;
    `values` (n_steps, n_envs), the critic's V(s_t), gives extras["baseline"] = V(s_0) per episode,
    `advantages` (SB3's GAE) gives extras["advantages"] (B, T)."""
    lengths = [stop - start for _, start, stop in episodes]
    horizon = max(lengths)
    acts = actions.reshape(actions.shape[:2] + (-1,))
    acts = acts[..., 0] if acts.shape[-1] == 1 else acts
    batch_rewards = np.zeros((len(episodes), horizon))
    batch_obs = np.zeros((len(episodes), horizon) + observations.shape[2:], dtype=observations.dtype)
    batch_actions = np.zeros((len(episodes), horizon) + acts.shape[2:], dtype=acts.dtype)
    batch_advantages = np.zeros((len(episodes), horizon))
    mask = np.zeros((len(episodes), horizon), dtype=bool)
    for k, (env, start, stop) in enumerate(episodes):
        n = stop - start
        batch_rewards[k, :n] = rewards[start:stop, env]
        if advantages is not None:
            batch_advantages[k, :n] = advantages[start:stop, env]
        batch_obs[k, :n] = observations[start:stop, env]
        batch_actions[k, :n] = acts[start:stop, env]
        mask[k, :n] = True
    extras: dict = {} if advantages is None else {"advantages": batch_advantages}
    if values is not None:
        extras["baseline"] = np.array([values[start, env] for env, start, _ in episodes], dtype=np.float64)
    groups = group_ids_for(batch_obs[:, 0], group_by)
    return EpisodeBatch(batch_rewards, mask, groups, observations=batch_obs, actions=batch_actions, extras=extras)


def discounted_returns_to_go(rewards: np.ndarray, mask: np.ndarray, gamma: float) -> np.ndarray:
    """(B, T) sum_{s >= t} gamma^(s - t) r_s over each episode's masked steps."""
    out = np.zeros_like(rewards)
    running = np.zeros(len(rewards))
    for t in reversed(range(rewards.shape[1])):
        running = np.where(mask[:, t], rewards[:, t] + gamma * running, 0.0)
        out[:, t] = running
    return out


class CreditCallback(BaseCallback):
    """Rewrite the rollout of complete episodes with `rule`'s credit: its rewards (then GAE again) or advantages."""

    def __init__(self, rule: CreditRule, group_by: str = DEFAULT_GROUP_BY, verbose: int = 0) -> None:
        super().__init__(verbose)
        if group_by not in GROUP_BY:
            raise ValueError(f"group_by={group_by!r}: expected one of {', '.join(GROUP_BY)}")
        self.rule, self.group_by = rule, group_by
        self.last_batch: EpisodeBatch | None = None
        self.last_advantages: np.ndarray | None = None
        self.last_episodes: list[tuple[int, int, int]] = []
        self._env_rewards: np.ndarray | None = None  # (n_steps, n_envs): the env's rewards, before SB3's bootstrap

    def _on_rollout_start(self) -> None:
        buf = self.model.rollout_buffer
        self._env_rewards = np.zeros((buf.buffer_size, buf.n_envs), dtype=np.float32)

    def _on_step(self) -> bool:
        # called after env.step and before the buffer stores the step at `pos` (SB3's collect_rollouts)
        self._env_rewards[self.model.rollout_buffer.pos] = np.asarray(self.locals["rewards"], dtype=np.float32)
        return True

    def _on_rollout_end(self) -> None:
        buf = self.model.rollout_buffer
        episodes = complete_episodes(buf.episode_starts, np.asarray(self.locals["dones"]))
        self.last_episodes = episodes
        rewritten = sum(stop - start for _, start, stop in episodes)
        self.logger.record("credit/rewritten_step_fraction", rewritten / buf.rewards.size)
        if not episodes:
            return
        observations = in_space_shape(buf.observations, self.model.observation_space, 2)
        batch = rollout_episode_batch(
            episodes, self._env_rewards, observations, buf.actions, buf.values, buf.advantages, self.group_by
        )
        credit = assign_credit(self.rule, batch)
        if self.rule.emission() == REWARDS:
            self._rewrite_rewards(episodes, credit)
        else:
            returns = discounted_returns_to_go(batch.rewards, batch.mask, buf.gamma)
            for k, (env, start, stop) in enumerate(episodes):
                buf.advantages[start:stop, env] = credit[k, : stop - start]
                buf.returns[start:stop, env] = returns[k, : stop - start]
        self.last_batch, self.last_advantages = batch, credit
        self.logger.record(f"credit/{self.rule.emission()[:-1]}_abs_mean", float(np.abs(credit[batch.mask]).mean()))

    def _rewrite_rewards(self, episodes: list[tuple[int, int, int]], rewards: np.ndarray) -> None:
        """The rule's rewards in place of the env's (each step keeps SB3's bootstrap term), then SB3's own GAE and
        TD(lambda) targets on them, with the last values and dones the rollout ended on."""
        buf = self.model.rollout_buffer
        bootstrap = buf.rewards - self._env_rewards
        for k, (env, start, stop) in enumerate(episodes):
            buf.rewards[start:stop, env] = rewards[k, : stop - start] + bootstrap[start:stop, env]
        buf.compute_returns_and_advantage(last_values=self.locals["values"], dones=np.asarray(self.locals["dones"]))


class RewardFitCallback(BaseCallback):
    """Logs a RelabelingReplayBuffer's newest fit to the dense reward as `credit/reward_fit_corr`."""

    def __init__(self) -> None:
        super().__init__()
        self._logged = 0

    def _on_step(self) -> bool:
        fit = getattr(self.model.replay_buffer, "reward_fit", [])
        if len(fit) > self._logged:
            self._logged = len(fit)
            if np.isfinite(fit[-1][1]):
                self.logger.record("credit/reward_fit_corr", fit[-1][1])
        return True


class ConvergenceCallback(BaseCallback):
    """Feed each finished episode's last `info` and return to an `EpisodeOutcomes`: the convergence
    criterion of algorithms/common/convergence.py when the env reports `first_decision_optimal`
    (evaluation only), else just the return and success rate. Stop at convergence (if asked) or
    once `max_episodes` have ended."""

    def __init__(
        self,
        outcomes: EpisodeOutcomes,
        max_episodes: int,
        stop_at_convergence: bool,
        report: Callable[[int, dict[str, float]], None] | None = None,
    ) -> None:
        super().__init__()
        self.outcomes, self.max_episodes, self.stop_at_convergence = outcomes, max_episodes, stop_at_convergence
        self.report = report  # RunOptions.report: (episodes, EpisodeOutcomes.progress) after every episode
        self._returns: np.ndarray | None = None

    def _on_step(self) -> bool:
        rewards = np.asarray(self.locals["rewards"], dtype=np.float64).reshape(-1)
        self._returns = rewards.copy() if self._returns is None else self._returns + rewards
        for env, (done, info) in enumerate(zip(self.locals["dones"], self.locals["infos"])):
            if not done:
                continue
            episode_return, self._returns[env] = float(self._returns[env]), 0.0
            if self.outcomes.episodes >= self.max_episodes:
                continue
            just_converged = self.outcomes.update(info, episode_return)
            for key, value in self.outcomes.scalars().items():
                if key != "success_rate":  # SB3 logs rollout/success_rate itself from `is_success`
                    self.logger.record(f"rollout/{key}", value)
            self.logger.record("rollout/episodes", self.outcomes.episodes)
            if self.report is not None:
                self.report(self.outcomes.episodes, self.outcomes.progress(episode_return))
            if just_converged and self.stop_at_convergence:
                return False
        return self.outcomes.episodes < self.max_episodes

    def summary(self) -> dict[str, Any]:
        return self.outcomes.summary()
