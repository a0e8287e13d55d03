"""Run integrity: one resolved config per run, no stale reuse, clean stops, one-line errors."""

from __future__ import annotations

import fcntl
import json
import math
import os
import signal
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import vcbm_gym  # noqa: F401
from algorithms import compare, credit_fidelity, evaluate, train
from algorithms.common.cli import MAX_SEED
from envs.set_retrieval import InvalidSetError, SetRetrievalParams
from envs.watch_repair import WatchRepairParams, WatchRepairVectorEnv
from tests.helpers import descendants, needs_proc, start_module, wait_gone

REPO = Path(__file__).resolve().parents[1]
VOLATILE = {"wall_time_s", "train_time_s", "log_dir", "checksum"}


# ------------------------------------------------------------------ one-line errors, exit code 2
def _assert_one_error(code, err):
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err


@pytest.mark.parametrize("argv", [["--algo", "-_"], ["--algo"], ["--algo", "-x", "--env", "WatchRepair-v0"]])
def test_a_malformed_algo_is_one_error_line_on_every_python(argv, capsys):
    # Debian's Python 3.11.2 reported ['--algo', '-_'] through the --algo peek's plain argparse (usage, then exit)
    from algorithms import train

    _assert_one_error(train.main(argv), capsys.readouterr().err)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    root = tmp_path_factory.mktemp("bad")
    (root / "a_file").write_text("not a directory\n")
    (root / "binary.yml").write_bytes(bytes(range(256)) * 4)
    return root


nan_or_inf = st.sampled_from([math.nan, math.inf, -math.inf])
bad_seed = st.one_of(st.integers(max_value=-1), st.integers(min_value=MAX_SEED + 1, max_value=2**80))
non_positive = st.integers(max_value=0)


def train_bad_args(root: Path):
    hp = lambda key, values: values.map(lambda v: ["--algo", "vcbm", "--hyperparams", f"{key}={v}"])  # noqa: E731
    return st.one_of(
        bad_seed.map(lambda s: ["--algo", "rudder", "--seed", str(s)]),
        hp("log_interval", non_positive),
        hp("convergence_window", non_positive),
        hp(
            "z_thresh",
            st.one_of(nan_or_inf, st.floats(max_value=-1e-9, allow_nan=False)).map(
                lambda v: f"{v!r}".replace("nan", ".nan").replace("inf", ".inf")
            ),
        ),
        hp("epsilon_start", st.floats(max_value=-1e-6, allow_infinity=False, allow_nan=False)),
        hp("forced_visits", st.integers(max_value=-1)),
        hp("env_kwargs", non_positive.map(lambda h: f"{{horizon: {h}}}")),
        hp(
            "env_kwargs",
            st.floats(max_value=-1e-6, allow_infinity=False, allow_nan=False).map(lambda s: f"{{transport_sd: {s}}}"),
        ),
        non_positive.map(lambda n: ["--algo", "mc", "--max-episodes", str(n)]),
        st.just(["--algo", "vcbm", "--config", str(root / "binary.yml")]),
        st.just(["--algo", "vcbm", "--log-dir", str(root / "a_file")]),
        st.just(["--algo", "vcbm", "--log-dir", str(root / "a_file" / "under")]),
        st.just(["--algo", "ppo", "--hyperparams", "target_kl=-0.1"]),
        st.text(alphabet="abcxyz-_", min_size=1, max_size=8).filter(lambda a: a not in train.ALGOS).map(lambda a: ["--algo", a]),
    )


def compare_bad_args(root: Path):
    base = ["--algos", "mc", "--no-progress"]
    out = ["--out", str(root / "cmp")]
    return st.one_of(
        st.one_of(non_positive, st.integers(min_value=10_001, max_value=10**12)).map(lambda n: [*base, *out, "--seeds", str(n)]),
        st.integers(max_value=-1).map(lambda n: [*base, *out, "--workers", str(n)]),
        non_positive.map(lambda n: [*base, *out, "--max-episodes", str(n)]),
        bad_seed.map(lambda s: [*base, *out, "--seed-start", str(s)]),
        st.just([*base, "--out", str(root / "a_file")]),
        st.just([*base, *out, "--hyperparams", "log_interval=0"]),
    )


