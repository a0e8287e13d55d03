"""RelabelingReplayBuffer's n-step returns (n_steps > 1), from the rule's current rewards, by hand.

Observations are [x, episode index], next observations [x + 10, episode index]; the fake rule's current reward of a
transition is `scale * x` while the reward it wrote at the episode's end is -100, so a sum of stored rewards shows.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from gymnasium import spaces

from algorithms.sb3.buffers import RelabelingReplayBuffer
from algorithms.train import run as train
from vcbm_gym.credit.base import EpisodeBatch, RewardRule

BOX = spaces.Box(-100.0, 100.0, (2,), np.float32)
ACTION = spaces.Box(-1.0, 1.0, (1,), np.float32)
GAMMA = 0.5


class ScaledX(RewardRule):
    """Writes -100 per step; relabels transition (s, a, s') with scale * s[0]."""

    name = "scaled_x"

    def __init__(self, scale: float = 1.0, elites: tuple[int, float] = (0, 0.0)) -> None:
        self.scale, self.elites = scale, elites

    def rewards(self, batch: EpisodeBatch) -> np.ndarray:
        return np.where(batch.mask, -100.0, 0.0)

    def transition_rewards(self, observations, actions, next_observations, episode_returns):
        return self.scale * np.asarray(observations)[:, 0]

    def replay_elites(self) -> tuple[int, float]:
        return self.elites


def _buffer(size: int, n_steps: int, rule: RewardRule | None = None) -> RelabelingReplayBuffer:
    return RelabelingReplayBuffer(size, BOX, ACTION, device="cpu", rule=rule or ScaledX(), n_steps=n_steps, gamma=GAMMA)


def _fill(buffer: RelabelingReplayBuffer, episodes: list[tuple[list[float], bool]]) -> None:
    """Episodes of env reward x per step; each ends terminal, or truncated (TimeLimit) where its flag says so."""
    for k, (xs, truncated) in enumerate(episodes):
        for t, x in enumerate(xs):
            obs, last = np.array([[x, k]], dtype=np.float32), t == len(xs) - 1
            info = {"TimeLimit.truncated": last and truncated}
            buffer.add(obs, obs + [[10.0, 0.0]], np.zeros((1, 1), np.float32), np.array([x]), np.array([last]), [info])


def _columns(samples) -> dict[str, np.ndarray]:
    out = {name: getattr(samples, name).numpy() for name in ("observations", "next_observations", "rewards", "dones")}
    out["discounts"] = None if samples.discounts is None else samples.discounts.numpy()
    return out


# Episodes: A = x 1, 2, 3, 4 (terminal), B = x 5, 6 (truncated), C = x 7 (terminal); n = 3, gamma = 0.5.
EPISODES = [([1.0, 2.0, 3.0, 4.0], False), ([5.0, 6.0], True), ([7.0], False)]
# row -> (sum_j gamma^j x_{i+j} over the steps summed, gamma^steps, next x of the last step summed, done)
BY_HAND = {
    0: (1 + 0.5 * 2 + 0.25 * 3, 0.125, 13.0, 0.0),  # three steps, no end among them: bootstrap with gamma^3
    1: (2 + 0.5 * 3 + 0.25 * 4, 0.125, 14.0, 1.0),  # the third step ends the episode
    2: (3 + 0.5 * 4, 0.25, 14.0, 1.0),  # the episode ends after two steps
    3: (4.0, 0.5, 14.0, 1.0),
    4: (5 + 0.5 * 6, 0.25, 16.0, 0.0),  # ends truncated: not done, the target bootstraps from 16 with gamma^2
    5: (6.0, 0.5, 16.0, 0.0),
    6: (7.0, 0.5, 17.0, 1.0),
}


def test_n_step_returns_of_the_relabelled_rewards_by_hand():
    buffer = _buffer(16, n_steps=3)
    _fill(buffer, EPISODES)
    np.testing.assert_array_equal(buffer.rewards[:7, 0], -100.0)  # what was written; the returns below never sum it
    rows = np.arange(7)
    got = _columns(buffer._get_samples(rows))
    np.testing.assert_allclose(got["rewards"][:, 0], [BY_HAND[i][0] for i in rows])
    np.testing.assert_allclose(got["discounts"][:, 0], [BY_HAND[i][1] for i in rows])
    np.testing.assert_allclose(got["next_observations"][:, 0], [BY_HAND[i][2] for i in rows])
    np.testing.assert_array_equal(got["dones"][:, 0], [BY_HAND[i][3] for i in rows])
    np.testing.assert_array_equal(got["observations"][:, 0], [1, 2, 3, 4, 5, 6, 7])  # the first step's own
    buffer.rule.scale = 2.0  # the reward model changed: the n-step return is the sum of its current rewards
    np.testing.assert_allclose(buffer._get_samples(rows).rewards.numpy()[:, 0], [2 * BY_HAND[i][0] for i in rows])


def test_n_steps_one_samples_one_step_relabelled_transitions():
    buffer = _buffer(16, n_steps=1)
    _fill(buffer, EPISODES)
    got = _columns(buffer._get_samples(np.arange(7)))
    assert got["discounts"] is None  # SB3's algorithms then bootstrap with their own gamma, as before n-step
    np.testing.assert_array_equal(got["rewards"][:, 0], [1, 2, 3, 4, 5, 6, 7])
    np.testing.assert_array_equal(got["next_observations"][:, 0], [11, 12, 13, 14, 15, 16, 17])
    np.testing.assert_array_equal(got["dones"][:, 0], [0, 0, 0, 1, 0, 0, 1])  # the truncated end is not done


def test_n_step_runs_wrap_around_a_full_buffer_and_stop_at_the_overwritten_episodes_tail():
    buffer = _buffer(5, n_steps=3)
    # A (x 1, 2, 3) takes rows 0-2; B (x 4, 5, 6, 7) rows 3, 4, 0, 1: row 2 keeps A's last step, pos is 2.
    _fill(buffer, [([1.0, 2.0, 3.0], False), ([4.0, 5.0, 6.0, 7.0], False)])
    assert buffer.full and buffer.pos == 2
    got = _columns(buffer._get_samples(np.array([3, 4, 0, 1, 2])))
    np.testing.assert_allclose(got["rewards"][:, 0], [4 + 0.5 * 5 + 0.25 * 6, 5 + 0.5 * 6 + 0.25 * 7, 6 + 0.5 * 7, 7, 3])
    np.testing.assert_allclose(got["discounts"][:, 0], [0.125, 0.125, 0.25, 0.5, 0.5])
    np.testing.assert_array_equal(got["next_observations"][:, 0], [16, 17, 17, 17, 13])
    np.testing.assert_array_equal(got["dones"][:, 0], [0, 1, 1, 1, 1])


def test_elite_samples_take_their_n_step_return_within_the_stored_elite_episode():
    rule = ScaledX(elites=(1, 0.5))
    buffer = _buffer(16, n_steps=3, rule=rule)
    _fill(buffer, EPISODES)  # returns 10, 11 and 7: the heap keeps B (x 5, 6, truncated)
    assert [item[0] for item in buffer.elites] == [11.0]
    np.random.seed(0)
    got = _columns(buffer.sample(40))
    by_x = {x: BY_HAND[x - 1] for x in range(1, 8)}  # row i holds x = i + 1
    for half in (slice(0, 20), slice(20, 40)):
        xs = got["observations"][half, 0].astype(int)
        np.testing.assert_allclose(got["rewards"][half, 0], [by_x[x][0] for x in xs])
        np.testing.assert_allclose(got["discounts"][half, 0], [by_x[x][1] for x in xs])
        np.testing.assert_allclose(got["next_observations"][half, 0], [by_x[x][2] for x in xs])
        np.testing.assert_array_equal(got["dones"][half, 0], [by_x[x][3] for x in xs])
    assert set(got["observations"][20:, 0]) == {5.0, 6.0}  # the elite half, both of its steps drawn


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"n_steps": 0}, r"n_steps=0: RelabelingReplayBuffer expects an integer >= 1"),
        ({"n_steps": 2.0}, r"n_steps=2.0: RelabelingReplayBuffer expects an integer >= 1"),
        ({"gamma": 1.5}, r"gamma=1.5: RelabelingReplayBuffer expects a discount in \[0, 1\]"),
        (
            {"n_steps": 2, "optimize_memory_usage": True, "handle_timeout_termination": False},
            r"n_steps=2 with optimize_memory_usage=True",
        ),
    ],
)
def test_bad_n_step_settings_are_one_clear_error(kwargs, message):
    with pytest.raises(ValueError, match=message):
        RelabelingReplayBuffer(8, BOX, ACTION, device="cpu", rule=ScaledX(), **kwargs)


