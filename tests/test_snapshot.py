"""The snapshot protocol (envs/snapshot.py): restored continuations are bit-identical, an outcome seed
redraws only what the episode has not revealed (independent draws with the law's conditional mean and
variance), a bad state is one line naming what was expected, and check_contract names an env that breaks it."""

from __future__ import annotations

import copy
import math
import pickle

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.wrappers import TimeLimit

import vcbm_gym  # noqa: F401 (registers the envs)
from envs import snapshot as snapshots
from envs.delayed_reward import DelayedReward
from envs.snapshot import EnvSnapshot, SnapshotError, SnapshotMixin, restore, snapshot
from envs.watch_repair import REPAIR, WatchRepairEnv, WatchRepairParams
from tests.doc_pages import DOCS, first_blocks, section
from vcbm_gym.contract import ContractError, check_contract, check_snapshot, same

pytest.importorskip("bsuite")

FAMILIES = (
    "WatchRepair-v0",
    "TextWatchRepair-v0",
    "TextWatchWorkshop-v0",
    "SetRetrieval-v0",
    "TextSetRetrieval-v0",
    "umbrella_length/9",
    "memory_len/3",
    "discounting_chain/2",
    "DelayedCartPole-v1",
    "DelayedAcrobot-v1",
    "DelayedMountainCar-v0",
    "DelayedPendulum-v1",
)
Z = 4.0  # two-sided tail 6e-5 per check under the null: fixed seeds, so a pass is reproducible anyway


def _one_line(excinfo) -> str:
    message = str(excinfo.value)
    assert "\n" not in message
    return message


def _continue(env: gym.Env, actions) -> list[tuple]:
    """Step `actions` until the episode ends: deep copies of the step results."""
    results = []
    for action in actions:
        results.append(copy.deepcopy(env.step(action)))
        if results[-1][2] or results[-1][3]:
            break
    return results


# Random strings name no tool: a text env is played with its tools' names, in a random order.
TOOL_ANSWERS = ("repair()", "skip()", "inspect()", "wait()", "standard()", "premium()", "c1, c4, c2, c7, c0")


def _sampler(env: gym.Env, seed: int):
    """Seeded random actions: the action space's own, or for a text env one of TOOL_ANSWERS."""
    rng = np.random.default_rng(seed)
    env.action_space.seed(seed)
    if isinstance(env.action_space, gym.spaces.Text):
        return lambda _obs=None: str(rng.choice(TOOL_ANSWERS))
    return lambda _obs=None: env.action_space.sample()


def _mid_episode(env_id: str, at: int, seed: int = 7, **kwargs):
    """gym.make(env_id), reset(seed), `at` seeded random steps; (env, snapshot, the next 60 random actions)."""
    env = gym.make(env_id, **kwargs)
    env.reset(seed=seed)
    sample = _sampler(env, seed)
    for _ in range(at):
        env.step(sample())
    return env, snapshot(env), [sample() for _ in range(60)]


# --- identity ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("env_id", FAMILIES)
def test_every_family_passes_the_contracts_snapshot_check(env_id):
    for seed in range(4):
        env = gym.make(env_id)
        check_snapshot(env, seed=seed, policy=_sampler(env, seed))
    assert check_contract(gym.make(env_id), seed=1, check_api=False).snapshot == "checked"


@pytest.mark.parametrize("at", [0, 3])
@pytest.mark.parametrize("env_id", FAMILIES)
def test_restoring_one_snapshot_twice_gives_two_identical_continuations(env_id, at):
    env, state, actions = _mid_episode(env_id, at=0 if "SetRetrieval" in env_id else at)
    first = _continue(env, actions) + [env.reset()]  # the next unseeded reset shows the generators' state
    restore(env, state)
    second = _continue(env, actions) + [env.reset()]
    restore(env, pickle.loads(pickle.dumps(state)))
    third = _continue(env, actions) + [env.reset()]
    assert same(first, second) and same(first, third) and len(first) >= 1


@pytest.mark.parametrize("env_id", FAMILIES)
def test_a_fresh_env_never_reset_continues_a_restored_episode(env_id):
    # gym.make's PassiveEnvChecker compares a reset's data with the first step's: a fresh env has no reset data
    env, state, actions = _mid_episode(env_id, at=0 if "SetRetrieval" in env_id else 2)
    original = _continue(env, actions)
    fresh = gym.make(env_id)
    restore(fresh, state)
    assert same(_continue(fresh, actions), original)


