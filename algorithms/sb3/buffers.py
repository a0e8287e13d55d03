"""Replay buffers for a reward rule (DQN, SAC, TD3): episodes enter at their end; sampled rewards are relabelled.

Why not a Gymnasium reward wrapper: a rule's reward for step t may depend on the episode's return, known
only at its end, while SB3 stores transition t as soon as `step` returns. `RelabelingReplayBuffer` keeps
the running episode aside and writes it whole when it ends, with the rule's rewards for it
(`credit_slot.assign_credit`: the rewards, then the rule learns from the episode).

Relabelling, as the RRD and IRCR reference buffers do (Ren et al. 2022; Gangwani et al. 2020): every sampled
transition's reward is the rule's *current* reward for it (`RewardRule.transition_rewards`: RRD's reward
model on (s, a, s - s'), IRCR's episode return under the current G_min, G_max), so the critic always trains
on what the reward model says now. A rule whose reward of a step depends on its whole episode (RUDDER's LSTM,
vcbm_bookmark) returns None there, and the rewards written at the episode's end stay.

Elite episodes (IRCR's heap): when the rule asks for them (`RewardRule.replay_elites()`: k > 0), the k episodes
of the highest return ever seen are kept beside the FIFO, and the rule's fraction of every batch is drawn from
their transitions (IRCR: 10 episodes, half of each batch).

n-step returns (the algorithm's `n_steps` > 1, handed over by the runner with `gamma` as SB3 hands them to its
own NStepReplayBuffer): a sampled transition's reward is the discounted sum of the rule's current rewards of it and
the next n - 1 transitions, cut at the first episode end (terminal or truncated) inclusive, with the next observation
and done of the last one summed and `discounts` = gamma^(steps summed) for the bootstrap (SB3's NStepReplayBuffer
semantics; n-step return: Sutton & Barto, Reinforcement Learning: An Introduction, Sec. 7.1). An elite sample sums
within its stored elite episode. n_steps = 1 samples one relabelled transition, `discounts` None.

Fit to the dense reward: where the env reports the reward it withheld (`info["withheld_reward"]`, as
`envs.delayed_reward.DelayedReward` does), every finished episode adds one point to `reward_fit`: the Pearson
correlation between the rule's rewards and the withheld ones, pooled over the last `FIT_WINDOW` episodes. The
rule's rewards are those written for an episode before the rule learns from it, so the fit is held out.

Single environment only (the buffer writes whole episodes at its position).
"""

from __future__ import annotations

import heapq
from collections import deque
from typing import Any, NamedTuple

import numpy as np
import torch as th
from stable_baselines3.common.buffers import ReplayBuffer
from stable_baselines3.common.type_aliases import ReplayBufferSamples

from algorithms.common.credit_slot import assign_credit
from algorithms.sb3.callbacks import in_space_shape
from vcbm_gym.credit.base import EpisodeBatch, RewardRule

FIT_WINDOW = 10  # episodes pooled into one point of RelabelingReplayBuffer.reward_fit


def pooled_correlation(pairs: list[tuple[np.ndarray, np.ndarray]]) -> float:
    """Pearson's r between the concatenated first and second arrays of `pairs` (NaN when either is constant)."""
    x = np.concatenate([np.asarray(a, dtype=np.float64) for a, _ in pairs])
    y = np.concatenate([np.asarray(b, dtype=np.float64) for _, b in pairs])
    if len(x) < 2 or np.ptp(x) == 0.0 or np.ptp(y) == 0.0:
        return float("nan")
    return float(np.corrcoef(x, y)[0, 1])


class StoredEpisode(NamedTuple):
    """One whole episode's transitions (T rows each) and its env return."""

    episode_return: float
    observations: np.ndarray
    actions: np.ndarray
    next_observations: np.ndarray
    dones: np.ndarray  # terminal (not truncated) flags
    rewards: np.ndarray  # the rewards written when the episode ended


