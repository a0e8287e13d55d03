"""Reward rules as their papers use them: replay relabelling (RRD, IRCR), IRCR's FIFO + heap scale, RRD's two losses
against the reference formula, and a sign-flip test per reward rule (a negated reward model learns worse)."""

from __future__ import annotations

import numpy as np
import pytest
import torch as th
from gymnasium import spaces
from scipy import stats

from algorithms.common.credit_slot import CreditSlot
from algorithms.sb3.buffers import FIT_WINDOW, RelabelingReplayBuffer, pooled_correlation
from algorithms.tabular.q_learning import QLearningConfig
from algorithms.tabular.runner import ARM
from tests.helpers import DecideFirst, make_batch
from tests.test_tabular_credit import FlippedRule, _first_decision_correct_rate  # FlippedRule: rewards negated
from vcbm_gym.credit.base import EpisodeBatch, RewardRule
from vcbm_gym.credit.ircr import IRCRRule
from vcbm_gym.credit.rrd import rrd_loss

BOX = spaces.Box(-10.0, 10.0, (2,), np.float32)
ACTION = spaces.Box(-1.0, 1.0, (1,), np.float32)


class ScaledFirstFeature(RewardRule):
    """r(s, a, s') = scale * s[0], per transition; `scale` stands for a reward model that changes as it learns."""

    name = "scaled_first_feature"

    def __init__(self, scale: float = 1.0, markovian: bool = True, elites: tuple[int, float] = (0, 0.0)) -> None:
        self.scale, self.markovian, self.elites = scale, markovian, elites

    def rewards(self, batch: EpisodeBatch) -> np.ndarray:
        return np.where(batch.mask, self.scale * batch.observations[..., 0], 0.0)

    def transition_rewards(self, observations, actions, next_observations, episode_returns):
        return self.scale * np.asarray(observations)[:, 0] if self.markovian else None

    def replay_elites(self) -> tuple[int, float]:
        return self.elites


def _fill(buffer: RelabelingReplayBuffer, episodes: list[list[float]]) -> None:
    """Episodes of observations [x, episode index]; env reward x on every step; the last step terminal."""
    for k, xs in enumerate(episodes):
        for t, x in enumerate(xs):
            obs = np.array([[x, k]], dtype=np.float32)
            done = np.array([t == len(xs) - 1])
            buffer.add(obs, obs + 1, np.zeros((1, 1), np.float32), np.array([x]), done, [{}])


def test_an_episode_enters_the_buffer_at_its_end_with_the_rules_rewards():
    rule = ScaledFirstFeature(scale=2.0)
    buffer = RelabelingReplayBuffer(16, BOX, ACTION, device="cpu", rule=rule)
    _fill(buffer, [[1.0, 3.0]])
    assert buffer.size() == 2
    np.testing.assert_allclose(buffer.rewards[:2, 0], [2.0, 6.0])  # written with the rule's rewards, not the env's
    np.testing.assert_allclose(buffer.episode_returns[:2], [4.0, 4.0])  # the env's return, for IRCR's relabel
    _fill(buffer, [[5.0]])
    assert buffer.size() == 3 and buffer.rewards[2, 0] == 10.0


def test_a_stored_reward_changes_when_the_reward_model_changes():
    rule = ScaledFirstFeature(scale=1.0)
    buffer = RelabelingReplayBuffer(16, BOX, ACTION, device="cpu", rule=rule)
    _fill(buffer, [[1.0, 2.0, 3.0], [-4.0]])
    indices = np.array([0, 1, 2, 3])
    np.testing.assert_allclose(buffer._get_samples(indices).rewards.numpy()[:, 0], [1.0, 2.0, 3.0, -4.0])
    rule.scale = -0.5  # the model learned: every sampled reward is its current one
    np.testing.assert_allclose(buffer._get_samples(indices).rewards.numpy()[:, 0], [-0.5, -1.0, -1.5, 2.0])
    np.testing.assert_allclose(buffer.rewards[:4, 0], [1.0, 2.0, 3.0, -4.0])  # what was written stays written


def _fill_withheld(buffer: RelabelingReplayBuffer, episodes: list[list[float]], withheld: list[list[float]]) -> None:
    """As _fill, each step's info carrying the dense reward DelayedReward withheld."""
    for k, (xs, ws) in enumerate(zip(episodes, withheld)):
        for t, (x, w) in enumerate(zip(xs, ws)):
            obs = np.array([[x, k]], dtype=np.float32)
            info = {"withheld_reward": w}
            buffer.add(obs, obs + 1, np.zeros((1, 1), np.float32), np.array([0.0]), np.array([t == len(xs) - 1]), [info])


