"""bsuite as an env family (envs/bsuite.py) and its scores (algorithms/bsuite_score.py)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

pytest.importorskip("bsuite", reason="bsuite is not installed: pip install -e '.[bsuite]'")

from bsuite import sweep  # noqa: E402
from bsuite.logging import csv_load  # noqa: E402
from stable_baselines3.common.env_checker import check_env as sb3_check_env  # noqa: E402

import vcbm_gym  # noqa: E402
from algorithms import bsuite_score  # noqa: E402
from envs.bsuite import BSUITE_IDS, LAYOUTS, SWEEP_SIZES, BSuiteEnv, BSuiteNotInstalled, csv_log_path, parse_bsuite_id  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
# (bsuite_id, steps per episode, contract keys reported at the last step)
CASES = [
    ("umbrella_length/3", 4, {"first_decision_optimal", "is_success"}),
    ("umbrella_distract/1", 20, {"first_decision_optimal", "is_success"}),
    ("discounting_chain/2", 100, {"first_decision_optimal"}),
    ("memory_len/2", 4, {"is_success"}),
    ("memory_size/2", 3, {"is_success"}),
]


def play(env, policy, episodes, seed):
    """Play `episodes` episodes from reset(seed); policy(obs, t, env) -> action.
    Returns [(return, last reward, last info)] per episode."""
    out = []
    for episode in range(episodes):
        obs, _ = env.reset(seed=seed if episode == 0 else None)
        done, t, total, reward, info = False, 0, 0.0, 0.0, {}
        while not done:
            obs, reward, terminated, truncated, info = env.step(policy(obs, t, env))
            done, t, total = terminated or truncated, t + 1, total + reward
        out.append((total, reward, info))
    return out


def umbrella_optimal(obs, t, env):
    return int(obs[0]) if t == 0 else 0  # take the umbrella iff the first observation says it will rain


def umbrella_wrong(obs, t, env):
    return 1 - int(obs[0]) if t == 0 else 0


def test_sweep_sizes_match_bsuite_so_every_registered_id_is_a_bsuite_id():
    assert set(LAYOUTS) == set(SWEEP_SIZES)
    assert {name: len(getattr(sweep, name.upper())) for name in SWEEP_SIZES} == dict(SWEEP_SIZES)
    assert set(BSUITE_IDS) <= set(sweep.SWEEP) and len(BSUITE_IDS) == sum(SWEEP_SIZES.values())
    assert set(vcbm_gym.BSUITE_ENV_IDS) == {"BSuite-v0", *BSUITE_IDS} and set(vcbm_gym.BSUITE_ENV_IDS) <= set(gym.registry)


@pytest.mark.parametrize("bsuite_id, steps, keys", CASES)
@pytest.mark.parametrize("integer", [False, True], ids=["box", "integer"])
def test_checkers_and_contract_pass(bsuite_id, steps, keys, integer):
    env = gym.make("BSuite-v0", bsuite_id=bsuite_id, integer_observations=integer)
    sb3_check_env(env.unwrapped)
    report = vcbm_gym.check_contract(env, episodes=3, seed=5)  # runs Gymnasium's check_env first
    assert set(report.reported) == keys
    assert report.steps == 3 * steps == 3 * env.unwrapped.episode_steps == 3 * env.unwrapped.params.horizon
    expected_space = gym.spaces.MultiDiscrete if integer else gym.spaces.Box
    assert isinstance(env.observation_space, expected_space) and env.observation_space.shape == (len(env.reset()[0]),)


def test_the_three_id_forms_make_the_same_setting_of_bsuite():
    """umbrella_length/9 is bsuite's 10th setting: a chain of 10 steps with 20 distractor bits."""
    for make in (
        lambda: gym.make("BSuite-v0", bsuite_id="umbrella_length/9"),
        lambda: gym.make("umbrella_length/9"),
        lambda: gym.make("bsuite:umbrella_length/9"),
    ):
        env = make().unwrapped
        assert env.bsuite_id == "umbrella_length/9" and env.params.kwargs == {"chain_length": 10, "n_distractor": 20}
        assert env.episode_steps == 10 and env.observation_space.shape == (23,) and env.action_space.n == 2
    assert gym.make("umbrella_distract/4").unwrapped.episode_steps == 20  # umbrella_distract fixes chain_length 20