def fidelity_bad_args(root: Path):
    out = ["--out", str(root / "fid")]
    return st.one_of(
        st.integers(max_value=9).map(lambda n: [*out, "--requests", str(n)]),
        bad_seed.map(lambda s: [*out, "--seed", str(s)]),
        st.one_of(st.floats(max_value=-1e-6, allow_nan=False), st.just(math.nan)).map(
            lambda v: [*out, "--eval-noise-sd", repr(v)]
        ),
        st.just(["--out", str(root / "a_file")]),
    )


def evaluate_bad_args(root: Path):
    out = ["--out", str(root / "ev")]

    def scripted(content: bytes) -> list[str]:
        path = root / f"script{abs(hash(content))}.json"
        path.write_bytes(content)
        return ["--model", f"scripted:{path}", *out]

    bad_json = st.one_of(
        st.binary(min_size=1, max_size=64).filter(lambda b: not b.strip().startswith(b"{")),
        st.sampled_from([b"{}", b"[]", b'{"*": "print(1)"}', b'{"t": [1, 2]}', b"null", b'{"*": [["x"]]}']),
    )
    return st.one_of(
        bad_json.map(scripted),
        st.integers(max_value=-1).map(lambda n: ["--model", "scripted:oracle", *out, "--max-tasks", str(n)]),
        bad_seed.map(lambda s: ["--model", "scripted:oracle", *out, "--seed", str(s)]),
        st.just(["--model", "scripted:oracle", "--out", str(root / "a_file")]),
        st.just(["--model", "scripted:oracle", *out, "--env", "WatchRepair-v0"]),
    )


@pytest.mark.parametrize(
    "module, strategy",
    [(train, train_bad_args), (compare, compare_bad_args), (credit_fidelity, fidelity_bad_args), (evaluate, evaluate_bad_args)],
    ids=["train", "compare", "credit_fidelity", "evaluate"],
)
def test_every_cli_turns_generated_bad_arguments_into_one_error_line(module, strategy, workdir, capsys):
    @settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(argv=strategy(workdir))
    def check(argv):
        capsys.readouterr()
        code = module.main(argv)
        _assert_one_error(code, capsys.readouterr().err)

    check()


@pytest.mark.parametrize(
    "module, argv",
    [
        ("algorithms.train", ["--algo", "rudder", "--seed", str(2**70)]),
        ("algorithms.train", ["--algo", "vcbm", "--hyperparams", "env_kwargs={horizon: 0}"]),
        ("algorithms.compare", ["--algos", "mc", "--seeds", str(10**9), "--out", "cmp"]),
        ("algorithms.credit_fidelity", ["--seed", "-1", "--out", "fid"]),
        ("algorithms.evaluate", ["--model", "random_dir", "--out", "ev"]),
    ],
)
def test_bad_input_in_a_real_process_exits_2_with_one_line(run_cli, tmp_path, module, argv):
    (tmp_path / "random_dir").mkdir()
    (tmp_path / "random_dir" / "notes.txt").write_text("no model here")
    result = run_cli(module, *argv)
    _assert_one_error(result.returncode, result.stderr)


# ------------------------------------------------------------------ env constructors
def test_watch_repair_constructor_rejects_generated_bad_values():
    bad = st.one_of(
        st.tuples(st.just("horizon"), st.one_of(non_positive, st.integers(min_value=10**5 + 1), st.floats(allow_nan=True))),
        st.tuples(
            st.just("repair_cost_sd"),
            st.one_of(nan_or_inf, st.floats(max_value=-1e-9, allow_nan=False)).map(lambda v: (v, 2.0, 2.0, 1.0)),
        ),
        st.tuples(st.just("transport_sd"), st.one_of(nan_or_inf, st.floats(max_value=-1e-9, allow_nan=False))),
        st.tuples(
            st.just("counter_probs"),
            st.tuples(st.one_of(nan_or_inf, st.floats(min_value=1 + 1e-9), st.floats(max_value=-1e-9)), st.floats(0, 1)),
        ),
        st.tuples(st.just("price"), nan_or_inf.map(lambda v: (v, 28.0, 31.0, 59.0))),
        st.tuples(st.just("brand_probs"), st.just((0.5, 0.5, 0.5, -0.5))),
    )

    @settings(max_examples=30, deadline=None)
    @given(bad)
    def check(item):
        name, value = item
        with pytest.raises(ValueError) as info:
            gym.make("WatchRepair-v0", **{name: value})
        message = str(info.value)
        assert name in message and "expected" in message and "\n" not in message
        with pytest.raises(ValueError):
            WatchRepairVectorEnv(2, **{name: value})

    check()
    WatchRepairParams()  # the defaults stay valid