def test_pooled_correlation_by_hand():
    assert pooled_correlation(
        [(np.array([1.0, 2.0]), np.array([2.0, 4.0])), (np.array([3.0]), np.array([6.0]))]
    ) == pytest.approx(1.0)
    # x = (0, 1, 2, 3), y = (0, 1, 3, 2): cov 1.0, var 1.25 each -> r = 0.8
    assert pooled_correlation(
        [(np.array([0.0, 1.0]), np.array([0.0, 1.0])), (np.array([2.0, 3.0]), np.array([3.0, 2.0]))]
    ) == pytest.approx(0.8)
    assert np.isnan(pooled_correlation([(np.array([1.0, 1.0]), np.array([0.0, 5.0]))]))  # a constant reward has no r


@pytest.mark.parametrize("scale", [2.0, -2.0])
def test_the_buffer_scores_the_rules_rewards_against_the_withheld_ones(scale):
    rule = ScaledFirstFeature(scale=scale)  # r = scale * x, the withheld dense reward x + small noise
    buffer = RelabelingReplayBuffer(64, BOX, ACTION, device="cpu", rule=rule)
    episodes = [[1.0, 2.0, 3.0], [-1.0, 0.5], [4.0]]
    withheld = [[1.1, 2.0, 2.9], [-1.0, 0.4], [4.2]]
    _fill_withheld(buffer, episodes, withheld)
    assert [n for n, _ in buffer.reward_fit] == [3, 5, 6]  # one point per finished episode, at the transitions stored
    assert np.isfinite(buffer.reward_fit[0][1])
    x, w = np.concatenate(episodes), np.concatenate(withheld)
    assert buffer.reward_fit[-1][1] == pytest.approx(np.sign(scale) * np.corrcoef(x, w)[0, 1])  # pooled over the window
    assert np.sign(buffer.reward_fit[-1][1]) == np.sign(scale)
    _fill(buffer, [[1.0]])  # an env that withholds nothing adds no point
    assert len(buffer.reward_fit) == 3


def test_the_fit_window_keeps_only_the_last_episodes():
    buffer = RelabelingReplayBuffer(256, BOX, ACTION, device="cpu", rule=ScaledFirstFeature(scale=1.0))
    _fill_withheld(buffer, [[1.0, 2.0]] * FIT_WINDOW, [[-1.0, -2.0]] * FIT_WINDOW)  # anti-correlated episodes
    assert buffer.reward_fit[-1][1] == pytest.approx(-1.0)
    _fill_withheld(buffer, [[1.0, 2.0]] * FIT_WINDOW, [[1.0, 2.0]] * FIT_WINDOW)  # then a window of correlated ones
    assert buffer.reward_fit[-1][1] == pytest.approx(1.0)


def test_a_rule_whose_rewards_need_the_whole_episode_keeps_what_it_wrote():
    rule = ScaledFirstFeature(scale=1.0, markovian=False)
    buffer = RelabelingReplayBuffer(16, BOX, ACTION, device="cpu", rule=rule)
    _fill(buffer, [[1.0, 2.0]])
    rule.scale = 7.0
    np.testing.assert_allclose(buffer._get_samples(np.array([0, 1])).rewards.numpy()[:, 0], [1.0, 2.0])


def test_elite_episodes_fill_their_share_of_every_batch():
    rule = ScaledFirstFeature(scale=1.0, elites=(2, 0.5))
    buffer = RelabelingReplayBuffer(64, BOX, ACTION, device="cpu", rule=rule)
    # returns 1, 9, 4, 7 (one-step episodes of x = the return): the two best are 9 and 7
    _fill(buffer, [[1.0], [9.0], [4.0], [7.0]])
    assert sorted(e[0] for e in buffer.elites) == [7.0, 9.0]
    th.manual_seed(0)
    np.random.seed(0)
    batch = buffer.sample(10)
    xs = batch.observations.numpy()[:, 0]
    assert len(xs) == 10 and set(xs[5:]) <= {7.0, 9.0}  # the second half from the heap
    np.testing.assert_allclose(batch.rewards.numpy()[:, 0], xs)  # elite transitions relabelled too