def test_a_restore_leaves_returned_observations_and_the_snapshot_alone():
    env, state, actions = _mid_episode("WatchRepair-v0", at=2)
    kept = _continue(env, actions[:3])
    restore(env, state)
    replay = _continue(env, actions[:3])
    replay[0][0][:] = -1  # a caller writing into an observation it got after the restore
    restore(env, state)
    assert same(_continue(env, actions[:3]), kept)


def test_delayed_envs_keep_the_time_limit_and_the_held_back_reward():
    # max_episode_steps=12: random CartPole play reaches the limit, so the TimeLimit counter matters
    env, state, actions = _mid_episode("DelayedCartPole-v1", at=0, seed=3, max_episode_steps=12)
    for _ in range(8):
        env.step(actions.pop(0))
    state = snapshot(env)
    assert pickle.loads(state.wrappers[0][1])["_pending"] == 8.0  # DelayedReward held eight 1s back
    first = _continue(env, actions)
    assert first[-1][3] and first[-1][1] == 12.0  # truncated at the limit, paid everything
    restore(env, state)
    assert same(_continue(env, actions), first)


@pytest.mark.parametrize(
    "mutation",
    ["TimeLimit's counter", "DelayedReward's pending reward", "the env's generator", "the env's own fields"],
)
def test_each_part_of_the_state_is_needed(monkeypatch, mutation):
    """Forgetting any one part of the state makes some continuation differ: the tests above can fail."""
    if mutation == "TimeLimit's counter":
        monkeypatch.setitem(snapshots.WRAPPER_FIELDS, TimeLimit, ())
    elif mutation == "DelayedReward's pending reward":
        monkeypatch.setattr(DelayedReward, "snapshot_fields", ("_episode", "_step"))
    elif mutation == "the env's generator":
        monkeypatch.setattr(snapshots, "GENERATOR_FIELDS", ())
    else:
        monkeypatch.setitem(snapshots.GYMNASIUM_ENV_FIELDS, gym.envs.classic_control.CartPoleEnv, ())
        monkeypatch.setattr(WatchRepairEnv, "snapshot_fields", ())
    broken = []
    for env_id, at, kwargs in (
        ("DelayedCartPole-v1", 8, {"max_episode_steps": 12}),
        ("WatchRepair-v0", 0, {}),  # before the decision, whose draws come from np_random
        ("WatchRepair-v0", 5, {}),
    ):
        env, state, actions = _mid_episode(env_id, at, seed=3, **kwargs)
        first = _continue(env, actions)
        restore(env, state)
        try:
            broken.append(not same(_continue(env, actions), first))
        except RuntimeError:  # e.g. WatchRepair's step after the end, with its clock not restored
            broken.append(True)
    assert any(broken), mutation


# --- fresh outcomes ----------------------------------------------------------------------------------------


def _assert_independent_draws(draws: np.ndarray, mean: float, variance: float, kappa4: float) -> None:
    """`draws` are i.i.d. with this mean, variance and fourth cumulant: each statistic within Z standard errors
    of its value under that law (the mean's SE sqrt(var / n); the sample variance's sqrt((kappa4 + 2 var^2) / n);
    the lag-1 correlation's 1 / sqrt(n) under independence)."""
    n = len(draws)
    assert abs(draws.mean() - mean) <= Z * math.sqrt(variance / n), (draws.mean(), mean)
    assert abs(draws.var(ddof=1) - variance) <= Z * math.sqrt((kappa4 + 2 * variance**2) / n), (draws.var(), variance)
    lag1 = np.corrcoef(draws[:-1], draws[1:])[0, 1]
    assert abs(lag1) <= Z / math.sqrt(n - 1), lag1


def _transport_law(params: WatchRepairParams, brand: int, counters: np.ndarray, steps_left: int, scale: float = 1.0):
    """Mean, variance and fourth cumulant of what a repaired watch's last step still pays after `counters`
    events with `steps_left` steps to go: price - transport - sum_j penalty_j (c_j + Binomial(steps_left, p_j))."""
    pen, p = np.asarray(params.counter_penalties), np.asarray(params.counter_probs)
    mean = params.price[brand] - params.transport_mean[brand] - pen @ (counters + steps_left * p)
    variance = params.transport_sd**2 + np.sum(pen**2 * steps_left * p * (1 - p))
    kappa4 = np.sum(pen**4 * steps_left * p * (1 - p) * (1 - 6 * p * (1 - p)))  # a normal's is 0
    return scale * mean, scale**2 * variance, scale**4 * kappa4


