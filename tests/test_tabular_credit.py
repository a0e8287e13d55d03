"""The tabular arm's side of the credit slot: `--algo td|mc --credit RULE` learn from a reward rule's rewards."""

from __future__ import annotations

import json

import gymnasium as gym
import numpy as np
import pytest
import yaml
from gymnasium import spaces
from scipy import stats

import vcbm_gym  # noqa: F401  (registers WatchRepair-v0)
from algorithms.common.credit_slot import CreditSlot
from algorithms.common.errors import VcbmGymError
from algorithms.tabular.credit import TABULAR_BATCH_PROVIDES, AgentSpacesView
from algorithms.tabular.mc import MonteCarloAgent, MonteCarloConfig
from algorithms.tabular.q_learning import QLearningAgent, QLearningConfig
from algorithms.tabular.runner import ARM
from algorithms.train import run as train
from vcbm_gym.credit.base import CreditRule, EpisodeBatch, RewardRule, unmet_needs
from vcbm_gym.credit.registry import RULES

SPACE = spaces.MultiDiscrete([4, 4])
ACTIONS = spaces.Discrete(2)


class FixedRule(RewardRule):
    """Rewards [4, 1, 1] on every 3-step episode (times `sign`); records the batches it was shown, in call order."""

    name = "fixed"

    def __init__(self, sign: float = 1.0) -> None:
        self.sign = sign
        self.calls: list[tuple[str, EpisodeBatch]] = []

    def observe(self, batch: EpisodeBatch) -> None:
        self.calls.append(("observe", batch))

    def rewards(self, batch: EpisodeBatch) -> np.ndarray:
        self.calls.append(("rewards", batch))
        return self.sign * np.where(batch.mask, [[4.0, 1.0, 1.0]], 0.0)


class FlippedRule(RewardRule):
    """`inner` with the sign of its rewards flipped: a negated reward model, whose credit points the wrong way."""

    name = "flipped"

    def __init__(self, inner: CreditRule) -> None:
        self.inner = inner

    def observe(self, batch: EpisodeBatch) -> None:
        self.inner.observe(batch)

    def rewards(self, batch: EpisodeBatch) -> np.ndarray:
        return -self.inner.rewards(batch)


STATES = [np.array([0, 0]), np.array([1, 1]), np.array([1, 2]), np.array([1, 3])]
REWARDS = [0.0, 0.0, 6.0]  # G = 6; the rule's rewards r' = [4, 1, 1] (a redistribution of it)


def play_episode(agent) -> None:
    for t, reward in enumerate(REWARDS):
        agent.observe(STATES[t], 0, reward, STATES[t + 1], t == 2)
    agent.end_episode()


def test_q_learning_replays_the_episode_on_the_redistributed_rewards_by_hand():
    rule = FixedRule()
    agent = QLearningAgent(SPACE, ACTIONS, QLearningConfig(alpha=0.5), seed=0, credit=rule)
    agent.observe(STATES[0], 0, 0.0, STATES[1], False)
    assert agent.q[(0, 0)][0] == 0.0  # nothing learned before the episode ends
    agent.observe(STATES[1], 0, 0.0, STATES[2], False)
    agent.observe(STATES[2], 0, 6.0, STATES[3], True)
    agent.end_episode()
    # forward replay of r' = [4, 1, 1], alpha 0.5, gamma 1, Q from 0:
    # Q(s0) = 0.5 (4 + max Q(s1) = 0) = 2; Q(s1) = 0.5 (1 + 0) = 0.5; Q(s2) = 0.5 (1 + 0, terminal) = 0.5
    assert [agent.q[(0, 0)][0], agent.q[(1, 1)][0], agent.q[(1, 2)][0]] == [2.0, 0.5, 0.5]
    play_episode(agent)
    # Q(s0) = 2 + 0.5 (4 + 0.5 - 2) = 3.25; Q(s1) = 0.5 + 0.5 (1 + 0.5 - 0.5) = 1; Q(s2) = 0.5 + 0.5 (1 - 0.5) = 0.75
    assert [agent.q[(0, 0)][0], agent.q[(1, 1)][0], agent.q[(1, 2)][0]] == [3.25, 1.0, 0.75]
    # the rule gave each episode's rewards first (from what it had learned before it), then learned from it
    assert [kind for kind, _ in rule.calls] == ["rewards", "observe"] * 2
    batch = rule.calls[0][1]
    np.testing.assert_array_equal(batch.observations[0], STATES[:3])
    np.testing.assert_array_equal(batch.extras["next_observations"][0], STATES[1:])
    np.testing.assert_array_equal(batch.actions, [[0, 0, 0]])
    np.testing.assert_array_equal(batch.rewards, [REWARDS])
    assert batch.mask.all() and batch is rule.calls[1][1]