def test_elite_draws_follow_the_heap_as_it_changes_and_keep_each_transition_whole():
    """Observations [x, episode index], next observation the same + 1: a draw that mixed two episodes' rows, or one
    from an episode the heap has since dropped, would show here."""
    rule = ScaledFirstFeature(scale=1.0, elites=(2, 0.5))
    buffer = RelabelingReplayBuffer(64, BOX, ACTION, device="cpu", rule=rule)
    _fill(buffer, [[1.0, 2.0], [3.0, 4.0, 5.0]])  # returns 3 and 12: both elite
    np.random.seed(0)

    def elite_half() -> tuple[np.ndarray, np.ndarray]:
        batch = buffer.sample(200)
        return batch.observations.numpy()[100:], batch.next_observations.numpy()[100:]

    obs, next_obs = elite_half()
    assert set(map(tuple, obs)) == {(1.0, 0.0), (2.0, 0.0), (3.0, 1.0), (4.0, 1.0), (5.0, 1.0)}
    np.testing.assert_array_equal(next_obs, obs + 1)
    _fill(buffer, [[], [], [6.0, 7.0]])  # episode 2, return 13, replaces episode 0 (return 3) in the heap
    obs, next_obs = elite_half()
    assert set(map(tuple, obs)) == {(3.0, 1.0), (4.0, 1.0), (5.0, 1.0), (6.0, 2.0), (7.0, 2.0)}
    np.testing.assert_array_equal(next_obs, obs + 1)


def test_ircr_scale_spans_the_transition_fifo_and_the_best_episodes_by_hand():
    rule = IRCRRule(buffer_transitions=10, top_episodes=2)

    def episode(ret: float, length: int) -> EpisodeBatch:
        rewards = np.zeros((1, length))
        rewards[0, -1] = ret
        return make_batch(rewards)

    for ret in (5.0, 1.0, 3.0):  # 4 steps each: 12 > 10 transitions, so the FIFO drops the first (G = 5)
        rule.observe(episode(ret, 4))
    assert list(rule.recent) == [1.0, 3.0] and rule.best == [3.0, 5.0]
    assert rule.scale() == (1.0, 5.0)  # 5 is gone from the FIFO but kept by the heap
    relabelled = rule.transition_rewards(None, None, None, np.array([3.0, 5.0, 1.0]))
    np.testing.assert_allclose(relabelled, [0.5, 1.0, 0.0])  # (G - 1) / (5 - 1)
    rule.observe(episode(-2.0, 4))  # the FIFO drops G = 1 and takes -2
    assert list(rule.recent) == [3.0, -2.0] and rule.scale() == (-2.0, 5.0)
    np.testing.assert_allclose(rule.transition_rewards(None, None, None, np.array([3.0])), [5.0 / 7.0])
    rewards = rule.rewards(episode(3.0, 2))
    np.testing.assert_allclose(rewards, [[5.0 / 7.0, 5.0 / 7.0]])  # the guidance reward on every step
    assert rule.replay_elites() == (2, 0.5)


# Two episodes: T = 8 with K = 4 sampled rewards, and T = 3 with all 3 (n = T: no correction).
STEP_REWARDS = np.array([[0.5, 1.5, -1.0, 2.0], [1.0, 0.0, 2.0, 0.0]])
SAMPLE_MASK = np.array([[1, 1, 1, 1], [1, 1, 1, 0]], dtype=bool)
LENGTHS, RETURNS = np.array([8.0, 3.0]), np.array([5.0, 4.5])


def _reference_loss(bias_correction: bool) -> float:
    """The reference code's per-step form, episode by episode: (mean_K r - G / T)^2, minus Var_unbiased(r_K) (1 - K/T) / K."""
    losses = []
    for r, m, t, g in zip(STEP_REWARDS, SAMPLE_MASK, LENGTHS, RETURNS):
        picked = r[m]
        k = len(picked)
        loss = (picked.mean() - g / t) ** 2
        if bias_correction and k > 1:
            loss -= picked.var(ddof=1) * (1 - k / t) / k
        losses.append(loss)
    return float(np.mean(losses))