def test_the_cli_form_passes_train_check_and_a_fresh_process_needs_only_vcbm_gym(tmp_path):
    code = (
        "import sys, gymnasium as gym, vcbm_gym; assert 'bsuite' not in sys.modules; "
        "from algorithms.train import check_env_id; check_env_id('bsuite:discounting_chain/3'); "
        "print(gym.make('bsuite:discounting_chain/3').unwrapped.episode_steps)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "100"


@pytest.mark.parametrize(
    "bad", ["umbrella_length/23", "umbrella_length/09", "catch/0", "umbrella_length", "umbrella_length/x", 9]
)
def test_an_unknown_bsuite_id_is_one_value_error_line(bad):
    with pytest.raises(ValueError, match="bsuite_id=") as caught:
        gym.make("BSuite-v0", bsuite_id=bad)
    assert "\n" not in str(caught.value)


def test_without_bsuite_the_env_says_which_extra_to_install_as_a_value_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "bsuite", None)  # import bsuite fails as if it were not installed
    with pytest.raises(BSuiteNotInstalled, match=r"pip install 'vcbm-gym\[bsuite\]'") as caught:
        gym.make("umbrella_length/1")
    assert isinstance(caught.value, ModuleNotFoundError) and isinstance(caught.value, ValueError)


def test_parse_bsuite_id_returns_the_experiment_and_setting():
    assert parse_bsuite_id("memory_size/16") == ("memory_size", 16)


def test_step_before_reset_after_the_end_and_a_bad_action_are_refused():
    env = BSuiteEnv("umbrella_length/0")  # one step per episode
    with pytest.raises(RuntimeError, match="before reset"):
        env.step(0)
    env.reset(seed=0)
    with pytest.raises(ValueError, match="not in Discrete"):
        env.step(2)
    assert env.step(0)[2] is True
    with pytest.raises(RuntimeError, match="after the episode ended"):
        env.step(0)


def test_umbrella_first_decision_decides_the_last_reward_and_the_contract_keys():
    env = BSuiteEnv("umbrella_length/4")  # chain of 5
    for policy, correct in ((umbrella_optimal, True), (umbrella_wrong, False)):
        for _, last_reward, info in play(env, policy, episodes=20, seed=3):
            assert info == {"first_decision_optimal": correct, "is_success": correct}
            assert last_reward == (1.0 if correct else -1.0)


def test_discounting_chain_optimal_arm_is_the_bonus_chain():
    """mapping_seed k gives chain k % 5 the 10% bonus: return 1.1 for it, 1.0 for any other chain."""
    for index in (0, 3, 7):
        env = BSuiteEnv(f"discounting_chain/{index}")
        for arm in range(5):
            [(episode_return, _, info)] = play(env, lambda obs, t, env, arm=arm: arm, episodes=1, seed=0)
            optimal = arm == index % 5
            assert info == {"first_decision_optimal": optimal}
            assert episode_return == pytest.approx(1.1 if optimal else 1.0)


def test_memory_success_is_answering_the_queried_context_bit():
    def recall(obs, t, env):
        if t == 0:
            env.remembered = (np.asarray(obs[2:]) > 0).astype(int)  # context bits shown as -1 / +1 at the start
        return int(env.remembered[int(obs[1])]) if t == env.episode_steps - 1 else 0  # the query shows at the end

    env = BSuiteEnv("memory_size/3")
    results = play(env, recall, episodes=20, seed=1)
    assert all(info == {"is_success": True} and ret == 1.0 for ret, _, info in results)


