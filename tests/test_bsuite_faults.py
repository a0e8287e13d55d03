"""Bad bsuite logs, bsuite ids and suite arguments are one line each,
refused before anything is written or run; valid ones still score and run."""

import fcntl
import json
import os
import shutil
from pathlib import Path

import gymnasium as gym
import pytest

pytest.importorskip("bsuite", reason="bsuite is not installed: pip install -e '.[bsuite]'")

import vcbm_gym  # noqa: E402, F401 (registers the bsuite ids)
from algorithms import bsuite_score, train  # noqa: E402
from algorithms.common.config import make_env  # noqa: E402
from algorithms.common.errors import ConfigError, VcbmGymError  # noqa: E402
from algorithms.experiment import suite  # noqa: E402
from algorithms.experiment.results import LOCK_FILE, locked  # noqa: E402
from envs.bsuite import BSuiteEnv, csv_log_path, env_id_problem  # noqa: E402
from tests.helpers import one_error_line  # noqa: E402

UMBRELLA = "umbrella_length/3"  # a chain of 4 steps


def play(bsuite_id: str, log_dir: Path, first_action, episodes: int = 20) -> Path:
    """bsuite's own CSV log of `episodes` episodes whose first action is first_action(observation)."""
    env = BSuiteEnv(bsuite_id, log_dir=log_dir)
    for episode in range(episodes):
        obs, _ = env.reset(seed=0 if episode == 0 else None)
        done, action = False, first_action(obs)
        while not done:
            obs, _, terminated, truncated, _ = env.step(action)
            done, action = terminated or truncated, 0
    return Path(csv_log_path(log_dir, bsuite_id))


def wrong_umbrella(obs):
    return 1 - int(obs[0])  # the umbrella exactly when it will not rain: regret 2 per episode


def score_cli(capsys, log_dir: Path, tmp_path: Path) -> tuple[int, str]:
    json_path = tmp_path / "scores" / "s.json"
    code = bsuite_score.main([str(log_dir), "--json", str(json_path)])
    if code != 0:
        assert not json_path.exists()  # refused before --json is written
    return code, capsys.readouterr().err


@pytest.fixture
def wrong_log(tmp_path) -> Path:
    return play(UMBRELLA, tmp_path / "wrong", wrong_umbrella)


def as_log_of(source: Path, root: Path, bsuite_id: str = UMBRELLA) -> Path:
    """`source`'s content under the file name of `bsuite_id`'s log, in a new dir under root."""
    target = Path(csv_log_path(root, bsuite_id))
    root.mkdir(parents=True)
    shutil.copy(source, target)
    return root


def test_a_valid_log_still_scores_and_a_failing_run_scores_zero(wrong_log, tmp_path, capsys):
    code, err = score_cli(capsys, wrong_log.parent, tmp_path)
    assert code == 0, err
    assert json.loads((tmp_path / "scores" / "s.json").read_text())["scores"][0]["score"] == 0.0


@pytest.mark.parametrize(
    "content",
    [
        b"hello,world\n1,2\n",  # bsuite's analysis: AttributeError 'episode'
        bytes(range(128, 256)) * 8,  # pandas: UnicodeDecodeError
        b"\x00\x01\x02,\x03\n\xff\xfe\n",
        b"",
    ],
    ids=["garbage", "binary", "binary-ascii", "empty"],
)
def test_a_garbage_or_binary_log_is_one_line_naming_the_file(content, tmp_path, capsys):
    path = Path(csv_log_path(tmp_path / "run", UMBRELLA))
    path.parent.mkdir()
    path.write_bytes(content)
    code, err = score_cli(capsys, path.parent, tmp_path)
    assert code == 2 and err.startswith("error:") and err.count("\n") == 1 and path.name in err, err


def test_a_log_holding_only_its_header_is_refused(wrong_log, tmp_path, capsys):
    header = wrong_log.read_text().splitlines()[0]
    run = tmp_path / "header"
    run.mkdir()
    Path(csv_log_path(run, UMBRELLA)).write_text(header + "\n")
    code, err = score_cli(capsys, run, tmp_path)
    assert code == 2 and "header only" in err, err