def test_set_retrieval_constructor_rejects_generated_bad_values():
    negative = st.floats(max_value=-1e-9, allow_nan=False, allow_infinity=False)
    bad = st.one_of(
        st.tuples(st.sampled_from(["eval_noise_sd", "eval_bias_sd", "feature_noise_sd"]), st.one_of(nan_or_inf, negative)),
        st.tuples(st.just("coverage_prob"), st.one_of(nan_or_inf, negative, st.floats(min_value=1 + 1e-9, allow_infinity=False))),
        st.tuples(
            st.sampled_from(["pool_size", "set_size"]), st.one_of(non_positive, st.integers(min_value=17), st.floats(0.5, 3.5))
        ),
        st.tuples(st.just("bonus_range"), st.one_of(nan_or_inf.map(lambda v: (0.1, v)), st.just((0.3, 0.1)))),
    )

    @settings(max_examples=30, deadline=None)
    @given(bad)
    def check(item):
        name, value = item
        with pytest.raises(ValueError) as info:
            gym.make("SetRetrieval-v0", **{name: value})
        assert name in str(info.value) and "expected" in str(info.value)

    check()
    SetRetrievalParams()


def test_set_retrieval_refuses_float_items_and_steps_after_the_episode():
    env = gym.make("SetRetrieval-v0").unwrapped
    env.reset(seed=0)
    for action in ([1.5, 0, 1, 2, 3], [math.nan, 0, 1, 2, 3], [True, False, True, False, True]):
        with pytest.raises(InvalidSetError, match="integer pool indices"):
            env.step(np.array(action))
    env.step(np.array([0.0, 1.0, 2.0, 3.0, 4.0]))  # integral floats are the same items
    with pytest.raises(RuntimeError, match="after the episode ended"):
        env.step(np.array([0, 1, 2, 3, 4]))
    text = gym.make("TextSetRetrieval-v0").unwrapped
    text.reset(seed=0)
    text.step("c0, c1")
    with pytest.raises(RuntimeError, match="after the episode ended"):
        text.step("c2")


def test_vector_env_refuses_to_step_before_reset():
    venv = WatchRepairVectorEnv(3)
    with pytest.raises(RuntimeError, match="before reset"):
        venv.step(np.zeros(3, dtype=np.int64))
    venv.reset(seed=0)
    venv.step(np.zeros(3, dtype=np.int64))


# ------------------------------------------------------------------ config.yml records what ran
def _comparable(summary):
    return {k: v for k, v in summary.items() if k not in VOLATILE}


def _rerun_from_record(log_dir: Path, new_dir: Path):
    record = yaml.safe_load((log_dir / "config.yml").read_text())
    argv = ["--algo", record["algo"], "--env", record["env"], "--seed", str(record["seed"]),
            "--config", str(log_dir / "config.yml"), "--log-dir", str(new_dir), "--no-progress"]  # fmt: skip
    return record, train.run(argv)