def test_integer_view_is_the_float_view_on_a_grid():
    floats, ints = BSuiteEnv("umbrella_length/5"), BSuiteEnv("umbrella_length/5", integer_observations=True)
    f, i = floats.reset(seed=11)[0], ints.reset(seed=11)[0]
    for t in range(1, 7):  # chain of 6
        assert i.dtype == np.int64 and ints.observation_space.contains(i)
        np.testing.assert_array_equal(i[[0, 1]], f[[0, 1]])
        np.testing.assert_array_equal(i[3:], f[3:])
        assert i[2] == t - 1 and f[2] == pytest.approx(1 - (t - 1) / 6)
        f, i = floats.step(1)[0], ints.step(1)[0]
    chain = BSuiteEnv("discounting_chain/1", integer_observations=True)
    assert chain.reset(seed=0)[0].tolist() == [0, 0]  # context -1 before the first action
    assert [chain.step(3)[0].tolist() for _ in range(3)] == [[4, 1], [4, 2], [4, 3]]


def test_reset_with_a_seed_replays_the_same_episodes():
    def trace(seed):
        env = BSuiteEnv("umbrella_distract/2")
        rng = np.random.default_rng(0)
        obs = [env.reset(seed=seed)[0]]
        steps = [env.step(int(rng.integers(2))) for _ in range(env.episode_steps)]
        return np.concatenate(obs + [s[0] for s in steps]), [s[1] for s in steps]

    assert np.array_equal(trace(4)[0], trace(4)[0]) and trace(4)[1] == trace(4)[1]
    assert not np.array_equal(trace(4)[0], trace(5)[0])


def _logged(log_dir, bsuite_id):
    frame, _ = csv_load.load_bsuite(str(log_dir))
    return frame[frame.bsuite_id == bsuite_id].sort_values("episode")


def test_two_seeds_played_side_by_side_write_separate_bsuite_logs(tmp_path):
    """Two envs of one bsuite_id alive at once (compare's parallel seeds), each with its run's log dir."""
    bsuite_id = "umbrella_length/2"
    envs = {seed: BSuiteEnv(bsuite_id, log_dir=tmp_path / f"seed{seed}" / "bsuite") for seed in (0, 1)}
    returns = {0: [], 1: []}
    policies = {0: umbrella_optimal, 1: umbrella_wrong}
    for episode in range(30):  # interleaved, episode by episode
        for seed, env in envs.items():
            obs = env.reset()[0] if episode else env.reset(seed=seed)[0]
            total, done, t = 0.0, False, 0
            while not done:
                obs, reward, terminated, truncated, _ = env.step(policies[seed](obs, t, env))
                total, done, t = total + reward, terminated or truncated, t + 1
            returns[seed].append(total)
    for seed, env in envs.items():
        assert env.log_path == csv_log_path(tmp_path / f"seed{seed}" / "bsuite", bsuite_id)
        rows = _logged(tmp_path / f"seed{seed}" / "bsuite", bsuite_id)
        # bsuite logs at log-spaced episodes; each row holds this env's own running totals
        assert rows.episode.tolist() == [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 12, 14, 17, 20, 25, 30]
        assert rows.total_return.tolist() == pytest.approx([sum(returns[seed][:n]) for n in rows.episode])
        assert rows.total_regret.iloc[-1] == (0 if seed == 0 else 2 * 30)
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file()) == [
        "seed0/bsuite/bsuite_id_-_umbrella_length-2.csv",
        "seed1/bsuite/bsuite_id_-_umbrella_length-2.csv",
    ]


def test_two_envs_sharing_a_log_dir_fail_instead_of_mixing_runs(tmp_path):
    first, second = BSuiteEnv("umbrella_length/0", log_dir=tmp_path), BSuiteEnv("umbrella_length/0", log_dir=tmp_path)
    for env in (first, second):
        env.reset(seed=0)
    first.step(0)  # episode 1 ends: first claims the file
    with pytest.raises(ValueError, match="already exists|another env"):
        second.step(0)
    assert _logged(tmp_path, "umbrella_length/0").episode.tolist() == [1]


