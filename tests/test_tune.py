"""`algorithms.tune`: search spaces, pruning, a journal-file study shared by processes, every arm."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
import yaml

from algorithms.common.errors import ConfigError, Stopped, VcbmGymError
from algorithms.common.spec import Objective
from algorithms.experiment import executor
from algorithms.experiment.search_space import apply_params, parse_search_space
from algorithms.experiment.study import DISCOUNTED, SAMPLERS, open_study, storage_of, trial_overrides
from algorithms.experiment.trials import Reporter, worker_loop
from algorithms.experiment.tune import build_parser, main, resolve_settings
from algorithms.experiment.tune import run as tune
from algorithms.train import run as train
from tests.helpers import descendants, needs_proc, start_module, wait_gone

REPO = Path(__file__).resolve().parents[1]
FAST_VCBM = ["--algo", "vcbm", "--env", "WatchRepair-v0", "--seeds-per-trial", "1", "--max-episodes", "1500"]


@pytest.mark.parametrize(
    "spec, message",
    [
        ({}, "non-empty mapping"),
        ({"z_thresh": {"type": "uniform", "low": 1, "high": 2}}, "type one of float, int, categorical"),
        ({"z_thresh": {"type": "float", "low": 2, "high": 1}}, "expected low < high"),
        ({"z_thresh": {"type": "float", "low": 0, "high": 1, "log": True}}, "low > 0 with log"),
        ({"z_thresh": {"type": "float", "low": 0, "high": float("nan")}}, "finite numbers"),
        ({"forced_visits": {"type": "int", "low": 1.5, "high": 4}}, "expected integers"),
        ({"forced_visits": {"type": "int", "low": 1, "high": 4, "stride": 2}}, "unknown key"),
        ({"vcbm_few_bookmarks": {"type": "categorical", "choices": []}}, "non-empty list of scalars"),
        ({"max_episodes": {"type": "int", "low": 1, "high": 4}}, "other than max_episodes"),
    ],
)
def test_search_space_mistakes_are_one_clear_error(spec, message):
    with pytest.raises(ConfigError, match=message):
        parse_search_space(spec, "test")


def test_a_dotted_name_changes_one_key_of_the_zoo_mapping():
    base = {"credit_kwargs": {"broadcast": {"baseline": "given"}, "vcbm_bookmark": {"advantage": "return", "alpha": 0.05}}}
    changed = apply_params(base, {"credit_kwargs.vcbm_bookmark.alpha": 0.2, "learning_rate": 1e-3})
    rule = {"advantage": "return", "alpha": 0.2}
    assert changed == {"credit_kwargs": {"broadcast": {"baseline": "given"}, "vcbm_bookmark": rule}, "learning_rate": 1e-3}
    assert base["credit_kwargs"]["vcbm_bookmark"]["alpha"] == 0.05  # the base is not modified


def test_a_trials_values_go_over_tunes_hyperparams_and_under_its_budget():
    """As train folds them: --hyperparams, then (here) the searched values, then --max-episodes / --iterations."""
    fixed = {"epsilon": 0.1, "max_episodes": 10, "credit_kwargs": {"rudder": {"seed": 1}}}
    base = {"epsilon": 0.1, "credit_kwargs": {"rudder": {"seed": 1}}}  # resolved with the fixed values
    overrides = trial_overrides(fixed, base, {"epsilon": 0.3, "credit_kwargs.rudder.lr": 0.5}, {"max_episodes": 99})
    assert overrides == {"epsilon": 0.3, "max_episodes": 99, "credit_kwargs": {"rudder": {"seed": 1, "lr": 0.5}}}
    assert trial_overrides(fixed, {}, {}, {}) == fixed


def test_the_search_space_is_checked_against_the_runner_before_any_trial(tmp_path):
    space = tmp_path / "space.yml"
    space.write_text(yaml.safe_dump({"vcbm": {"epsilon_start": {"type": "float", "low": 0.1, "high": 1.5}}}))
    args = build_parser().parse_args([*FAST_VCBM, "--trials", "1", "--search-space", str(space), "--out", str(tmp_path)])
    with pytest.raises(VcbmGymError, match="search space of 'vcbm' on WatchRepair-v0: .*epsilon_start"):
        resolve_settings(args)
    args = build_parser().parse_args([*FAST_VCBM, "--trials", "1", "--search-space", str(space), "--algo", "rudder"])
    with pytest.raises(ConfigError, match="has no entry for algo 'rudder'"):
        resolve_settings(args)


def test_a_trial_worse_than_the_median_is_pruned_and_a_converged_first_seed_holds_its_rate():
    study = optuna.create_study(direction="minimize", pruner=optuna.pruners.MedianPruner(n_startup_trials=1))
    objective = Objective("minimize", "episodes", "incorrect rate")
    done = study.ask()
    fast = Reporter(done, objective, every=100)
    fast(100, {"correct_rate": 0.5})
    fast(150, {"correct_rate": 0.9})  # not a multiple of --report-every: not reported
    fast(200, {"correct_rate": 0.9})
    fast(234, {"correct_rate": 0.96})  # then it converged and stopped: its final rate holds from step 300 on
    fast.hold(budget=450)
    assert study.trials[0].intermediate_values == {
        100: 0.5,
        200: pytest.approx(0.1),
        300: pytest.approx(0.04),
        400: pytest.approx(0.04),
    }
    study.tell(done, 200.0)
    Reporter(study.ask(), objective, every=100)(100, {"correct_rate": 0.55})  # 0.45 < the median 0.5: goes on
    with pytest.raises(optuna.TrialPruned, match="pruned at step 300 of the first seed"):
        # only the held value of the converged trial is there to compare with at step 300
        Reporter(study.ask(), objective, every=100)(300, {"correct_rate": 0.7})  # 0.3 > 0.04
    assert objective.intermediate_value({"correct_rate": 0.25}) == 0.75
    assert Objective("maximize", "tgc", "tgc").intermediate_value({"correct_rate": 0.25}) == 0.25


def test_two_processes_share_one_journal_and_stop_at_the_study_total(tmp_path):
    journal = tmp_path / "shared" / "study.journal"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    commands = [
        [
            sys.executable,
            "-m",
            "algorithms.tune",
            *FAST_VCBM,
            "--trials",
            "3",
            "--storage",
            str(journal),
            "--out",
            str(tmp_path / f"out{k}"),
            "--sampler-seed",
            str(k),
        ]
        for k in (0, 1)
    ]
    processes = [
        subprocess.Popen(c, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for c in commands
    ]
    outputs = [p.communicate(timeout=300) for p in processes]
    for process, (_, stderr) in zip(processes, outputs):
        assert process.returncode == 0, stderr
    settings, _ = resolve_settings(build_parser().parse_args([*FAST_VCBM, "--trials", "3", "--storage", str(journal)]))
    study = open_study(settings)
    assert sorted(t.number for t in study.trials) == [0, 1, 2]  # exactly --trials, whoever ran them
    assert all(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials)
    owners = {t.user_attrs["owner"] for t in study.trials}
    assert owners <= {f"{os.uname().nodename}:{p.pid}" for p in processes}
    ran = [json.loads((tmp_path / f"out{k}" / "run.json").read_text())["trials_run_here"] for k in (0, 1)]
    assert sum(ran) == 3
    for k in (0, 1):
        assert (tmp_path / f"out{k}" / "study_history.png").stat().st_size > 0
    # the process that finished last saw every trial complete: its snippet is the study's best
    last = max((tmp_path / f"out{k}" / "best.yml" for k in (0, 1)), key=lambda p: p.stat().st_mtime_ns)
    best = yaml.safe_load(last.read_text())["WatchRepair-v0"]
    assert best == study.best_trial.params
    # the snippet is a zoo entry that train accepts, and the trial's run used exactly those values
    best_out = next(
        tmp_path / f"out{k}"
        for k in (0, 1)
        if (tmp_path / f"out{k}" / "vcbm-WatchRepair-v0" / f"trial{study.best_trial.number}").is_dir()
    )
    trial_dir = best_out / "vcbm-WatchRepair-v0" / f"trial{study.best_trial.number}"
    used = yaml.safe_load((trial_dir / "seed0" / "config.yml").read_text())
    assert {k: used["hyperparams"][k] for k in best} == best
    summary = train(
        ["--algo", "vcbm", "--config", str(last), "--max-episodes", "1500", "--log-dir", str(tmp_path / "rerun"), "--no-progress"]
    )
    assert summary["episodes_run"] == study.best_trial.value  # seed 0 again: the same run


def test_a_trial_left_running_by_a_dead_process_is_not_counted(tmp_path):
    args = build_parser().parse_args([*FAST_VCBM, "--max-episodes", "100", "--trials", "1", "--out", str(tmp_path)])
    settings, _ = resolve_settings(args)
    study = open_study(settings)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    orphan = study.ask()
    orphan.set_user_attr("owner", f"{os.uname().nodename}:{int(dead.stdout)}")
    assert worker_loop(settings, quiet=True) == 1  # the orphan is failed and discounted; one trial runs
    study = open_study(settings)
    assert [t.state.name for t in study.trials] == ["FAIL", "COMPLETE"] and study.user_attrs[DISCOUNTED] == [0]
    assert [entry["seed"] for entry in study.user_attrs[SAMPLERS]] == [0]  # the first loop: --sampler-seed itself
    assert study.trials[1].value == 100  # 100 episodes cannot converge: the cap


def test_sb3_trial_tunes_a_credit_rule_argument_inside_credit_kwargs(tmp_path):
    space = tmp_path / "space.yml"
    space.write_text(
        yaml.safe_dump({"ppo": {"credit_kwargs.vcbm_bookmark.alpha": {"type": "float", "low": 0.01, "high": 0.5, "log": True}}})
    )
    result = tune(
        [
            "--algo",
            "ppo",
            "--env",
            "WatchRepair-v0",
            "--trials",
            "1",
            "--seeds-per-trial",
            "1",
            "--max-episodes",
            "64",
            "--search-space",
            str(space),
            "--hyperparams",
            "credit=vcbm_bookmark",
            "n_envs=4",
            "batch_size=200",
            "--out",
            str(tmp_path / "out"),
        ]
    )
    assert result["states"]["COMPLETE"] == 1 and result["best_value"] == 64
    used = yaml.safe_load((tmp_path / "out" / "ppo-WatchRepair-v0" / "trial0" / "seed0" / "config.yml").read_text())
    rule = used["hyperparams"]["credit_kwargs"]["vcbm_bookmark"]
    alpha = result["best_params"]["credit_kwargs.vcbm_bookmark.alpha"]
    assert rule == {"advantage": "return", "baseline": "given", "alpha": alpha}
    best = yaml.safe_load((tmp_path / "out" / "best.yml").read_text())["WatchRepair-v0"]
    assert best["credit"] == "vcbm_bookmark" and best["credit_kwargs"]["vcbm_bookmark"] == rule
    assert best["credit_kwargs"]["broadcast"] == {"baseline": "given"}  # the zoo's other rules are kept


def test_llm_trial_tunes_the_vcbm_blend_on_the_text_env(tmp_path):
    result = tune(
        [
            "--algo",
            "vcbm-loop",
            "--env",
            "TextWatchRepair-v0",
            "--trials",
            "1",
            "--seeds-per-trial",
            "1",
            "--iterations",
            "2",
            "--final-window",
            "2",
            "--out",
            str(tmp_path),
            "--hyperparams",
            "model=tiny-random",
            "generation_batch_size=4",
            "num_generations=2",
            "per_device_train_batch_size=4",
            "env_kwargs={max_turns: 3}",
            "max_turns=3",
        ]
    )
    assert result["states"]["COMPLETE"] == 1
    assert set(result["best_params"]) == {f"credit_kwargs.vcbm_blend.{k}" for k in ("beta", "tau", "top_k", "alpha")}
    run_dir = tmp_path / "vcbm-loop-TextWatchRepair-v0" / "trial0" / "seed0"
    history = json.loads((run_dir / "history.json").read_text())
    assert result["best_value"] == pytest.approx(sum(h["task_goal_completion"] for h in history) / 2)
    trial = json.loads((tmp_path / "trials.json").read_text())[0]
    assert sorted(trial["user_attrs"]) == ["owner", "seed0"] and trial["last_step"] == 2  # one report per iteration
    used = yaml.safe_load((run_dir / "config.yml").read_text())["hyperparams"]
    assert {
        f"credit_kwargs.vcbm_blend.{k}": v for k, v in used["credit_kwargs"]["vcbm_blend"].items() if k != "few_bookmarks"
    } == result["best_params"]


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--trials", "0"], "--trials 0: expected an integer in"),
        (["--trials", "2", "--backend", "dask"], "--backend 'dask': expected one of process, ray"),
        (["--trials", "2", "--address", "auto"], "--address 'auto' with --backend process: expected --backend ray"),
        (["--trials", "2", "--iterations", "3"], "--iterations 3 with algo 'vcbm': expected --max-episodes"),
        (["--trials", "2", "--hyperparams", "z_thresh"], "malformed hyperparameter 'z_thresh': expected key=value"),
        (["--trials", "2", "--hyperparams", "bogus=1"], "unknown hyperparameter 'bogus'"),
        (["--trials", "2", "--seeds-per-trial", "0"], "--seeds-per-trial 0: expected an integer in"),
    ],
)
def test_bad_tune_arguments_are_one_clear_error(tmp_path, extra, message):
    with pytest.raises(VcbmGymError, match=message):
        tune([*FAST_VCBM[:4], *extra, "--out", str(tmp_path)])
    assert not (tmp_path / "study.journal").exists()  # refused before any study exists


def test_an_env_without_the_convergence_criterion_is_refused_before_any_trial(tmp_path):
    """CartPole reports no first_decision_optimal: episodes to converge, the objective, does not exist there."""
    with pytest.raises(VcbmGymError, match=r"env 'CartPole-v1' reports no info\['first_decision_optimal'\].*tune"):
        tune(["--algo", "ppo", "--env", "CartPole-v1", "--trials", "1", "--max-episodes", "5", "--out", str(tmp_path)])
    assert not (tmp_path / "study.journal").exists()


def _tune_process(tmp_path, *extra):
    return start_module("algorithms.tune", *FAST_VCBM, "--out", str(tmp_path / "out"), *extra, cwd=tmp_path)


@needs_proc
@pytest.mark.parametrize("workers", [2, 1])
def test_a_stopped_tune_leaves_no_worker_exits_143_with_one_line_and_discounts_its_trials(tmp_path, workers):
    """A worker left behind would be reparented to init, run every trial and die on a broken pipe. The
    stop and orphan behaviour is the executor's (tests/test_executor.py, SIGKILL included); here, that tune's worker
    loops run on it and that a stop fails and discounts the running trials."""
    process = _tune_process(tmp_path, "--trials", "1000", "--workers", str(workers))
    try:
        trials = tmp_path / "out" / "vcbm-WatchRepair-v0"
        deadline = time.monotonic() + 180
        while len(list(trials.glob("trial*"))) < workers and process.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        tree = descendants(process.pid)
        assert process.poll() is None and len(tree) >= workers - 1, "tune ended before it could be stopped"
        os.kill(process.pid, signal.SIGTERM)
        _, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
    assert not wait_gone(tree)
    assert process.returncode == 128 + signal.SIGTERM, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("stopped: SIGTERM: ") and "rerun the same command" in lines[0], err
    settings, _ = resolve_settings(build_parser().parse_args([*FAST_VCBM, "--trials", "1000", "--out", str(tmp_path / "out")]))
    study = open_study(settings)
    stopped = [t for t in study.trials if t.state == optuna.trial.TrialState.FAIL]
    failures = {t.number: t.user_attrs.get("failure") for t in stopped}
    assert failures and set(failures.values()) == {"Terminated: SIGTERM"}, failures
    assert set(study.user_attrs[DISCOUNTED]) == set(failures)  # the stopped trials do not count


def _has_open(pid: int, path: Path) -> bool:
    try:
        return any(os.path.realpath(fd) == os.path.realpath(path) for fd in Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return False


@pytest.mark.skipif(not Path("/proc/self/fd").exists(), reason="reads open files from /proc")
def test_two_tune_processes_started_with_the_same_command_propose_distinct_trials(tmp_path):
    """Were both to seed TPE with --sampler-seed alone, the second process would propose the first one's trials again."""
    ask_lock = tmp_path / "out" / "study.journal.ask-lock"
    ask_lock.parent.mkdir()
    with open(ask_lock, "a") as held:  # both processes wait for the ask lock: both take part from the start
        fcntl.flock(held, fcntl.LOCK_EX)
        processes = [_tune_process(tmp_path, "--trials", "6") for _ in range(2)]
        deadline = time.monotonic() + 300
        while not all(_has_open(p.pid, ask_lock) for p in processes) and time.monotonic() < deadline:
            assert all(p.poll() is None for p in processes), [p.communicate() for p in processes]
            time.sleep(0.05)
    outputs = [p.communicate(timeout=600) for p in processes]
    for process, (_, stderr) in zip(processes, outputs):
        assert process.returncode == 0, stderr
    settings, _ = resolve_settings(build_parser().parse_args([*FAST_VCBM, "--trials", "6", "--out", str(tmp_path / "out")]))
    study = open_study(settings)
    owners = {t.user_attrs["owner"] for t in study.trials}
    assert owners == {f"{os.uname().nodename}:{p.pid}" for p in processes}, "one process ran every trial: no overlap to test"
    proposed = [tuple(sorted(t.params.items())) for t in study.trials]
    assert len(study.trials) == 6 and len(set(proposed)) == 6
    joined = study.user_attrs[SAMPLERS]
    assert [entry["seed"] for entry in joined] == [0, 1] and {entry["owner"] for entry in joined} == owners
    record = json.loads((tmp_path / "out" / "run.json").read_text())
    assert record["sampler_seeds"] == joined