@pytest.mark.parametrize("bias_correction", [False, True])
def test_rrd_losses_match_the_reference_formula_by_hand(bias_correction):
    loss, _, _, grad = rrd_loss(STEP_REWARDS, SAMPLE_MASK, LENGTHS, RETURNS, bias_correction, per_step=True)
    assert loss == pytest.approx(_reference_loss(bias_correction), rel=1e-12)
    # by hand for episode 1: (mean 0.75 - 5/8)^2 = 0.015625; var(ddof=1) of [0.5, 1.5, -1, 2] = 5.25 / 3 = 1.75, x (1 - 4/8) / 4
    # episode 2: (mean 1 - 4.5/3)^2 = 0.25, no correction (n = T)
    expected = (0.015625 + 0.25) / 2 - (1.75 * 0.5 / 4 / 2 if bias_correction else 0.0)
    assert loss == pytest.approx(expected, rel=1e-12)
    # the gradient is the loss's: a finite difference on one sampled reward
    for k in range(4):
        bumped = STEP_REWARDS.copy()
        bumped[0, k] += 1e-6
        again = rrd_loss(bumped, SAMPLE_MASK, LENGTHS, RETURNS, bias_correction, per_step=True)[0]
        assert grad[0, k] == pytest.approx((again - loss) / 1e-6, rel=1e-3, abs=1e-6)
    # the return-units form is each episode's term times T^2
    full = rrd_loss(STEP_REWARDS[:1], SAMPLE_MASK[:1], LENGTHS[:1], RETURNS[:1], bias_correction)[0]
    per_step = rrd_loss(STEP_REWARDS[:1], SAMPLE_MASK[:1], LENGTHS[:1], RETURNS[:1], bias_correction, per_step=True)[0]
    assert full == pytest.approx(per_step * 64.0, rel=1e-12)


RULE_KWARGS = {
    "rudder": {},
    "rrd": {"min_buffer_episodes": 8, "train_steps": 4, "subsequence_size": 2},
    "ircr": {},
    "vcbm_bookmark": {"warmup_transitions": 40},
}


def _correct_rate(rule: RewardRule, seed: int, episodes: int) -> float:
    return _first_decision_correct_rate(rule, seed, episodes, DecideFirst(), QLearningConfig(alpha=0.1, epsilon=0.1))


@pytest.mark.parametrize("name", list(RULE_KWARGS))
def test_a_negated_reward_model_learns_worse(name):
    # Seeds 0-5, 300 episodes of a 4-step task whose first action decides the return: td on each reward rule's rewards
    # against the same rule with its rewards negated. A one-sided Welch t-test on the seeds' rates (their own spread,
    # no guessed variance) at the 1% level.
    env = DecideFirst()
    fit = ARM.credit_fit("td")
    real, flipped = [], []
    for seed in range(6):
        slot = CreditSlot(name, {name: RULE_KWARGS[name]})
        real.append(_correct_rate(slot.build(fit, env, seed), seed, 300))
        flipped.append(_correct_rate(FlippedRule(slot.build(fit, env, seed)), seed, 300))
    result = stats.ttest_ind(real, flipped, equal_var=False, alternative="greater")
    assert result.pvalue < 0.01, (real, flipped)
    assert np.mean(real) > 0.5 > np.mean(flipped), (real, flipped)


@pytest.mark.parametrize(("algo", "credit"), [("sac", "rrd"), ("sac", "ircr"), ("td3", "rrd"), ("sac", "none")])
def test_sac_and_td3_train_on_episodic_mujoco_with_a_reward_rule(tmp_path, algo, credit):
    pytest.importorskip("mujoco")
    from algorithms.train import run as train

    argv = ["--algo", algo, "--credit", credit, "--env", "EpisodicHopper-v5", "--no-progress", "--log-dir", str(tmp_path)]
    summary = train([*argv, "--hyperparams", "max_steps=1200", "learning_starts=1000", "batch_size=32"])
    assert summary["timesteps"] == 1200 and summary["credit"] == credit and summary["episodes_run"] > 0
    if credit == "rrd":  # the reward model trained once per observed transition, from the start (min 4 episodes)
        assert summary["credit_summary"]["train_steps"] > 0 and summary["credit_summary"]["n_features"] == 11 + 3 + 11
    if credit != "none":  # EpisodicHopper's DelayedReward reports the dense reward it withheld: the rule's fit
        assert -1.0 <= summary["reward_fit_corr_last"] <= 1.0


def test_an_advantage_rule_is_refused_by_a_replay_learner_in_one_line(tmp_path):
    from algorithms.common.errors import VcbmGymError
    from algorithms.train import run as train

    with pytest.raises(VcbmGymError, match="credit rule 'loo' emits advantages, and 'sac' takes rewards"):
        train(["--algo", "sac", "--env", "Pendulum-v1", "--hyperparams", "credit=loo", "--log-dir", str(tmp_path / "r")])
    assert not (tmp_path / "r").exists()