def test_an_env_that_plays_no_episode_writes_nothing_and_log_to_is_refused_after_reset(tmp_path):
    env = BSuiteEnv("discounting_chain/0", log_dir=tmp_path / "probe")
    env.reset(seed=0)
    assert not (tmp_path / "probe").exists()  # a runner's probe env leaves no trace in the run's log dir
    with pytest.raises(RuntimeError, match="after the first reset"):
        env.log_to(tmp_path / "later")
    late = BSuiteEnv("discounting_chain/0")
    late.log_to(tmp_path / "late")
    play(late, lambda obs, t, env: 1, episodes=2, seed=0)  # chain 1 pays 1.0 (the bonus chain is 0)
    assert _logged(tmp_path / "late", "discounting_chain/0").total_return.tolist() == pytest.approx([1.0, 2.0])


def _sweep_logs(root, bsuite_ids, policy, episodes):
    for k, bsuite_id in enumerate(bsuite_ids):
        play(BSuiteEnv(bsuite_id, log_dir=root), policy, episodes=episodes, seed=k)


def test_bsuite_scores_optimal_1_and_random_0_on_a_short_umbrella_sweep(tmp_path):
    """bsuite's umbrella score: the share of chain lengths whose regret per episode is below 0.5. A
    random first action has regret 1 per episode (2 with probability 1/2): over 100 episodes its mean
    is 1 +- 0.1, five standard deviations above 0.5."""
    ids = [f"umbrella_length/{k}" for k in range(5)]  # chains of 1 to 5 steps
    rng = np.random.default_rng(0)
    _sweep_logs(tmp_path / "optimal", ids, umbrella_optimal, 100)
    _sweep_logs(tmp_path / "random", ids, lambda obs, t, env: int(rng.integers(2)), 100)
    assert bsuite_score.experiment_score([tmp_path / "optimal"], "umbrella_length") == 1.0
    assert bsuite_score.experiment_score([tmp_path / "random"], "umbrella_length") == 0.0
    table = bsuite_score.score_table(bsuite_score.find_log_dirs([tmp_path]), by_run=True)
    assert sorted((row["run"], row["score"], row["finished"]) for row in table) == [
        (str(tmp_path / "optimal"), 1.0, False),
        (str(tmp_path / "random"), 0.0, False),
    ]


def test_bsuite_scores_the_discounting_chain_by_its_mean_return(tmp_path):
    """bsuite's discounting_chain score is 1 - 10 (1.1 - mean return), clipped to [0, 1]: the bonus chain
    every time scores 1; a uniform arm earns 1 + 0.1 / 5 on average, score 0.2, with standard deviation
    10 * 0.1 * sqrt(0.2 * 0.8 / n) = 0.4 / sqrt(n) over n episodes (0.018 for n = 500)."""
    rng = np.random.default_rng(1)
    _sweep_logs(tmp_path / "optimal", ["discounting_chain/3"], lambda obs, t, env: 3, 500)
    _sweep_logs(tmp_path / "random", ["discounting_chain/3"], lambda obs, t, env: int(rng.integers(5)), 500)
    assert bsuite_score.experiment_score([tmp_path / "optimal"], "discounting_chain") == pytest.approx(1.0)
    assert bsuite_score.experiment_score([tmp_path / "random"], "discounting_chain") == pytest.approx(0.2, abs=4 * 0.018)
    with pytest.raises(ValueError, match="no umbrella_length logs"):
        bsuite_score.experiment_score([tmp_path / "optimal"], "umbrella_length")


@pytest.mark.slow
def test_score_cli_prints_and_writes_scores_and_refuses_bad_input_in_one_line(run_cli, tmp_path):
    _sweep_logs(tmp_path / "runs" / "seed0" / "bsuite", ["umbrella_length/1"], umbrella_optimal, 20)
    out = run_cli("algorithms.bsuite_score", str(tmp_path / "runs"), "--json", str(tmp_path / "out" / "s.json"))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "umbrella_length: 1.000  unfinished (scored at its last logged episode)"
    written = json.loads((tmp_path / "out" / "s.json").read_text())
    assert written["scores"] == [{"experiment": "umbrella_length", "score": 1.0, "finished": False}]
    (tmp_path / "empty").mkdir()
    for args in ([str(tmp_path / "empty"), "--json", str(tmp_path / "nope" / "s.json")], [str(tmp_path / "missing")]):
        bad = run_cli("algorithms.bsuite_score", *args)
        assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and bad.stderr.startswith("error:"), bad.stderr
    assert not (tmp_path / "nope").exists()  # checked before anything is written