@pytest.mark.parametrize("value", ["-inf", "inf", "nan", ""])
def test_a_non_finite_value_is_refused_not_scored(wrong_log, tmp_path, capsys, value):
    """-inf total regret at the last row would make this failing run (score 0) score 1.000."""
    lines = wrong_log.read_text().splitlines()
    last = lines[-1].split(",")
    last[lines[0].split(",").index("total_regret")] = value
    run = tmp_path / "tampered"
    run.mkdir()
    Path(csv_log_path(run, UMBRELLA)).write_text("\n".join([*lines[:-1], ",".join(last)]) + "\n")
    code, err = score_cli(capsys, run, tmp_path)
    assert code == 2 and "total_regret=" in err and f"data row {len(lines) - 1}" in err and "finite" in err, err


@pytest.mark.parametrize(
    "source_id, said",
    [
        ("memory_len/3", "columns"),  # the same total_regret column, and total_perfect beside it
        ("discounting_chain/3", "columns"),  # no total_regret: bsuite's umbrella analysis fails on it
        ("umbrella_distract/3", "episode_len"),  # the same columns: a chain of 20 steps, not 4
        ("umbrella_length/9", "episode_len"),  # another setting of the same experiment
    ],
)
def test_a_log_of_another_setting_renamed_is_refused(source_id, said, tmp_path, capsys):
    source = play(source_id, tmp_path / "source", lambda obs: 0, episodes=3)
    code, err = score_cli(capsys, as_log_of(source, tmp_path / "renamed"), tmp_path)
    assert code == 2 and said in err and UMBRELLA in err, err


def test_a_log_named_for_no_setting_is_refused_and_the_suites_scoring_refuses_it_too(wrong_log, tmp_path, capsys):
    renamed = tmp_path / "renamed"
    renamed.mkdir()
    shutil.copy(wrong_log, renamed / "bsuite_id_-_nope-1.csv")
    code, err = score_cli(capsys, renamed, tmp_path)
    assert code == 2 and "'nope'" in err and "umbrella_length" in err, err
    with pytest.raises(VcbmGymError, match="nope"):
        bsuite_score.experiment_score([renamed], "umbrella_length")


def test_train_refuses_env_kwargs_naming_another_setting_than_the_env_id(tmp_path, capsys):
    log_dir = tmp_path / "run"
    argv = ["--algo", "mc", "--env", f"bsuite:{UMBRELLA}", "--max-episodes", "3", "--log-dir", str(log_dir), "--no-progress"]
    assert train.main([*argv, "--hyperparams", "env_kwargs={bsuite_id: memory_len/3}"]) == 2
    err = one_error_line(capsys)
    assert "memory_len/3" in err and UMBRELLA in err and not log_dir.exists()
    assert make_env(f"bsuite:{UMBRELLA}", {"bsuite_id": UMBRELLA}).unwrapped.bsuite_id == UMBRELLA  # the same one is fine


SUITE = ["--experiment", "umbrella_length", "--settings", "0", "--episodes", "3", "--workers", "0", "--no-progress"]


def run_suite(tmp_path, *extra: str) -> int:
    return suite.main([*SUITE, "--out", str(tmp_path / "out"), *extra])


@pytest.mark.parametrize(
    "hyperparams, said",
    [
        ("env_kwargs={bsuite_id: memory_len/3}", "bsuite_id='memory_len/3'"),
        ("env_kwargs={log_dir: SHARED}", "log_dir="),
    ],
)
def test_the_suite_refuses_env_kwargs_it_sets_itself_before_any_run(tmp_path, capsys, hyperparams, said):
    shared = tmp_path / "shared"
    assert run_suite(tmp_path, "--algos", "mc", "--hyperparams", hyperparams.replace("SHARED", str(shared))) == 2
    assert said in one_error_line(capsys)
    assert not (tmp_path / "out").exists() and not shared.exists()