def test_q_learning_without_a_rule_stays_online():
    agent = QLearningAgent(SPACE, ACTIONS, QLearningConfig(alpha=0.5), seed=0)
    agent.observe(STATES[0], 0, 0.0, STATES[1], False)
    agent.observe(STATES[1], 0, 0.0, STATES[2], False)
    agent.observe(STATES[2], 0, 6.0, STATES[3], True)
    assert [agent.q[(0, 0)][0], agent.q[(1, 1)][0], agent.q[(1, 2)][0]] == [0.0, 0.0, 3.0]  # before end_episode
    agent.end_episode()


@pytest.mark.parametrize(("rule", "target"), [(None, 6.0), (FixedRule(), 4.0), (FixedRule(sign=-1.0), -4.0)])
def test_monte_carlo_target_is_the_first_redistributed_reward_by_hand(rule, target):
    # no rule: the return G = 6; the rule's rewards [4, 1, 1]: r'_0 = 4; negated: -4
    agent = MonteCarloAgent(SPACE, ACTIONS, MonteCarloConfig(alpha=0.5, q_init=10.0), seed=0, credit=rule)
    assert agent.act(STATES[0]) in (0, 1)
    play_episode(agent)
    assert agent.q[(0, 0)][0] == 10.0 + 0.5 * (target - 10.0)


def test_the_tabular_batch_declares_what_it_fills():
    rule = FixedRule()
    agent = QLearningAgent(SPACE, ACTIONS, QLearningConfig(), seed=0, credit=rule)
    play_episode(agent)
    filled = rule.calls[0][1]
    for need in TABULAR_BATCH_PROVIDES:
        if need.startswith("extras["):
            assert need[len("extras['") : -2] in filled.extras
        else:
            assert getattr(filled, need) is not None
    # every registered rule is either usable here or refused by its declared needs (the same declaration the LLM arm reads)
    usable = {name for name in RULES if not unmet_needs(_rule_class(name).batch_needs, set(TABULAR_BATCH_PROVIDES))}
    assert usable == {"broadcast", "rudder", "vcbm_bookmark", "ircr", "rrd"}


def _rule_class(name: str):
    import importlib

    module, _, cls = RULES[name].partition(":")
    return getattr(importlib.import_module(module), cls)


@pytest.mark.parametrize(("algo", "credit"), [("td", "rudder"), ("mc", "vcbm_bookmark")])
def test_train_runs_with_a_rule_and_records_it(tmp_path, algo, credit):
    argv = ["--algo", algo, "--credit", credit, "--env", "WatchRepair-v0", "--max-episodes", "40"]
    summary = train([*argv, "--log-dir", str(tmp_path), "--no-progress"])
    record = yaml.safe_load((tmp_path / "config.yml").read_text())
    assert record["hyperparams"]["credit"] == credit and record["hyperparams"]["credit_kwargs"] == {}
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert on_disk["credit"] == credit == summary["credit"] and on_disk["episodes_run"] == 40
    events = list(tmp_path.glob("events.out.tfevents.*"))
    assert events and b"credit/redistributed_reward_t0" in b"".join(p.read_bytes() for p in events)