def test_dqn_with_a_rule_trains_on_n_step_returns_without_sb3s_warning(tmp_path, monkeypatch):
    calls = []
    n_step_samples = RelabelingReplayBuffer._n_step_samples

    def counted(self, samples, batch_inds, env):
        calls.append(self.n_steps)
        return n_step_samples(self, samples, batch_inds, env)

    monkeypatch.setattr(RelabelingReplayBuffer, "_n_step_samples", counted)
    argv = ["--algo", "dqn", "--credit", "ircr", "--env", "bsuite:umbrella_length/3", "--max-episodes", "30"]
    hyperparams = ["--hyperparams", "env_kwargs={integer_observations: true}", "n_steps=3"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        summary = train([*argv, *hyperparams, "--log-dir", str(tmp_path), "--no-progress"])
    assert summary["episodes_run"] == 30
    assert not [str(w.message) for w in caught if "n_steps" in str(w.message)]  # SB3 would say it is ignored
    assert calls and set(calls) == {3}  # every FIFO batch the learner drew was n-step
    assert "\n  n_steps: 3\n" in (tmp_path / "config.yml").read_text()


def test_sampling_leaves_no_trace_in_the_buffer():
    buffer = _buffer(16, n_steps=3)
    _fill(buffer, EPISODES)
    before = (buffer.dones.copy(), buffer.timeouts.copy(), buffer.rewards.copy())
    np.random.seed(0)
    buffer.sample(8)
    for kept, now in zip(before, (buffer.dones, buffer.timeouts, buffer.rewards)):
        np.testing.assert_array_equal(kept, now)