@pytest.mark.parametrize(
    "argv",
    [
        [
            "--algo",
            "a2c",
            "--credit",
            "vcbm_bookmark",
            "--max-episodes",
            "20",
            "--seed",
            "3",
            "--hyperparams",
            "n_envs=2",
            "credit_kwargs={vcbm_bookmark: {alpha: 0.2, baseline: given, advantage: return}}",
        ],
        ["--algo", "vcbm", "--max-episodes", "80", "--seed", "5", "--hyperparams", "forced_visits=10", "warmup_transitions=300"],
    ],
    ids=["sb3-credit", "tabular"],
)
def test_config_yml_equals_the_settings_used_and_reruns_to_the_same_summary(tmp_path, argv):
    first = train.run([*argv, "--log-dir", str(tmp_path / "first"), "--no-progress"])
    record, again = _rerun_from_record(tmp_path / "first", tmp_path / "again")
    resolved = train.resolve_argv(argv)
    assert record["hyperparams"] == resolved.identity()["hyperparams"]
    assert record["config_hash"] == resolved.config_hash == first["config_hash"] == again["config_hash"]
    assert record["versions"]["numpy"] == np.__version__ and "git_commit" in record
    if record["algo"] == "a2c":
        hp = record["hyperparams"]
        assert hp["credit"] == "vcbm_bookmark" and hp["max_episodes"] == 20 and hp["n_envs"] == 2
        assert hp["credit_kwargs"]["vcbm_bookmark"]["alpha"] == 0.2
        assert hp["rms_prop_eps"] == 1e-5  # SB3's own default, recorded though no config names it
    else:
        assert record["hyperparams"]["forced_visits"] == 10 and record["hyperparams"]["max_episodes"] == 80
    assert _comparable(first) == _comparable(again)


def test_sb3_arguments_follow_sb3s_signature():
    resolved = train.resolve_argv(["--algo", "ppo", "--hyperparams", "target_kl=0.02"]).hyperparams
    assert resolved["target_kl"] == 0.02 and resolved["clip_range_vf"] is None
    with pytest.raises(train.VcbmGymError, match="unknown hyperparameter 'target_kll'"):
        train.resolve_argv(["--algo", "ppo", "--hyperparams", "target_kl=0.02", "target_kll=1"])


def test_an_existing_log_dir_needs_resume_or_overwrite(tmp_path, capsys):
    argv = ["--algo", "mc", "--max-episodes", "30", "--log-dir", str(tmp_path / "run"), "--no-progress"]
    first = train.run(argv)
    assert train.main(argv) == 2 and "already holds a run" in capsys.readouterr().err
    assert train.run([*argv, "--resume"]) == first  # finished, same config: nothing rerun
    assert train.main([*argv, "--resume", "--hyperparams", "epsilon=0.1"]) == 2
    assert "epsilon 0.05 -> 0.1" in capsys.readouterr().err
    (tmp_path / "run" / "events.out.tfevents.0.old").write_bytes(b"")  # an event file the new run must not join
    replaced = train.run([*argv, "--overwrite", "--hyperparams", "epsilon=0.1"])
    assert replaced["config_hash"] != first["config_hash"]
    assert len(list((tmp_path / "run").glob("events.out.tfevents.*"))) == 1  # no mixing of two runs' event files
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    assert train.main([*argv[:-3], "--log-dir", str(tmp_path / "other"), "--overwrite"]) == 2
    assert (tmp_path / "other" / "notes.txt").exists()


# ------------------------------------------------------------------ compare: stale results, stops, lock
def _compare_argv(out, seeds=2, workers=0, max_episodes=60):
    return ["--algos", "mc", "td", "--seeds", str(seeds), "--max-episodes", str(max_episodes), "--workers", str(workers),
            "--out", str(out), "--no-progress"]  # fmt: skip


def test_compare_never_reuses_a_stale_or_edited_result(tmp_path, capsys):
    compare.run(_compare_argv(tmp_path))
    capsys.readouterr()
    compare.run(_compare_argv(tmp_path, max_episodes=70))  # the request changed
    err = capsys.readouterr().err
    assert "rerunning 4 run(s)" in err and "max_episodes 60 -> 70" in err
    for algo in ("mc", "td"):
        for seed in (0, 1):
            assert json.loads((tmp_path / algo / f"seed{seed}" / "summary.json").read_text())["episodes_run"] == 70
    # a run killed after the request changed leaves the old summary beside the new config.yml
    compare.run(_compare_argv(tmp_path, max_episodes=60))
    record = yaml.safe_load((tmp_path / "mc" / "seed0" / "config.yml").read_text())
    record["hyperparams"]["max_episodes"], record["config_hash"] = 80, "0" * 16
    (tmp_path / "mc" / "seed0" / "config.yml").write_text(yaml.safe_dump(record))
    path = tmp_path / "td" / "seed1" / "summary.json"
    edited = json.loads(path.read_text())
    edited["episodes_run"] = 5
    path.write_text(json.dumps(edited))  # valid JSON, edited by hand
    capsys.readouterr()
    results = compare.run(_compare_argv(tmp_path, max_episodes=60))
    err = capsys.readouterr().err
    assert "reusing 3 finished run(s)" in err and "changed after the run wrote it" in err
    assert results["algos"]["td"]["episodes_for_stats"] == [60, 60]


