"""Issue 36, fault round 3: credit-rule options taken as given (no silent coercion, no infinite learning rate),
extreme but finite rewards (+-1e308) through IRCR, the redistribution and the summary, strict JSON, the mode of
atomically written files, credit_leakage's decision step, and log dirs unpacked safely on any Python >= 3.10."""

from __future__ import annotations

import io
import json
import math
import os
import shutil
import stat
import subprocess
import sys
import tarfile
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces

from algorithms.common import cli
from algorithms.common.convergence import ConvergenceTracker, EpisodeOutcomes
from algorithms.experiment import distributed
from algorithms.experiment.distributed import pack_dir, unpack_dir
from vcbm_gym.credit.base import EpisodeBatch
from vcbm_gym.credit.features import SpaceFeaturizer
from vcbm_gym.credit.ircr import IRCRRule, normalised_returns
from vcbm_gym.credit.redistribute import return_equivalent_rewards
from vcbm_gym.credit.registry import make_rule
from vcbm_gym.credit.rrd import RRDConfig

REPO = Path(__file__).resolve().parents[1]
HUGE = 1e308  # finite; two of them apart overflow: 1e308 - (-1e308) = inf


def strict_json(text: str):
    """json.loads that refuses NaN and Infinity, as RFC 8259 (and strict readers such as jq or JavaScript) do."""

    def refuse(constant: str):
        raise ValueError(f"not strict JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


def one_error_line(capsys, code: int, *needles: str) -> str:
    assert code == 2
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


# --- 13, 14: the credit rules' options, checked as given ------------------------------------------------------


@pytest.mark.parametrize("rate", [math.inf, -math.inf, math.nan, 0.0, -1e-3, "3e-3", True])
def test_rrd_refuses_a_learning_rate_that_is_not_a_finite_positive_number(rate):
    with pytest.raises(ValueError, match=r"^learning_rate=.*: expected a finite number > 0$"):
        RRDConfig(learning_rate=rate)


@pytest.mark.parametrize(
    ("options", "needle"),
    [
        ({"bias_correction": "false"}, "bias_correction='false': expected true or false"),
        ({"bias_correction": 0}, "bias_correction=0: expected true or false"),
        ({"hidden_sizes": "64"}, "hidden_sizes='64': expected a list of integer layer widths >= 1"),
        ({"hidden_sizes": [2.9]}, "hidden_sizes=[2.9]: expected a list of integer layer widths >= 1"),
        ({"hidden_sizes": [True]}, "hidden_sizes=[True]"),
        ({"hidden_sizes": 0}, "hidden_sizes=0"),
        ({"subsequence_size": 2.5}, "subsequence_size=2.5: expected an integer >= 1"),
    ],
)
def test_rrd_refuses_options_of_the_wrong_type_instead_of_coercing_them(options, needle):
    with pytest.raises(ValueError) as excinfo:
        RRDConfig(**options)
    assert needle in str(excinfo.value) and "\n" not in str(excinfo.value)


def test_rrd_keeps_what_is_well_typed():
    assert RRDConfig(hidden_sizes=8).hidden_sizes == (8,)  # a bare integer: one layer
    assert RRDConfig(hidden_sizes=[64, np.int64(32)]).hidden_sizes == (64, 32)
    assert RRDConfig(hidden_sizes=[]).hidden_sizes == ()
    config = RRDConfig(bias_correction=np.bool_(True), learning_rate=1, train_steps=0)
    assert config.bias_correction is True and config.learning_rate == 1.0 and config.train_steps == 0


@pytest.mark.parametrize(
    "credit_kwargs",
    ["{rrd: {learning_rate: .inf}}", "{rrd: {bias_correction: 'false'}}", "{rrd: {hidden_sizes: '64'}}"],
)
def test_train_refuses_bad_rrd_options_in_one_line_before_the_log_dir_exists(tmp_path, capsys, credit_kwargs):
    from algorithms.train import main

    log_dir = tmp_path / "run"
    argv = ["--algo", "td", "--credit", "rrd", "--env", "WatchRepair-v0", "--max-episodes", "40", "--no-progress"]
    code = main([*argv, "--log-dir", str(log_dir), "--hyperparams", f"credit_kwargs={credit_kwargs}"])
    one_error_line(capsys, code, "credit rule 'rrd'", "expected")
    assert not log_dir.exists()


def _spaces_featurizer() -> SpaceFeaturizer:
    return SpaceFeaturizer(spaces.MultiDiscrete([3, 3]), spaces.Discrete(2))


@pytest.mark.parametrize(
    ("rule", "options", "needle"),
    [
        ("grpo", {"normalise_std": "false"}, "normalise_std='false': expected true or false"),
        ("grpo", {"eps": math.inf}, "eps=inf"),
        ("gigpo", {"normalise_std": "no"}, "normalise_std='no': expected true or false"),
        ("gigpo", {"step_weight": "2"}, "step_weight='2': expected a finite number"),
        ("gigpo", {"step_weight": math.inf}, "step_weight=inf"),
        ("vcbm_bookmark", {"warmup_transitions": 2.9}, "warmup_transitions=2.9: expected an integer >= 0"),
        ("vcbm_bookmark", {"z_thresh": "4"}, "z_thresh='4'"),
        ("vcbm_bookmark", {"eta_clock": math.inf}, "eta_clock=inf"),
        ("vcbm_blend", {"top_k": 2.5}, "top_k=2.5: expected an integer >= 1"),
        ("vcbm_blend", {"memory_capacity": 2.5}, "memory_capacity=2.5: expected null or an integer >= 1"),
        ("vcbm_blend", {"tau": math.inf}, "tau=inf"),
        ("casi", {"beta": "1"}, "beta='1': expected a finite number"),
        ("casi", {"bound": math.inf}, "bound=inf"),
        ("casi", {"base": "nope"}, "base='nope'"),
        ("casi", {"shaping_mode": "nope"}, "shaping_mode='nope'"),
        ("rudder", {"learning_rate": math.inf}, "learning_rate=inf: expected a finite number > 0"),
        ("rudder", {"hidden_size": 2.5}, "hidden_size=2.5: expected an integer >= 1"),
        ("rudder", {"reward_scale": 0}, "reward_scale=0"),
    ],
)
def test_every_rule_refuses_options_it_would_have_coerced_or_failed_on_later(rule, options, needle):
    if rule == "rudder":
        options = {"featurizer": _spaces_featurizer(), **options}
    with pytest.raises(ValueError) as excinfo:
        make_rule(rule, **options)
    assert needle in str(excinfo.value) and "\n" not in str(excinfo.value)


# --- 15: IRCR and the redistribution with returns of +-1e308 -----------------------------------------------------


def test_ircr_normalises_returns_whose_spread_overflows():
    np.testing.assert_array_equal(normalised_returns(np.array([HUGE, -HUGE, 0.0]), -HUGE, HUGE), [1.0, 0.0, 0.5])
    assert normalised_returns(np.array([6.0]), 2.0, 10.0)[0] == 0.5  # the ordinary case bit for bit
    rule = IRCRRule()
    rewards = np.array([[0.0, HUGE], [0.0, -HUGE]])
    batch = EpisodeBatch(rewards, np.ones_like(rewards, dtype=bool))
    rule.observe(batch)
    np.testing.assert_array_equal(rule.advantages(batch), [[1.0, 1.0], [0.0, 0.0]])


def test_the_return_equivalent_projection_survives_an_overflowing_sum():
    mask = np.array([[True, True, False]])
    # sum_s A_s = 2e308 overflows; r'_t = A_t + (G - sum A) / n = 1e308 + (1e308 - 2e308) / 2 = 5e307
    np.testing.assert_allclose(
        return_equivalent_rewards(np.array([[HUGE, HUGE, 0.0]]), mask, np.array([HUGE])), [[5e307, 5e307, 0.0]]
    )
    # ordinary values bit for bit
    np.testing.assert_array_equal(
        return_equivalent_rewards(np.array([[1.0, 2.0, 9.0]]), mask, np.array([4.0])), [[1.5, 2.5, 0.0]]
    )
    rewards = np.array([[0.0, HUGE], [0.0, -HUGE]])
    batch = EpisodeBatch(rewards, np.ones_like(rewards, dtype=bool))
    redistributed = return_equivalent_rewards(IRCRRule().advantages(batch), batch.mask, batch.returns)
    np.testing.assert_allclose(redistributed.sum(axis=1), [HUGE, -HUGE])


class HugeRewardEnv(gym.Env):
    """Two steps; the first action decides the last step's reward: +1e308 (action 1) or -1e308 (action 0)."""

    observation_space, action_space = spaces.Discrete(3), spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t, self.first = 0, None
        return 0, {}

    def step(self, action):
        self.t += 1
        self.first = int(action) if self.first is None else self.first
        done = self.t == 2
        reward = (HUGE if self.first else -HUGE) if done else 0.0
        return self.t, reward, done, False, {}


HUGE_ID = "test/HugeReward-v0"


@pytest.fixture
def huge_env_id():
    gym.register(HUGE_ID, entry_point=HugeRewardEnv)
    yield HUGE_ID
    del gym.registry[HUGE_ID]


def _train(tmp_path, env_id: str, *extra: str) -> dict:
    from algorithms.train import main

    log_dir = tmp_path / "run"
    argv = ["--env", env_id, "--max-episodes", "60", "--no-progress", "--log-dir", str(log_dir), *extra]
    assert main(argv) == 0
    return strict_json((log_dir / "summary.json").read_text())


@pytest.mark.parametrize("algo", ["td", "mc"])
def test_ircr_trains_on_rewards_of_plus_minus_1e308(tmp_path, huge_env_id, algo):
    summary = _train(tmp_path, huge_env_id, "--algo", algo, "--credit", "ircr")
    assert summary["episodes_run"] == 60 and math.isfinite(summary["mean_return_last_episodes"])


# --- 16: a finite mean of finite returns, and strict JSON -----------------------------------------------------------


def test_overflow_free_mean():
    from algorithms.common.convergence import overflow_free_mean

    assert overflow_free_mean([HUGE, HUGE, HUGE]) == HUGE
    assert overflow_free_mean([HUGE, -HUGE, HUGE, HUGE]) == pytest.approx(5e307, rel=1e-12)
    values = [0.1, 0.2, 0.7, 1e-3]
    assert overflow_free_mean(values) == sum(values) / len(values)  # bit for bit where nothing overflows


def test_episode_outcomes_report_a_finite_mean_of_huge_returns():
    outcomes = EpisodeOutcomes(ConvergenceTracker(window=2, threshold=0.5), "'X'")
    for _ in range(3):
        outcomes.update({}, HUGE)
    assert outcomes.summary()["mean_return_last_episodes"] == HUGE
    assert outcomes.scalars()["mean_return"] == HUGE


def test_plain_td_on_huge_rewards_writes_a_strict_summary_with_a_finite_mean(tmp_path, huge_env_id):
    summary = _train(tmp_path, huge_env_id, "--algo", "td")
    assert abs(summary["mean_return_last_episodes"]) <= HUGE and cli.NON_FINITE_KEY not in summary


def test_json_writes_are_strict_and_record_what_was_not_finite(tmp_path):
    path = tmp_path / "out.json"
    cli.atomic_write_json(path, {"mean": math.inf, "shares": [0.5, math.nan], "a/b": {"low": -math.inf}, "n": 3})
    data = strict_json(path.read_text())
    assert data["mean"] is None and data["shares"] == [0.5, None] and data["n"] == 3
    assert data[cli.NON_FINITE_KEY] == {"/mean": "Infinity", "/shares/1": "NaN"}
    assert data["a/b"] == {"low": None, cli.NON_FINITE_KEY: {"/low": "-Infinity"}}  # the nearest object records it
    cli.atomic_write_json(path, data)  # read back and written again: the same file
    assert strict_json(path.read_text()) == data
    # a list of records (an LLM run's history.json): each record lists its own
    cli.atomic_write_json(path, [{"kl": math.nan, "loss": 0.5}, {"kl": 0.1}, [math.inf]])
    history = strict_json(path.read_text())
    assert history == [{"kl": None, "loss": 0.5, cli.NON_FINITE_KEY: {"/kl": "NaN"}}, {"kl": 0.1}, [None]]
    cli.atomic_write_json(path, {"mean": 0.25})
    assert cli.NON_FINITE_KEY not in strict_json(path.read_text())


# --- 18: credit_leakage's decision step ---------------------------------------------------------------------------


def _leakage(tmp_path, *extra: str) -> list[str]:
    return [
        sys.executable, str(REPO / "benchmarks" / "credit_leakage.py"), "--rules", "broadcast", "--seeds", "2",
        "--episodes", "4", "--batch-episodes", "2", "--out", str(tmp_path / "new" / "leakage.json"), *extra,
    ]  # fmt: skip


def _run_leakage(tmp_path, *extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(_leakage(tmp_path, *extra), capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)


def test_credit_leakage_refuses_a_decision_step_outside_the_episode(tmp_path):
    done = _run_leakage(tmp_path, "--decision-step", "999")
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --decision-step 999: expected a step inside every episode")
    assert "0 to 49" in lines[0] and not (tmp_path / "new").exists()
    done = _run_leakage(tmp_path, "--decision-step", "49")
    assert done.returncode == 0, done.stderr
    strict_json((tmp_path / "new" / "leakage.json").read_text())


def test_credit_leakage_table_reads_a_null_mean_back():
    sys.path.insert(0, str(REPO / "benchmarks"))
    try:
        from credit_leakage import markdown_table
    finally:
        sys.path.remove(str(REPO / "benchmarks"))
    row = {"shares": [None, None], "mean": None, "ci_low": None, "ci_high": None, "seconds_per_seed": 0.1}
    assert "n/a (every advantage 0" in markdown_table("E", {"broadcast": row}, 2)


# --- 19: the mode of atomically written files -----------------------------------------------------------------------


@pytest.fixture
def umask():
    def set_umask(mask: int) -> None:
        os.umask(mask)

    previous = os.umask(0o022)
    yield set_umask
    os.umask(previous)


@pytest.mark.parametrize("mask", [0o022, 0o027, 0o002], ids=["022", "027", "002"])
def test_atomic_writes_get_the_mode_open_gives_a_new_file(tmp_path, umask, mask):
    umask(mask)
    cli.atomic_write_text(tmp_path / "table.md", "x")
    cli.atomic_write_json(tmp_path / "results.json", {"a": 1})
    with open(tmp_path / "plain.txt", "w") as handle:
        handle.write("x")
    expected = stat.S_IMODE((tmp_path / "plain.txt").stat().st_mode)
    assert expected == 0o666 & ~mask
    for name in ("table.md", "results.json"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == expected, name
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plain.txt", "results.json", "table.md"]  # no temp file left


def test_a_run_writes_config_and_summary_readable_by_the_group(tmp_path, umask, huge_env_id):
    umask(0o022)
    _train(tmp_path, huge_env_id, "--algo", "td")
    for name in ("config.yml", "summary.json"):
        assert stat.S_IMODE((tmp_path / "run" / name).stat().st_mode) == 0o644, name


# --- 20: unpacking a log dir on Pythons with and without tarfile's "data" filter ------------------------------------


@pytest.fixture(params=["data filter", "before 3.11.4"])
def python_tarfile(request, monkeypatch):
    """This Python's tarfile, or one as Python < 3.11.4 (3.12) has it: no data_filter, no `filter` argument."""
    if request.param == "before 3.11.4":
        if not hasattr(tarfile, "data_filter"):
            return request.param
        extractall = tarfile.TarFile.extractall

        def old_extractall(self, path=".", members=None, *, numeric_owner=False):
            return extractall(self, path, members, numeric_owner=numeric_owner, filter="fully_trusted")

        monkeypatch.delattr(tarfile, "data_filter")
        monkeypatch.setattr(tarfile.TarFile, "extractall", old_extractall)
    elif not hasattr(tarfile, "data_filter"):
        pytest.skip("this Python's tarfile has no data filter")
    return request.param


def _archive(*members: tuple[tarfile.TarInfo, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for info, content in members:
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content) if info.isfile() else None)
    return buffer.getvalue()


def _member(name: str, kind: bytes = tarfile.REGTYPE, linkname: str = "", mode: int = 0o644) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode = kind, linkname, mode
    return info


def test_a_packed_log_dir_round_trips_with_its_modes_made_safe(tmp_path, python_tarfile):
    source = tmp_path / "source"
    (source / "events").mkdir(parents=True)
    (source / "summary.json").write_text("{}")
    (source / "events" / "tb").write_text("e")
    (source / "run.sh").write_text("#!/bin/sh")
    os.chmod(source / "run.sh", 0o4777)  # set-uid, world-writable: the data filter drops both
    os.symlink("events/tb", source / "latest")
    target = tmp_path / "out" / "run"
    unpack_dir(pack_dir(source), target)
    assert (target / "summary.json").read_text() == "{}" and (target / "latest").read_text() == "e"
    assert stat.S_IMODE((target / "run.sh").stat().st_mode) == 0o755


def test_an_absolute_member_lands_inside_as_the_data_filter_puts_it(tmp_path, python_tarfile):
    target = tmp_path / "a" / "run"
    unpack_dir(_archive((_member("/abs"), b"x"), (_member("//twice/x"), b"y")), target)
    assert (target / "abs").read_text() == "x" and (target / "twice" / "x").read_text() == "y"


@pytest.mark.parametrize(
    "members",
    [
        [(_member("../escaped"), b"x")],
        [(_member("sub/../../escaped"), b"x")],
        [(_member("link", tarfile.SYMTYPE, "/etc/passwd"), b"")],
        [(_member("link", tarfile.SYMTYPE, "../outside"), b"")],
        [(_member("hard", tarfile.LNKTYPE, "../outside"), b"")],
        [(_member("dev", tarfile.CHRTYPE), b"")],
        [(_member("fifo", tarfile.FIFOTYPE), b"")],
        # a link to ".", then a link through it to ".." (lexically inside), then a file through that
        [(_member("q", tarfile.SYMTYPE, "."), b""), (_member("p", tarfile.SYMTYPE, "q/.."), b""), (_member("p/evil"), b"x")],
    ],
    ids=["dotdot", "nested-dotdot", "abs-symlink", "symlink-out", "hardlink-out", "device", "fifo", "chain"],
)
def test_unsafe_members_are_refused_and_nothing_lands_outside(tmp_path, python_tarfile, members):
    (tmp_path / "outside").write_text("keep")
    target = tmp_path / "a" / "run"
    with pytest.raises(tarfile.TarError):
        unpack_dir(_archive(*members), target)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "outside"]
    assert list((tmp_path / "a").iterdir()) == [] and (tmp_path / "outside").read_text() == "keep"


def test_the_fallback_runs_on_a_real_python_without_the_data_filter(tmp_path):
    """Debian 12's /usr/bin/python3 (3.11.2) is such a Python; elsewhere this is skipped (the monkeypatched
    branch above stands in for it)."""
    python = shutil.which("python3", path="/usr/bin")
    if python is None:
        pytest.skip("no /usr/bin/python3")
    probe = subprocess.run(
        [python, "-c", "import tarfile; print(hasattr(tarfile, 'data_filter'))"], capture_output=True, text=True
    )
    if probe.stdout.strip() != "False":
        pytest.skip(f"{python} has tarfile's data filter")
    source = tmp_path / "source"
    source.mkdir()
    (source / "summary.json").write_text('{"ok": 1}')
    (tmp_path / "packed").write_bytes(pack_dir(source))
    bad = _archive(
        (_member("q", tarfile.SYMTYPE, "."), b""), (_member("p", tarfile.SYMTYPE, "q/.."), b""), (_member("p/evil"), b"x")
    )
    (tmp_path / "bad").write_bytes(bad)
    script = (
        "import sys, tarfile; from pathlib import Path; from algorithms.experiment.distributed import unpack_dir\n"
        "unpack_dir(Path(sys.argv[1], 'packed').read_bytes(), Path(sys.argv[1], 'good'))\n"
        "try:\n    unpack_dir(Path(sys.argv[1], 'bad').read_bytes(), Path(sys.argv[1], 'bad_run'))\n"
        "except tarfile.TarError as exc:\n    print('refused', exc)\n"
    )
    done = subprocess.run([python, "-c", script, str(tmp_path)], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "good" / "summary.json").read_text() == '{"ok": 1}'
    assert done.stdout.startswith("refused") and not (tmp_path / "bad_run").exists() and not (tmp_path / "evil").exists()


def test_unpack_uses_the_data_filter_where_python_has_it(monkeypatch):
    if not hasattr(tarfile, "data_filter"):
        pytest.skip("this Python's tarfile has no data filter")
    seen = []
    monkeypatch.setattr(tarfile.TarFile, "extractall", lambda self, path, **kwargs: seen.append(kwargs))
    distributed.extract_data(tarfile.open(fileobj=io.BytesIO(_archive()), mode="r:gz"), Path("unused"))
    assert seen == [{"filter": "data"}]