@pytest.mark.slow
def test_train_cli_runs_two_seeds_at_once_on_the_bsuite_id_form_each_with_its_own_bsuite_log(tmp_path):
    """The tabular runner picks the integer view and hands the env its run's dir (BSuiteEnv.log_to): no env_kwargs."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "algorithms.train", "--algo", "mc", "--env", "bsuite:umbrella_distract/0", "--seed", str(seed),
             "--max-episodes", "200", "--no-progress", "--log-dir", f"run{seed}"],
            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for seed in (0, 1)
    ]  # fmt: skip
    try:
        for proc in procs:
            _, err = proc.communicate(timeout=300)
            assert proc.returncode == 0, err
    finally:
        for proc in procs:
            proc.kill()  # no-op for a finished process; a hung one does not outlive the test
            proc.wait()
    logs = [_logged(tmp_path / f"run{seed}" / "env_log", "umbrella_distract/0") for seed in (0, 1)]
    assert [rows.episode.iloc[-1] for rows in logs] == [200, 200]
    assert logs[0].total_return.tolist() != logs[1].total_return.tolist()  # two seeds, two streams of episodes
    table = bsuite_score.score_table(bsuite_score.find_log_dirs([tmp_path]), by_run=True)
    assert [row["run"] for row in table] == [str(tmp_path / "run0" / "env_log"), str(tmp_path / "run1" / "env_log")]


def test_observations_and_rewards_match_shimmys_bsuite_wrapper_step_for_step():
    """Farama's BSuiteCompatibilityV0 over the same bsuite env, seeded the same way, is the reference."""
    import bsuite
    from shimmy.bsuite_compatibility import BSuiteCompatibilityV0

    for bsuite_id in ("umbrella_length/6", "memory_size/4"):
        ours = BSuiteEnv(bsuite_id)
        reference = BSuiteCompatibilityV0(bsuite.load(bsuite_id.split("/")[0], dict(sweep.SETTINGS[bsuite_id])))
        actions = np.random.default_rng(2).integers(2, size=3 * ours.episode_steps)
        for episode in range(3):
            seed = 7 if episode == 0 else None
            ours_obs, ref_obs = ours.reset(seed=seed)[0], reference.reset(seed=seed)[0]
            np.testing.assert_array_equal(ours_obs, np.asarray(ref_obs).reshape(-1))
            for action in actions[episode * ours.episode_steps : (episode + 1) * ours.episode_steps]:
                ours_step, ref_step = ours.step(int(action)), reference.step(int(action))
                np.testing.assert_array_equal(ours_step[0], np.asarray(ref_step[0]).reshape(-1))
                assert ours_step[1:4] == (float(ref_step[1]), bool(ref_step[2]), bool(ref_step[3]))
            assert ours_step[2]  # the episode ended where bsuite ended it


def test_sb3_runs_write_bsuite_logs_into_their_run_dir_one_per_sub_env(tmp_path):
    """The SB3 runner hands each env it plays its run's dir (its dry validation build writes nothing)."""
    from algorithms.train import run

    for n_envs, expected in ((1, ["env_log"]), (2, ["env_log/env0", "env_log/env1"])):
        log_dir = tmp_path / f"ppo{n_envs}"
        argv = ["--algo", "ppo", "--env", "bsuite:umbrella_length/1", "--max-episodes", "20", "--no-progress"]
        run([*argv, "--log-dir", str(log_dir), "--hyperparams", f"n_envs={n_envs}", "n_steps=16", "batch_size=16"])
        logs = sorted(str(path.parent.relative_to(log_dir)) for path in log_dir.rglob("bsuite_id_-_*.csv"))
        assert logs == expected
        assert sum(_logged(log_dir / name, "umbrella_length/1").episode.iloc[-1] for name in expected) >= 20