def test_short_contradicting_protocol_bsuite_is_refused_and_short_alone_is_the_short_protocol(tmp_path, capsys):
    assert run_suite(tmp_path, "--algos", "mc", "--short", "--protocol", "bsuite") == 2
    assert "--short" in one_error_line(capsys) and not (tmp_path / "out").exists()
    for flags in (["--short"], ["--short", "--protocol", "short"], ["--protocol", "short"]):
        args = suite.build_parser().parse_args(["--experiment", "umbrella_length", "--algos", "mc", "--out", "x", *flags])
        suite.check_args(args)
        assert args.protocol == "short"
    args = suite.build_parser().parse_args(["--experiment", "umbrella_length", "--algos", "mc", "--out", "x"])
    suite.check_args(args)
    assert args.protocol == "bsuite"


def test_an_llm_algo_in_the_suite_is_told_which_algos_it_takes(tmp_path, capsys):
    assert run_suite(tmp_path, "--algos", "mc", "loop") == 2
    err = one_error_line(capsys)
    assert "the suite takes tabular or SB3 algos" in err and "loop" in err and len(err) < 200, err


@pytest.mark.parametrize(
    "env_id, said",
    [
        ("bsuite:umbrella_length", "no setting"),
        ("bsuite:umbrella_length/23", "settings 0 to 22"),
        ("bsuite:umbrella_length/-1", "settings 0 to 22"),
        ("bsuite:umbrella_length/03", "settings 0 to 22"),
        ("bsuite:memory_size/17", "settings 0 to 16"),
        ("bsuite:nope/1", "umbrella_length, umbrella_distract"),
    ],
)
def test_a_malformed_or_out_of_range_bsuite_env_id_names_the_experiments_range(env_id, said):
    assert said in env_id_problem(env_id) and env_id in env_id_problem(env_id)
    with pytest.raises(ConfigError, match=said) as caught:
        make_env(env_id, {})
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("env_id", ["bsuite:umbrella_length", "bsuite:umbrella_length/23", "bsuite:umbrella_length/-1",
                                    "bsuite:umbrella_length/03", "bsuite:nope/1"])  # fmt: skip
def test_train_names_the_experiments_range_not_the_project_envs(env_id):
    from algorithms import train
    from algorithms.common.errors import VcbmGymError

    with pytest.raises(VcbmGymError) as caught:
        train.check_env_id(env_id)
    message = str(caught.value)
    assert "\n" not in message and "WatchRepair" not in message and ("umbrella_length" in message or "nope" in message)


def test_other_env_ids_are_not_bsuite_problems():
    assert env_id_problem("bsuite:umbrella_length/22") is None and env_id_problem("WatchRepair-v0") is None
    with pytest.raises(gym.error.UnregisteredEnv):  # Gymnasium's own words for an id that is not bsuite's
        make_env("NoSuchEnv-v0", {})


@pytest.mark.parametrize("algo", ["mc", "ppo"])
def test_bsuite_v0_without_a_bsuite_id_says_it_is_required(algo, tmp_path, capsys):
    log_dir = tmp_path / "run"
    assert train.main(["--algo", algo, "--env", "BSuite-v0", "--log-dir", str(log_dir), "--no-progress"]) == 2
    err = one_error_line(capsys)
    assert "bsuite_id is required" in err and "umbrella_length/9" in err, err
    assert "integer_observations" not in err and "positional" not in err and not log_dir.exists()


def test_the_lock_names_the_suite_that_holds_it(tmp_path, capsys):
    assert run_suite(tmp_path, "--algos", "mc") == 0, capsys.readouterr().err
    out = tmp_path / "out"
    assert (out / LOCK_FILE).read_text().split() == [str(os.getpid()), "suite"]
    with locked(out, "suite"):
        assert run_suite(tmp_path, "--algos", "mc") == 2
        err = one_error_line(capsys)
    assert "in use by another suite" in err and "compare (" not in err, err


def test_a_lock_held_by_an_older_holder_that_wrote_only_its_pid_names_both_commands(tmp_path):
    (tmp_path / LOCK_FILE).write_text("123\n")
    with open(tmp_path / LOCK_FILE) as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(VcbmGymError, match=r"another compare or suite \(pid 123"):
            with locked(tmp_path, "suite"):
                pass