def test_a_second_compare_into_the_same_out_is_refused(tmp_path, capsys):
    tmp_path.joinpath(".compare.lock").touch()
    with open(tmp_path / ".compare.lock", "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert compare.main(_compare_argv(tmp_path)) == 2
    assert "in use by another compare" in capsys.readouterr().err
    assert not (tmp_path / "mc").exists()


KILL_ARGS = dict(seeds=3, workers=2, max_episodes=1500)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    out = tmp_path_factory.mktemp("uninterrupted")
    compare.run(_compare_argv(out, **KILL_ARGS))
    return (out / "results.json").read_text()


@needs_proc
@pytest.mark.parametrize(
    "signum, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143), (signal.SIGKILL, -9)], ids=["SIGINT", "SIGTERM", "SIGKILL"]
)
def test_a_killed_compare_leaves_no_worker_and_resumes_to_the_same_results(tmp_path, uninterrupted, signum, code):
    out = tmp_path / "out"
    process = start_module(
        "algorithms.compare",
        *_compare_argv(out, **KILL_ARGS),
        cwd=tmp_path,
        # a suite started in the background by a non-interactive shell inherits SIGINT ignored, and so
        # would compare (Python keeps an inherited SIG_IGN): give it the disposition a terminal gives
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.monotonic() + 120
    while not list(out.glob("*/seed*/summary.json")) and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    workers = descendants(process.pid)
    assert process.poll() is None and workers, "compare ended before it could be stopped"
    finished_before = len(list(out.glob("*/seed*/summary.json")))
    assert finished_before < 6
    stopped_at = time.monotonic()
    os.kill(process.pid, signum)
    _, err = process.communicate(timeout=30)
    assert process.returncode == code, err
    if signum != signal.SIGKILL:
        assert time.monotonic() - stopped_at < 10
        lines = [line for line in err.strip().splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("stopped: "), err
    assert not wait_gone(workers)
    kept = len(list(out.glob("*/seed*/summary.json")))
    assert kept >= finished_before
    compare.run(_compare_argv(out, **KILL_ARGS))
    assert (out / "results.json").read_text() == uninterrupted


def test_a_run_whose_config_yml_is_corrupt_is_replaced_by_overwrite_and_only_by_it(tmp_path, capsys):
    log_dir = tmp_path / "run"
    argv = ["--algo", "mc", "--max-episodes", "20", "--log-dir", str(log_dir), "--no-progress"]
    train.run(argv)
    (log_dir / "config.yml").write_bytes(b"algo: mc\nhyperparams: {max_episodes: [\n\x00")  # truncated, binary tail
    before = {p: p.read_bytes() for p in sorted(log_dir.rglob("*")) if p.is_file()}
    for flags in ([], ["--resume"]):
        assert train.main([*argv, *flags]) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and "config.yml is unreadable" in lines[0] and "--overwrite" in lines[0], lines
        assert {p: p.read_bytes() for p in sorted(log_dir.rglob("*")) if p.is_file()} == before
    summary = train.run([*argv, "--overwrite"])
    assert summary["episodes_run"] == 20
    assert yaml.safe_load((log_dir / "config.yml").read_text())["config_hash"] == summary["config_hash"]
    # a directory without any config.yml is still not taken for a run
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "config.yaml").write_text("not a run's\n")
    assert train.main([*argv[:-3], "--log-dir", str(tmp_path / "mine"), "--overwrite"]) == 2
    assert "refusing to delete" in capsys.readouterr().err and (tmp_path / "mine" / "config.yaml").exists()