class RelabelingReplayBuffer(ReplayBuffer):
    """ReplayBuffer whose episodes enter at their end and whose sampled rewards are the rule's current ones."""

    def __init__(self, *args: Any, rule: RewardRule, n_steps: int = 1, gamma: float = 0.99, **kwargs: Any) -> None:
        if isinstance(n_steps, bool) or not isinstance(n_steps, (int, np.integer)) or n_steps < 1:
            raise ValueError(f"n_steps={n_steps!r}: RelabelingReplayBuffer expects an integer >= 1")
        if isinstance(gamma, bool) or not isinstance(gamma, (int, float)) or not 0.0 <= gamma <= 1.0:
            raise ValueError(f"gamma={gamma!r}: RelabelingReplayBuffer expects a discount in [0, 1]")
        super().__init__(*args, **kwargs)
        if self.n_envs != 1:
            raise ValueError(f"n_envs={self.n_envs}: RelabelingReplayBuffer expects a single environment")
        if n_steps > 1 and self.optimize_memory_usage:
            raise ValueError(
                f"n_steps={n_steps} with optimize_memory_usage=True: expected one of them (as SB3's NStepReplayBuffer)"
            )
        self.n_steps, self.gamma = int(n_steps), float(gamma)
        elite_episodes, elite_fraction = rule.replay_elites()
        if not 0.0 <= elite_fraction < 1.0 or (elite_fraction > 0) != (elite_episodes > 0):
            raise ValueError(
                f"replay_elites() = ({elite_episodes}, {elite_fraction}): expected (0, 0.0), or k >= 1 and a fraction in (0, 1)"
            )
        self.rule, self.elite_episodes, self.elite_fraction = rule, int(elite_episodes), float(elite_fraction)
        self.episode_returns = np.zeros(self.buffer_size, dtype=np.float64)  # per stored row: its episode's env return
        self.elites: list[tuple[float, int, StoredEpisode]] = []  # min-heap on the return, tie-broken by arrival
        self._arrivals = 0
        self._pending: list[tuple[np.ndarray, np.ndarray, np.ndarray, float, bool, bool, list[dict]]] = []
        self.last_written: np.ndarray | None = None
        self.stored_transitions = 0
        self._fit_window: deque[tuple[np.ndarray, np.ndarray]] = deque(maxlen=FIT_WINDOW)
        self.reward_fit: list[tuple[int, float]] = []  # (transitions stored, r over the last FIT_WINDOW episodes)

    def add(self, obs, next_obs, action, reward, done, infos) -> None:  # type: ignore[override]
        done_flag = bool(np.asarray(done).reshape(-1)[0])
        truncated = bool(infos[0].get("TimeLimit.truncated", False)) if infos else False
        self._pending.append(
            (
                np.array(obs),
                np.array(next_obs),
                np.array(action),
                float(np.asarray(reward).reshape(-1)[0]),
                done_flag,
                truncated,
                infos,
            )
        )
        if done_flag:
            self._flush()

    def _flush(self) -> None:
        episode = self._episode_arrays()
        batch = EpisodeBatch(
            episode.rewards[None],
            np.ones((1, len(episode.rewards)), dtype=bool),
            observations=in_space_shape(episode.observations[None], self.observation_space, 2),
            actions=episode.actions[None],
            extras={"next_observations": in_space_shape(episode.next_observations[None], self.observation_space, 2)},
        )
        written = assign_credit(self.rule, batch)[0]
        for (obs, next_obs, action, _, done, _, infos), reward in zip(self._pending, written):
            self.episode_returns[self.pos] = episode.episode_return
            super().add(obs, next_obs, action, np.array([reward], dtype=np.float32), np.array([done]), infos)
        self.last_written = written
        self.stored_transitions += len(written)
        self._record_fit(written)
        self._keep_if_elite(episode._replace(rewards=written.astype(np.float32)))
        self._pending = []

    def _record_fit(self, written: np.ndarray) -> None:
        withheld = [(p[6][0] if p[6] else {}).get("withheld_reward") for p in self._pending]
        if any(value is None for value in withheld):
            return
        self._fit_window.append((np.asarray(written, dtype=np.float64), np.asarray(withheld, dtype=np.float64)))
        self.reward_fit.append((self.stored_transitions, pooled_correlation(list(self._fit_window))))

    def _episode_arrays(self) -> StoredEpisode:
        rows = self._pending
        observations = np.stack([p[0].reshape(self.obs_shape) for p in rows])
        next_observations = np.stack([p[1].reshape(self.obs_shape) for p in rows])
        actions = np.stack([p[2].reshape(self.action_dim) for p in rows])
        actions = actions[:, 0] if self.action_dim == 1 and self.action_space.shape == () else actions
        rewards = np.array([p[3] for p in rows], dtype=np.float64)
        dones = np.array([p[4] and not p[5] for p in rows], dtype=np.float32)
        return StoredEpisode(float(rewards.sum()), observations, actions, next_observations, dones, rewards)

    def _keep_if_elite(self, episode: StoredEpisode) -> None:
        if not self.elite_episodes:
            return
        self._arrivals += 1
        item = (episode.episode_return, self._arrivals, episode)
        if len(self.elites) < self.elite_episodes:
            heapq.heappush(self.elites, item)
        elif episode.episode_return > self.elites[0][0]:
            heapq.heapreplace(self.elites, item)

    def relabel(self, observations, actions, next_observations, episode_returns, stored: np.ndarray) -> np.ndarray:
        """(N,) the rule's current rewards of N transitions (stored as SB3 stores them), or the stored ones where the
        rule has none."""
        observations = in_space_shape(observations, self.observation_space, 1)
        next_observations = in_space_shape(next_observations, self.observation_space, 1)
        current = self.rule.transition_rewards(observations, actions, next_observations, episode_returns)
        return np.asarray(stored, dtype=np.float64).reshape(-1) if current is None else np.asarray(current, dtype=np.float64)

    def _relabel_rows(self, rows: np.ndarray) -> np.ndarray:
        """(N,) the rule's current rewards of the stored transitions at buffer rows `rows`."""
        next_obs = (
            self.next_observations[rows, 0]
            if not self.optimize_memory_usage
            else (self.observations[(rows + 1) % self.buffer_size, 0])
        )
        return self.relabel(
            self.observations[rows, 0],
            self._rule_actions(self.actions[rows, 0]),
            next_obs,
            self.episode_returns[rows],
            self.rewards[rows, 0],
        )

    def _get_samples(self, batch_inds: np.ndarray, env=None) -> ReplayBufferSamples:
        samples = super()._get_samples(batch_inds, env)  # observations, actions (and the env index SB3 draws)
        if self.n_steps > 1:
            return self._n_step_samples(samples, batch_inds, env)
        rewards = self._relabel_rows(batch_inds)
        return samples._replace(rewards=self.to_torch(rewards.reshape(-1, 1).astype(np.float32)))

    def _n_step_samples(self, samples: ReplayBufferSamples, batch_inds: np.ndarray, env) -> ReplayBufferSamples:
        """n-step targets as SB3's NStepReplayBuffer builds them (Sutton & Barto, Reinforcement Learning: An
        Introduction, Sec. 7.1, the n-step return), from the rule's current rewards: the discounted sum of the
        relabelled rewards of transitions i .. i + k - 1, k the n steps or up to the first episode end
        (terminal or truncated) inclusive; next observation and done of transition i + k - 1; discount gamma^k.
        Episodes enter whole, so every run of rows from i meets its episode's end before the write position
        (row pos - 1 ends an episode), also across the wrap-around of a full buffer."""
        steps = (batch_inds[:, None] + np.arange(self.n_steps)[None]) % self.buffer_size  # (B, n) buffer rows
        ends = np.logical_or(self.dones[steps, 0], self.timeouts[steps, 0])
        last = np.where(ends.any(axis=1), ends.argmax(axis=1), self.n_steps - 1)  # offset of each return's last step
        mask = np.arange(self.n_steps)[None] <= last[:, None]
        rewards = np.zeros(mask.shape, dtype=np.float64)
        rewards[mask] = self._relabel_rows(steps[mask])  # only the summed transitions meet the rule
        returns, discounts = self._discounted_sums(self._normalize_reward(rewards, env), mask)
        last_rows = steps[np.arange(len(batch_inds)), last]
        dones = self.dones[last_rows, 0] * (1 - self.timeouts[last_rows, 0])
        return samples._replace(
            next_observations=self.to_torch(self._normalize_obs(self.next_observations[last_rows, 0], env)),
            dones=self.to_torch(dones.reshape(-1, 1).astype(np.float32)),
            rewards=self.to_torch(returns),
            discounts=self.to_torch(discounts),
        )

    def _discounted_sums(self, rewards: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(B, 1) sum_j gamma^j r_j over each row's masked steps, and (B, 1) gamma^k, k its number of steps."""
        powers = self.gamma ** np.arange(rewards.shape[1], dtype=np.float64)[None]
        returns = (rewards * powers * mask).sum(axis=1, keepdims=True)
        discounts = self.gamma ** mask.sum(axis=1, keepdims=True).astype(np.float64)
        return returns.astype(np.float32), discounts.astype(np.float32)

    def _rule_actions(self, actions: np.ndarray) -> np.ndarray:
        """Stored actions as the rule saw them (a Discrete action as a scalar, not SB3's (1,) row)."""
        return actions[:, 0] if self.action_space.shape == () else actions

    def sample(self, batch_size: int, env=None) -> ReplayBufferSamples:
        n_elite = round(batch_size * self.elite_fraction) if self.elites else 0
        fifo = super().sample(batch_size - n_elite, env)
        if not n_elite:
            return fifo
        elite = self._elite_samples(n_elite)
        return ReplayBufferSamples(*(a if a is None else th.cat([a, b]) for a, b in zip(fifo, elite)))

    def _elite_rows(self) -> dict[str, np.ndarray]:
        """The elite episodes' transitions end to end in heap order (each StoredEpisode field, and `episode_returns`:
        every row's episode return); rebuilt when the heap changes (at most once an episode), not at every batch."""
        key = tuple(arrival for _, arrival, _ in self.elites)
        cached = getattr(self, "_elite_cache", None)  # absent from a buffer pickled before it existed
        if cached is None or cached[0] != key:
            episodes = [item[2] for item in self.elites]
            rows = {field: np.concatenate([getattr(e, field) for e in episodes]) for field in StoredEpisode._fields[1:]}
            rows["episode_returns"] = np.concatenate([np.full(len(e.rewards), e.episode_return) for e in episodes])
            self._elite_cache = cached = (key, rows)
        return cached[1]

    def _elite_samples(self, n: int) -> ReplayBufferSamples:
        """n transitions drawn uniformly from the elite episodes' transitions, relabelled like the FIFO's; with
        n_steps > 1 their n-step returns within the stored elite episode (which ends its own runs)."""
        ends = np.cumsum([len(item[2].rewards) for item in self.elites])  # one past each episode's last row
        flat = np.random.randint(0, int(ends[-1]), size=n)  # rows of _elite_rows
        end = ends[np.searchsorted(ends, flat, side="right")]  # the end of each drawn row's episode
        runs = flat[:, None] + np.arange(self.n_steps)[None]  # (n, n_steps): the rows an n-step return may sum
        mask = runs < end[:, None]  # those inside the drawn row's episode
        last = flat + mask.sum(axis=1) - 1  # the row of each return's last step
        summed = runs[mask]
        rows = self._elite_rows()
        per_step = self.relabel(
            rows["observations"][summed],
            rows["actions"][summed],
            rows["next_observations"][summed],
            rows["episode_returns"][summed],
            rows["rewards"][summed],
        )
        if self.n_steps == 1:
            returns, discounts = self._normalize_reward(per_step.reshape(-1, 1).astype(np.float32)), None
        else:
            rewards = np.zeros(mask.shape, dtype=np.float64)
            rewards[mask] = per_step
            returns, discounts = self._discounted_sums(self._normalize_reward(rewards), mask)
        obs, actions, next_obs = rows["observations"][flat], rows["actions"][flat], rows["next_observations"][last]
        return ReplayBufferSamples(
            observations=self.to_torch(self._normalize_obs(obs.astype(self.observations.dtype))),
            actions=self.to_torch(actions.reshape(n, self.action_dim).astype(self.actions.dtype)),
            next_observations=self.to_torch(self._normalize_obs(next_obs.astype(self.observations.dtype))),
            dones=self.to_torch(rows["dones"][last].reshape(-1, 1)),
            rewards=self.to_torch(returns),
            discounts=None if discounts is None else self.to_torch(discounts),
        )