def _seeded_returns(env: gym.Env, state, actions, n: int) -> np.ndarray:
    out = []
    for outcome_seed in range(n):
        restore(env, state, outcome_seed=outcome_seed)
        out.append(sum(result[1] for result in _continue(env, actions)))
    return np.array(out)


@pytest.mark.parametrize("drop_penalty", [7.0, 0.5])  # the paper's; one where the transport cost's noise dominates
def test_watch_repair_outcome_seeds_redraw_the_unseen_rest_of_the_episode(drop_penalty):
    env = gym.make("WatchRepair-v0", counter_penalties=(0.1, drop_penalty))
    # a state whose drops so far (3 or more by step 25, where 1.25 are expected) are far from their mean, so a
    # redraw of the past events too would move the mean by >= 1.75 * drop_penalty, past the tolerance (4 SE)
    for seed in range(200):
        obs, _ = env.reset(seed=seed, options={"brand": 1})
        for _ in range(25):
            obs, *_ = env.step(REPAIR)
        if obs[2] >= 3:
            break
    state = snapshot(env)
    returns = _seeded_returns(env, state, [1] * 25, n=400)
    _assert_independent_draws(returns, *_transport_law(env.unwrapped.params, 1, obs[1:3], 25))


def test_text_watch_repair_outcome_seeds_keep_the_decision_and_redraw_the_transport():
    env = gym.make("TextWatchRepair-v0")
    env.reset(seed=4, options={"brand": 2})
    env.step("repair()")
    env.step("wait()")
    inner = env.unwrapped
    counters, t, paid = inner._state[0, 1:3].copy(), int(inner._state[0, 4]), inner._reward  # -repair cost
    state = snapshot(env)
    returns = _seeded_returns(env, state, ["wait()"] * 10, n=400)
    mean, variance, kappa4 = _transport_law(inner.params, 2, counters, inner.params.horizon - t, inner.reward_scale)
    _assert_independent_draws(returns, mean + inner.reward_scale * paid, variance, kappa4)


def test_text_watch_workshop_outcome_seeds_draw_the_whole_outcome_at_any_turn():
    env = gym.make("TextWatchWorkshop-v0")
    env.reset(seed=5, options={"brand": 1})
    answer = "repair() standard()"  # each station takes the last of its own tools named
    for _ in range(3):
        env.step(answer)
    state = snapshot(env)
    returns = _seeded_returns(env, state, [answer] * 10, n=400)
    params, scale = env.unwrapped.params, env.unwrapped.reward_scale
    mean, variance, kappa4 = _transport_law(params, 1, np.zeros(2), params.horizon, scale)
    cost_mean, cost_sd = params.repair_cost_mean[1], params.repair_cost_sd[1]
    _assert_independent_draws(returns, mean - scale * cost_mean, variance + scale**2 * cost_sd**2, kappa4)


def test_umbrella_outcome_seeds_redraw_the_coin_flip_rewards_only():
    env = gym.make("umbrella_length/9")  # a 10-step chain: steps 1-9 pay a fair coin flip, step 10 +-1
    env.reset(seed=2)
    for _ in range(3):
        env.step(1)
    raw = env.unwrapped._raw
    final = 1.0 if raw._has_umbrella == raw._need_umbrella else -1.0
    returns = _seeded_returns(env, snapshot(env), [0] * 10, n=400)
    coins = 9 - 3
    _assert_independent_draws(returns, final, variance=coins, kappa4=-2.0 * coins)  # a sum of Rademachers


def test_an_outcome_seed_cannot_change_a_noiseless_continuation():
    for env_id, actions in (("SetRetrieval-v0", [np.arange(5)]), ("discounting_chain/2", [0] * 100)):
        env = gym.make(env_id)
        env.reset(seed=0)
        state = snapshot(env)
        first = _continue(env, actions)
        for outcome_seed in (1, 2):
            restore(env, state, outcome_seed=outcome_seed)
            assert same(_continue(env, actions), first), env_id


def test_the_docs_example_runs_as_written():
    """docs/own_env.md, "Snapshot and branch": its Python block, as written."""
    code = first_blocks(section(DOCS / "own_env.md", "## Snapshot and branch"))["python"]
    assert "restore(env, state, outcome_seed=3)" in code
    exec(compile(code, "own_env.md", "exec"), {})


# --- errors ------------------------------------------------------------------------------------------------