def test_without_credit_td_records_none(tmp_path):
    train(["--algo", "td", "--max-episodes", "2", "--log-dir", str(tmp_path), "--no-progress"])
    assert yaml.safe_load((tmp_path / "config.yml").read_text())["hyperparams"]["credit"] == "none"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--algo", "td", "--credit", "casi"], r"credit rule 'casi' needs extras\['coalition_values'\]"),
        (["--algo", "mc", "--credit", "vcbm_blend"], r"credit rule 'vcbm_blend' needs group_ids, turn_flags"),
        (["--algo", "td", "--hyperparams", "credit=loo"], r"credit rule 'loo' needs group_ids"),
        (
            ["--algo", "td", "--credit", "broadcast"],
            r"credit rule 'broadcast' emits advantages, and the tabular arm takes rewards",
        ),
        (["--algo", "vcbm", "--credit", "rudder"], r"algo 'vcbm' has no credit slot"),
        (["--algo", "td", "--credit", "bogus"], r"unknown credit rule 'bogus'"),
        (
            ["--algo", "td", "--credit", "vcbm_bookmark", "--hyperparams", "credit_kwargs={vcbm_bookmark: {advantage: given}}"],
            r"credit rule 'vcbm_bookmark' needs extras\['advantages'\]",
        ),
        (
            ["--algo", "td", "--credit", "vcbm_bookmark", "--hyperparams", "credit_kwargs={vcbm_bookmark: {alpha: 0.0}}"],
            r"credit rule 'vcbm_bookmark' .*alpha=0.0",
        ),
        (["--algo", "td", "--credit", "rudder", "--hyperparams", "credit_kwargs={alpha: 0.1}"], r"credit_kwargs\['alpha'\]"),
    ],
)
def test_a_rule_the_tabular_arm_cannot_run_is_refused_before_the_log_dir(tmp_path, argv, message):
    log_dir = tmp_path / "run"
    with pytest.raises(VcbmGymError, match=message):
        train([*argv, "--log-dir", str(log_dir), "--no-progress"])
    assert not log_dir.exists()


def test_refusal_is_one_error_line_and_nothing_on_disk(run_cli, tmp_path):
    done = run_cli("algorithms.train", "--algo", "td", "--credit", "casi", "--log-dir", "run")
    assert done.returncode == 2 and done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and "coalition_values" in lines[0]
    assert not (tmp_path / "run").exists()


def _first_decision_correct_rate(
    credit: CreditRule, seed: int, episodes: int, env: gym.Env | None = None, config: QLearningConfig | None = None
) -> float:
    """The runner's loop for td (on WatchRepair-v0 unless `env` is given): the rate of optimal first decisions over
    the second half."""
    env = gym.make("WatchRepair-v0") if env is None else env
    config = QLearningConfig(alpha=0.03) if config is None else config
    agent = QLearningAgent(env.observation_space, env.action_space, config, seed, credit=credit)
    correct = []
    obs, _ = env.reset(seed=seed)
    for episode in range(episodes):
        if episode:
            obs, _ = env.reset()
        done = False
        while not done:
            action = agent.act(obs)
            next_obs, reward, terminated, truncated, info = env.step(action)
            done = terminated or truncated
            agent.observe(obs, action, float(reward), next_obs, done)
            obs = next_obs
        agent.end_episode()
        correct.append(info["first_decision_optimal"])
    env.close()
    return float(np.mean(correct[episodes // 2 :]))


def _lower_bound(rates: list[float], confidence: float = 0.99) -> float:
    """One-sided lower confidence bound on the mean rate over seeds (Student t on the seeds' spread)."""
    rates_arr = np.asarray(rates)
    se = rates_arr.std(ddof=1) / np.sqrt(len(rates_arr))
    return float(rates_arr.mean() - stats.t.ppf(confidence, len(rates_arr) - 1) * se)


def test_td_with_vcbm_bookmark_learns_the_decision_and_a_flipped_sign_does_not():
    # Measured (1,000 episodes, td alpha 0.03, seeds 0-7, the rule's rewards before it observes each episode):
    # bookmark 0.52-0.95 correct over the second half (mean 0.77), one-sided 99% lower bound 0.59; the same rule's
    # rewards negated 0.30-0.53 (mean 0.45), bound 0.38. Chance is 0.5 (epsilon-greedy around a coin flip per brand).
    # Eight seeds: under CreditRule's order (credit, then observe) two of seeds 0-3 stay near chance at 1,000
    # episodes, and the bound over four seeds fell to 0.27; the bound uses only the seeds' spread, no guessed variance.
    env = gym.make("WatchRepair-v0")
    view = AgentSpacesView(env, env.observation_space, env.action_space)
    seeds, episodes = range(8), 1000
    fit = ARM.credit_fit("td")
    real = [_first_decision_correct_rate(CreditSlot("vcbm_bookmark").build(fit, view, s), s, episodes) for s in seeds]
    flipped = [
        _first_decision_correct_rate(FlippedRule(CreditSlot("vcbm_bookmark").build(fit, view, s)), s, episodes) for s in seeds
    ]
    assert _lower_bound(real) > 0.5, real
    assert not _lower_bound(flipped) > 0.5, flipped