def test_a_refused_tune_leaves_tune_config_as_it_was(tmp_path, capsys):
    first = [*FAST_VCBM[:4], "--seeds-per-trial", "1", "--trials", "1", "--max-episodes", "100", "--out", str(tmp_path)]
    tune(first)
    before = {path: path.read_bytes() for path in tmp_path.rglob("*") if path.is_file()}
    capsys.readouterr()
    assert main([*first[:-4], "--max-episodes", "200", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "was created with other settings (budget differ)" in err, err
    after = {path: path.read_bytes() for path in tmp_path.rglob("*") if path.is_file()}
    assert after == before  # tune_config.yml above all: it still describes the study


def _cut_journal(tmp_path: Path) -> bytes:
    """A real journal whose last entry a dying writer left half written."""
    settings, _ = resolve_settings(
        build_parser().parse_args([*FAST_VCBM, "--trials", "1", "--storage", str(tmp_path / "source.journal")])
    )
    study = open_study(settings)
    study.tell(study.ask(), 1500.0)
    data = (tmp_path / "source.journal").read_bytes()
    return data[: len(data) - 20]


@pytest.mark.parametrize(
    "content, message",
    [
        (None, "is a directory"),
        (b"\x00\x9f binary\n", "line 1 is not an Optuna journal entry"),
        (b'{"op_code": 0, "study_name": "x", "directions": [1]}\n[1, 2]\n', "line 2 is not an Optuna journal entry"),
        (b'{"op_code": 0, "study_name": "x", "directions": [1]}\n{"op_code": 5}\n', "cannot be loaded"),
        (_cut_journal, "ends in the middle of a line"),
    ],
    ids=["directory", "garbage", "json-not-a-journal", "wrong-entries", "cut-mid-line"],
)
def test_a_bad_storage_is_one_line_and_is_left_as_it_was(tmp_path, capsys, content, message):
    storage = tmp_path / "study.journal"
    if content is None:
        storage.mkdir()
    else:
        storage.write_bytes(content(tmp_path) if callable(content) else content)
    before = None if content is None else storage.read_bytes()
    out = tmp_path / "out"
    assert main([*FAST_VCBM, "--trials", "1", "--storage", str(storage), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith(f"error: --storage {str(storage)!r} ") and message in err, err
    if before is not None:
        assert storage.read_bytes() == before  # Optuna would have appended its next entry to the cut line
    assert not (out / "tune_config.yml").exists()


def test_a_stop_landing_inside_a_journal_write_stops_the_trial_and_leaves_the_journal_unlocked(tmp_path, monkeypatch):
    """Optuna's lock release unlinks its renamed lock file again in an `except BaseException`: a stop landing right
    after the first unlink made that second one raise FileNotFoundError, recorded as the trial's failure."""
    journal = tmp_path / "study.journal"
    storage = storage_of(str(journal))
    unlink, fired = os.unlink, []

    def unlink_then_stop(path, *args, **kwargs):
        unlink(path, *args, **kwargs)
        if str(path).endswith(".rename") and not fired:
            fired.append(path)
            os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(os, "unlink", unlink_then_stop)
    with pytest.raises(Stopped, match="SIGTERM"):
        with executor.sigterm_stops():
            optuna.create_study(storage=storage, study_name="stopped")
    monkeypatch.undo()
    assert fired and not list(tmp_path.glob("study.journal.lock*"))  # released, nothing left behind
    assert optuna.load_study(study_name="stopped", storage=storage_of(str(journal))).study_name == "stopped"