def test_a_bad_state_is_one_line_naming_what_was_expected():
    env = gym.make("WatchRepair-v0")
    env.reset(seed=0)
    with pytest.raises(SnapshotError) as excinfo:
        env.unwrapped.restore({"_t": 3})
    assert "got dict" in _one_line(excinfo) and "expected an EnvSnapshot taken by WatchRepairEnv" in str(excinfo.value)
    with pytest.raises(SnapshotError) as excinfo:
        restore(env, 42)
    assert "expected a ChainSnapshot taken by envs.snapshot.snapshot(env)" in _one_line(excinfo)
    with pytest.raises(SnapshotError) as excinfo:
        env.unwrapped.restore(snapshot(env))
    assert "snapshot of a wrapped env" in _one_line(excinfo)
    with pytest.raises(SnapshotError) as excinfo:
        restore(env, snapshot(gym.make("TextWatchRepair-v0")))
    assert "taken through wrappers OrderEnforcing > PassiveEnvChecker" in _one_line(excinfo)
    with pytest.raises(SnapshotError) as excinfo:
        env.unwrapped.restore(WatchRepairEnv(horizon=10).snapshot())
    assert "horizon=10" in _one_line(excinfo) and "expected one of this env" in str(excinfo.value)
    with pytest.raises(SnapshotError) as excinfo:
        env.unwrapped.restore(EnvSnapshot("TextWatchRepairEnv()", b""))
    assert "a snapshot of TextWatchRepairEnv()" in _one_line(excinfo)


@pytest.mark.parametrize("outcome_seed", [-1, 1.5, True, "3"])
def test_a_bad_outcome_seed_is_one_line(outcome_seed):
    env = gym.make("WatchRepair-v0")
    env.reset(seed=0)
    state = snapshot(env)
    with pytest.raises(SnapshotError) as excinfo:
        restore(env, state, outcome_seed=outcome_seed)
    assert "expected None (the same outcome) or an integer >= 0" in _one_line(excinfo)


class _Counting(gym.Wrapper):
    """A wrapper with state of its own and no snapshot_fields."""

    def step(self, action):
        self.count = getattr(self, "count", 0) + 1
        return self.env.step(action)


def test_what_cannot_be_snapshotted_is_named_and_check_contract_skips_it():
    env = _Counting(gym.make("WatchRepair-v0"))
    with pytest.raises(SnapshotError) as excinfo:
        snapshot(env)
    assert "wrapper _Counting holds state a snapshot cannot see" in _one_line(excinfo)
    assert "wrapper _Counting" in check_contract(env, check_api=False).snapshot
    report = check_contract(gym.make("ContextMatch-v0"), check_api=False)
    assert report.snapshot.startswith("env ContextMatchEnv offers no snapshot()") and report.lines()[-1].startswith(
        "snapshot/restore: env ContextMatchEnv"
    )
    with pytest.raises(SnapshotError, match="offers no snapshot"):
        snapshot(gym.make("ContextMatch-v0"))


def test_a_bsuite_env_that_logs_refuses_restore(tmp_path):
    env = gym.make("umbrella_length/9", log_dir=tmp_path)
    env.reset(seed=0)
    state = snapshot(env)
    with pytest.raises(SnapshotError) as excinfo:
        restore(env, state)
    assert "writes bsuite's CSV log" in _one_line(excinfo) and "without log_dir" in str(excinfo.value)
    quiet = gym.make("umbrella_length/9")
    quiet.reset(seed=0)
    restore(quiet, state)  # a state taken from a logging env branches in one that does not log


class _ForgetfulCoins(SnapshotMixin, gym.Env):
    """Pays a normal draw per step for 5 steps, and its snapshot forgets the generator."""

    observation_space = gym.spaces.Discrete(6)
    action_space = gym.spaces.Discrete(2)
    snapshot_fields = ("_t",)

    def snapshot_state(self):
        return {"_t": self._t}

    def redraw_outcome(self, rng):
        self._np_random = rng

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._t = 0
        return 0, {}

    def step(self, action):
        self._t += 1
        return self._t, float(self.np_random.normal()), self._t >= 5, False, {}


def test_check_contract_names_an_env_that_claims_the_protocol_and_breaks_it():
    with pytest.raises(ContractError) as excinfo:
        check_contract(_ForgetfulCoins(), check_api=False)
    message = _one_line(excinfo)
    assert message.startswith("env _ForgetfulCoins offers snapshot()/restore() but breaks it")
    assert "then restore(state), and the same actions: step 1 after it: reward" in message
